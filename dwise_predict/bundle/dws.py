"""A bundle's DWS surface predictor: read it on load, and add it to a bundle.

Why its own module: the DWS predictor is a bundle module of its own kind (``predictors.dws``
in the manifest), added to a bundle after the admission and refinement predictors are
written, so that neither ``save_bundle`` nor their files change. Manifest entry:
``predictors.dws = {files, kind: "dws_surface", estimate, N, S, block_size, encoder,
truncation, precision, exports}``; every file is hashed in ``files`` like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import BundleError, BundleIntegrityError
from ..predictors.dws import (
    CONFIG_FILE,
    ESTIMATE,
    INT8_FILE,
    ONNX_FILE,
    TOKENIZER_FILE,
    DWSPredictor,
)

MANIFEST_KEY = "dws"
KIND = "dws_surface"


def load_manifest_dws(path: Path, manifest: dict[str, Any], *, int8: bool = True,
                      threads: int = 1) -> DWSPredictor | None:
    """The DWS predictor a verified bundle's manifest names, or None when it has none.

    The INT8 file is used when the bundle keeps one (it passed its parity gate) and ``int8``.
    """
    entry = (manifest.get("predictors") or {}).get(MANIFEST_KEY)
    if not entry:
        return None
    listed = set(manifest.get("files") or {})
    files = set(entry.get("files") or [])
    need = {ONNX_FILE, CONFIG_FILE, TOKENIZER_FILE} if INT8_FILE not in files \
        else {CONFIG_FILE, TOKENIZER_FILE, INT8_FILE}
    missing = sorted(f for f in need if f not in files or f not in listed)
    if missing:
        raise BundleIntegrityError(f"{path}: the DWS predictor's files {missing} are not listed "
                                   "with a sha256 in the manifest; re-add it with "
                                   "`dwise-predict train --only dws`")
    return DWSPredictor.load(path, int8=int8 and INT8_FILE in files, threads=threads)


def manifest_entry(predictor: DWSPredictor, files: list[str],
                   exports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    c = predictor.config
    return {"files": files, "kind": KIND, "estimate": ESTIMATE, "N": c.n_blocks, "S": c.max_steps,
            "block_size": c.block_size, "encoder": c.encoder, "pooling": c.pooling,
            "truncation": {"rule": c.truncation.rule, "window": c.truncation.window,
                           "head_tokens": c.truncation.head_tokens,
                           "max_chars": c.truncation.max_chars},
            "precision": "int8" if INT8_FILE in files else "fp32",
            "n_params": c.info.get("encoder_params", 0) + c.info.get("head_params", 0),
            "exports": exports or []}


def write_bundle_dws(ref: str | Path, predictor: DWSPredictor, *, int8_path: str | Path | None = None,
                     exports: list[dict[str, Any]] | None = None, training: dict[str, Any] | None = None,
                     out: str | Path | None = None) -> Path:
    """Add (or replace) the DWS predictor of bundle ``ref``; returns the bundle's folder.

    Refuses a predictor whose block size differs from the bundle's fingerprint. Atomic: on any
    error the bundle is left as it was.
    """
    from .update import update_bundle

    with update_bundle(ref, out=out) as draft:
        bs = draft.source.fingerprint.block_size
        if predictor.config.block_size != bs:
            raise BundleError(f"the DWS predictor was trained on block size "
                              f"{predictor.config.block_size} but the bundle is for block size {bs}; "
                              "train it on this bundle's traces")
        for old in (ONNX_FILE, INT8_FILE, CONFIG_FILE, TOKENIZER_FILE):
            if old in draft.files():
                draft.remove_file(old)
        files = predictor.save(draft.folder, int8_path=int8_path)
        for name in files:
            draft.path(name)  # declares the file: hashed when the draft is finished
        draft.manifest.setdefault("predictors", {})[MANIFEST_KEY] = manifest_entry(
            predictor, files, exports)
        if training is not None:
            draft.manifest.setdefault("training", {})["dws"] = training
        return draft.destination

