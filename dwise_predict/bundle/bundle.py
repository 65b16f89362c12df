"""Save and load predictor bundles (format v1), and the :class:`Bundle` a scheduler predicts with."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..cost import CostProfile
from ..errors import BundleError, BundleIntegrityError, FingerprintMismatchError
from ..features import PromptFeaturizer
from ..fingerprint import ModelFingerprint
from ..predictors import AdmissionModel, RefinementEnsemble
from ..predictors import admission as _adm
from ..predictors import refinement as _ref
from ..predictors.dws import DWSPredictor, check_prompts
from ..predictors._files import write_json_atomic, write_text_atomic
from .card import CARD_FILE, render_card
from .cost_profile import load_manifest_cost_profile
from .dws import load_manifest_dws
from .format import (
    CHAT_TEMPLATE_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    LIBRARY_REQUIREMENT,
    MANIFEST,
    TOKENIZER_FILE,
    check_format,
    file_record,
    verify_files,
)
from .resolve import resolve_bundle, resolve_bundle_path
from .update import swap_in


@dataclass
class Bundle:
    """A loaded, verified bundle: the predictors of one dLLM + decoding setting.

    Estimates: :meth:`predict_admission` = TOTAL denoising rounds per prompt;
    :meth:`predict_refined` = rounds STILL TO GO after the first denoising round.
    """

    path: Path
    manifest: dict[str, Any]
    fingerprint: ModelFingerprint
    admission: AdmissionModel | None = None
    refinement: RefinementEnsemble | None = None
    #: the deployment's cost factors (``cost_profile.json``), None until profiled
    cost_profile: CostProfile | None = None
    #: the DWS surface predictor (``predictors.dws``), None when the bundle has none
    dws: DWSPredictor | None = None

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.path.name)

    # -- prediction -------------------------------------------------------------------------
    def _need_admission(self) -> AdmissionModel:
        if self.admission is None:
            raise BundleError(f"bundle '{self.name}' has no admission predictor; train one with "
                              "`dwise-predict train --only admission`")
        return self.admission

    def _need_refinement(self) -> RefinementEnsemble:
        if self.refinement is None:
            raise BundleError(f"bundle '{self.name}' has no refinement predictor; train one with "
                              "`dwise-predict train --only refine`")
        return self.refinement

    def predict_admission(self, prompts: str | Sequence[str]) -> np.ndarray:
        """Estimated total denoising rounds, one per raw prompt (uses the bundled tokenizer + template)."""
        return self._need_admission().predict(prompts)

    def predict_admission_features(self, X: np.ndarray) -> np.ndarray:
        """Estimated total denoising rounds from feature rows ``(n, 3)``: word, newline, token counts."""
        return self._need_admission().predict_features(X)

    def predict_refined(self, hidden: Any, prompt_tokens: Any, output_budget: Any, *, raw: bool = False) -> np.ndarray:
        """Estimated rounds still to go after the first denoising round, one per hidden row.

        ``raw=True`` gives the ensemble's uncalibrated restricted mean.
        """
        return self._need_refinement().predict(hidden, prompt_tokens, output_budget, raw=raw)

    def with_cost_profile(self, profile: CostProfile, *, allow_mismatch: bool = False) -> Bundle:
        """This bundle priced under another deployment's ``profile`` (in memory; the files are
        untouched: ``dwise-predict profile --bundle`` writes a new revision). Refuses a profile
        of another dLLM, block size or decoder unless ``allow_mismatch``."""
        if not isinstance(profile, CostProfile):
            raise BundleError(f"with_cost_profile needs a CostProfile, got "
                              f"{type(profile).__name__}; load one with "
                              "dwise_predict.cost.load_cost_profile")
        if not allow_mismatch:
            profile.check_compatible(self.fingerprint)
        return dataclasses.replace(self, cost_profile=profile)

    def _need_dws(self) -> DWSPredictor:
        if self.dws is None:
            raise BundleError(f"bundle '{self.name}' has no DWS predictor; train one with "
                              "`dwise-predict train --only dws`")
        return self.dws

    def predict_surface(self, prompts: str | Sequence[str]) -> np.ndarray:
        """The DWS surface ``(n, N, S)``: P(output block b needs denoising step s), per prompt."""
        return self._need_dws().predict_surface(prompts)

    def prompt_blocks(self, prompts: str | Sequence[str],
                      prompt_tokens: Any = None) -> np.ndarray:
        """m per prompt: the served model's prompt blocks (chat template + tokenizer of the
        admission featurizer, or the given ``prompt_tokens``)."""
        texts = check_prompts(prompts)
        bs = self.fingerprint.block_size
        if prompt_tokens is None:
            featurizer = self.admission.featurizer if self.admission is not None else None
            if featurizer is None:
                raise BundleError(f"bundle '{self.name}' has no tokenizer of the served model to "
                                  "count prompt blocks; pass prompt_tokens=")
            tokens = featurizer(texts)[:, 2]
        else:
            tokens = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1)
            if tokens.size != len(texts) or not np.all(np.isfinite(tokens)) or np.any(tokens < 0):
                raise BundleError(f"prompt_tokens must hold {len(texts)} finite counts >= 0")
        return np.maximum(1, np.ceil(tokens / bs)).astype(np.int64)

    def predict_cost(self, prompts: str | Sequence[str], prompt_tokens: Any = None) -> np.ndarray:
        """Expected cost (ms) per prompt under the bundle's cost profile: the DWS surface priced
        by ``alpha*m + beta*E[n] + sum D*(K + delta*m)`` (see :mod:`dwise_predict.cost`)."""
        profile = self.cost_profile
        if profile is None:
            raise BundleError(f"bundle '{self.name}' has no cost profile; profile the deployment "
                              "(`dwise-predict profile --bundle ...`) or use "
                              "bundle.with_cost_profile(load_cost_profile(...))")
        m = self.prompt_blocks(prompts, prompt_tokens)
        return profile.expected_cost(self.predict_surface(prompts), m)

    # -- guard ------------------------------------------------------------------------------
    def check(self, fingerprint: ModelFingerprint, allow_mismatch: bool = False) -> list[str]:
        """Refuse to serve a dLLM/decoding setting this bundle was not trained for.

        Returns the mismatching fields (empty when all agree); with ``allow_mismatch=True`` a
        mismatch only warns (for experts who know the difference is harmless).
        """
        diff = self.fingerprint.mismatches(fingerprint)
        if not diff:
            return []
        details = ", ".join(f"{k}: {getattr(self.fingerprint, k)!r} vs {getattr(fingerprint, k)!r}" for k in diff)
        msg = (f"bundle '{self.name}' was trained for {self.fingerprint.short()} but the server runs "
               f"{fingerprint.short()} ({details}): retrain, or pass allow_mismatch=True")
        if not allow_mismatch:
            raise FingerprintMismatchError(msg)
        warnings.warn(msg, stacklevel=2)
        return diff

    def __repr__(self) -> str:
        return (f"Bundle({self.name!r}, {self.fingerprint.short()}, admission={self.admission is not None}, "
                f"refinement={self.refinement is not None})")


def save_bundle(out: str | Path, *, fingerprint: ModelFingerprint, admission: AdmissionModel | None = None,
                refinement: RefinementEnsemble | None = None, training: dict[str, Any] | None = None,
                metrics: dict[str, Any] | None = None, name: str | None = None,
                requires: str = LIBRARY_REQUIREMENT, overwrite: bool = False,
                allow_no_predictor: bool = False) -> Path:
    """Write a bundle folder atomically (built in a temporary sibling folder, then renamed).

    The manifest records the sha256 of every file written (the model card ``README.md`` included,
    rendered from the manifest; metrics "not evaluated yet" until :func:`record_evaluation`);
    ``requires`` is the PEP 440 range of library versions allowed to load it.
    ``allow_no_predictor``: a module (e.g. DWS) is added right after by an update.
    """
    out = Path(out)
    if admission is None and refinement is None and not allow_no_predictor:
        raise BundleError("a bundle needs at least one predictor (admission and/or refinement)")
    if out.exists() and not overwrite:
        raise BundleError(f"{out} already exists; choose another --out or pass overwrite=True (--force)")
    if out.exists() and not (out / MANIFEST).is_file():
        raise BundleError(f"{out} exists and is not a bundle; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        predictors: dict[str, Any] = {}
        features: dict[str, Any] = {}
        if admission is not None:
            predictors["admission"] = {"files": admission.save(tmp), "kind": "lightgbm", "estimate": _adm.ESTIMATE,
                                       "n_trees": admission.forest.n_trees, "max_leaves": admission.forest.max_leaves}
            features["admission"] = {"names": list(admission.feature_names), "target": "log(total_rounds)",
                                     "featurizer": _save_featurizer(admission.featurizer, tmp)}
        if refinement is not None:
            predictors["refinement"] = {"files": refinement.save(tmp), "kind": "survival_mlp_ensemble",
                                        "estimate": _ref.ESTIMATE, "calibrated": refinement.calibration is not None,
                                        "members": len(refinement.members), "K": refinement.K,
                                        "width": int(refinement.members[0].w1.shape[1]),
                                        "n_params": int(refinement.n_params)}
            features["refinement"] = {
                "hidden_size": refinement.hidden_size, "K": refinement.K,
                "hidden": "first-round final-layer hidden rows of the first output block, mean-pooled",
                "prompt_tokens_scale": refinement.prompt_tokens_scale,
                "output_budget_scale": refinement.output_budget_scale,
            }
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "name": name or out.name,
            "library": {"name": "dwise-predict", "version": __version__, "requires": requires},
            "fingerprint": fingerprint.to_dict(),
            "predictors": predictors,
            "features": features,
            "training": training or {},
            "metrics": metrics or {},
        }
        write_text_atomic(tmp / CARD_FILE, render_card(manifest))
        manifest["files"] = {p.name: file_record(p) for p in sorted(tmp.iterdir()) if p.is_file()}
        write_json_atomic(tmp / MANIFEST, manifest)
        os.chmod(tmp, 0o755)  # mkdtemp creates 0700
        swap_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _save_featurizer(featurizer: PromptFeaturizer | None, folder: Path) -> dict[str, Any] | None:
    if featurizer is None:
        return None
    write_text_atomic(folder / TOKENIZER_FILE, featurizer.tokenizer.to_str())
    spec: dict[str, Any] = {"tokenizer": TOKENIZER_FILE, "tokenizer_hash": featurizer.tokenizer_hash,
                            "add_special_tokens": featurizer.add_special_tokens,
                            "template_kwargs": featurizer.template_kwargs, "chat_template": None}
    if featurizer.chat_template is not None:
        write_text_atomic(folder / CHAT_TEMPLATE_FILE, featurizer.chat_template.source)
        spec["chat_template"] = CHAT_TEMPLATE_FILE
        spec["chat_template_hash"] = featurizer.chat_template_hash
    return spec


def read_manifest(ref: str | Path) -> dict[str, Any]:
    """The manifest of a bundle, parsed and format-checked (nothing else is opened)."""
    path = resolve_bundle_path(ref)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleIntegrityError(f"{path}/{MANIFEST} is not valid JSON ({e}); the bundle is corrupt") from e
    if not isinstance(manifest, dict):
        raise BundleIntegrityError(f"{path}/{MANIFEST} is not a JSON object; the bundle is corrupt")
    check_format(manifest, str(path))
    return manifest


def load_bundle(ref: str | Path) -> Bundle:
    """Load a bundle: format and version requirement first, then every sha256, then the predictors."""
    resolved = resolve_bundle(ref)
    path = resolved.path
    manifest = read_manifest(path)
    verify_files(path, manifest, str(path))
    listed = set(manifest["files"])
    for pred, rec in (manifest.get("predictors") or {}).items():
        for f in rec.get("files", []):
            if f not in listed:
                raise BundleIntegrityError(f"{path}: {pred} file {f} has no sha256 in the manifest; re-save the bundle")
    try:
        fingerprint = ModelFingerprint.from_dict(manifest["fingerprint"])
    except (KeyError, TypeError) as e:
        raise BundleIntegrityError(f"{path}/{MANIFEST} has no valid fingerprint ({e}); re-save the bundle") from e
    predictors = manifest.get("predictors") or {}
    admission = refinement = None
    if "admission" in predictors:
        spec = (manifest.get("features") or {}).get("admission", {}).get("featurizer")
        admission = _adm.AdmissionModel.load(path, featurizer=_load_featurizer(path, spec, listed))
    if "refinement" in predictors:
        refinement = _ref.RefinementEnsemble.load(path)
        fp_h = fingerprint.hidden_size
        if fp_h is not None and fp_h != refinement.hidden_size:
            raise BundleIntegrityError(f"{path}: refinement hidden size {refinement.hidden_size} differs from the "
                                       f"fingerprint's {fp_h}; the bundle is inconsistent, retrain it")
    if resolved.expected_fingerprint is not None:
        wrong = resolved.expected_fingerprint.mismatches(fingerprint)
        if wrong:
            raise BundleIntegrityError(
                f"zoo entry {str(ref)!r} promises {resolved.expected_fingerprint.short()} but the bundle at {path} is "
                f"for {fingerprint.short()} (differs in {', '.join(wrong)}); the zoo index and bundle are out of step: "
                "reinstall dwise-predict")
    return Bundle(path=path, manifest=manifest, fingerprint=fingerprint, admission=admission,
                  refinement=refinement, cost_profile=load_manifest_cost_profile(path, manifest),
                  dws=load_manifest_dws(path, manifest))


def _load_featurizer(path: Path, spec: dict[str, Any] | None, listed: set[str]) -> PromptFeaturizer | None:
    if not spec:
        return None
    from tokenizers import Tokenizer

    tok_name = spec.get("tokenizer")
    tpl_name = spec.get("chat_template")
    if not isinstance(tok_name, str):
        raise BundleIntegrityError(f"{path}/{MANIFEST} names a featurizer without a tokenizer file; re-save the bundle")
    for f in (tok_name, tpl_name):
        if f is not None and f not in listed:
            raise BundleIntegrityError(f"{path}: {f} has no sha256 in the manifest; re-save the bundle")
    try:
        tokenizer = Tokenizer.from_file(str(path / tok_name))
    except Exception as e:  # tokenizers raises a bare Exception
        raise BundleError(f"{path}/{tok_name} is not a valid tokenizer ({e}); re-save the bundle") from e
    template = (path / tpl_name).read_text(encoding="utf-8") if tpl_name else None
    return PromptFeaturizer(tokenizer, template, add_special_tokens=bool(spec.get("add_special_tokens", False)),
                            template_kwargs=spec.get("template_kwargs") or {})
