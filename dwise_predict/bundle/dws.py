"""Add the DWS surface predictor (bundle module kind ``dws``) to an existing bundle.

Why: the DWS predictor needs a cost profile and a text encoder, so it is often trained after
the admission and refinement predictors; this adds it as a new revision of the bundle without
touching their files. Atomic: on any error the bundle is left as it was.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import BundleError
from ..predictors.dws import CONFIG_FILE, INT8_FILE, ONNX_FILE, TOKENIZER_FILE, DWSPredictor


def write_bundle_dws(
    ref: str | Path, predictor: DWSPredictor, *, out: str | Path | None = None
) -> Path:
    """Add (or replace) the DWS module of bundle ``ref``; returns the bundle's folder."""
    from .update import update_bundle

    with update_bundle(ref, out=out) as draft:
        bs = draft.source.fingerprint.block_size
        if predictor.config.block_size != bs:
            raise BundleError(
                f"the DWS predictor was trained on block size "
                f"{predictor.config.block_size} but the bundle is for block size {bs}; "
                "train it on this bundle's traces"
            )
        for old in (ONNX_FILE, INT8_FILE, CONFIG_FILE, TOKENIZER_FILE):
            if old in draft.files():
                draft.remove_file(old)
        files = predictor.save(draft.folder)
        for name in files:
            draft.path(name)  # declares the file: hashed when the draft is finished
        draft.manifest.setdefault("predictors", {})[predictor.kind] = {
            **predictor.entry(),
            "files": files,
        }
        return draft.destination
