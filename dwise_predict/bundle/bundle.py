"""Save and load predictor bundles, and the :class:`Bundle` a scheduler predicts with."""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from ..atomic import staged_folder, write_json, write_text
from ..cost import CostProfile
from ..errors import BundleError, BundleIntegrityError, FingerprintMismatchError, PredictorError
from ..fingerprint import ModelFingerprint
from ..predictors import AdmissionModel, RefinementEnsemble
from ..predictors.dws import DWSPredictor, check_prompts
from ..traces import prompt_blocks
from .builtin import ShippedKinds
from .card import CARD_FILE, render_card
from .format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LIBRARY_REQUIREMENT,
    MANIFEST,
    check_format,
    file_record,
    migrate,
    verify_files,
)
from .modules import BundleFolder, BundleModule, M, declared, module_class, registered
from .resolve import resolve_bundle, resolve_bundle_path

log = logging.getLogger(__name__)

#: Where an admission estimate comes from. ``"lightgbm"``: the admission model on the prompt's
#: features (the paper's). ``"lightgbm+dws"``: the mean of that and the DWS surface's expected
#: denoising rounds: two estimates of the same total from different inputs (three counts
#: against the prompt's text read by an encoder), whose errors are only partly shared, so
#: their mean ranks better than either (docs/predictors.md). Needs a DWS predictor.
ADMISSION_SOURCES: tuple[str, ...] = ("lightgbm", "lightgbm+dws")


def mean_with_dws(admission: Any, dws_rounds: Any) -> np.ndarray:
    """The ``"lightgbm+dws"`` admission estimate: the two estimates' plain mean (no weight to
    fit, so nothing is tuned on the requests it is measured on)."""
    return 0.5 * (np.asarray(admission, dtype=np.float64) + np.asarray(dws_rounds, np.float64))


@dataclass
class Bundle(ShippedKinds):
    """A loaded, verified bundle: the predictors of one dLLM + decoding setting.

    ``modules`` maps each declared kind to its loaded predictor; :meth:`module` / :meth:`need`
    look one up by its class, for every kind, and the shipped kinds are also typed attributes
    (``.admission``, ``.refinement``, ``.cost_profile``, ``.dws``: :mod:`.builtin`). Estimates:
    :meth:`predict_admission` = TOTAL denoising rounds per prompt; :meth:`predict_refined` =
    rounds STILL TO GO after the first denoising round.
    """

    path: Path
    manifest: dict[str, Any]
    fingerprint: ModelFingerprint
    modules: dict[str, BundleModule] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return str(self.manifest.get("name") or self.path.name)

    def module(self, cls: type[M]) -> M | None:
        """The loaded module of class ``cls``'s kind, or None when the bundle has none."""
        found = self.modules.get(cls.kind)
        return found if isinstance(found, cls) else None

    def need(self, cls: type[M]) -> M:
        """Like :meth:`module`, but refuses (naming the fix) when the bundle has none."""
        found = self.module(cls)
        if found is None:
            raise BundleError(
                f"bundle '{self.name}' has no {cls.kind} predictor; train one with "
                f"`dwise-predict train --only {cls.kind}`"
            )
        return found

    def with_cost_profile(self, profile: CostProfile, *, allow_mismatch: bool = False) -> Bundle:
        """This bundle priced under another deployment's ``profile``, in memory (the files are
        untouched: ``dwise-predict profile --bundle`` writes a new revision). Refuses a profile
        of another dLLM, block size or decoder unless ``allow_mismatch``."""
        if not isinstance(profile, CostProfile):
            raise BundleError(
                f"with_cost_profile needs a CostProfile, got "
                f"{type(profile).__name__}; load one with "
                "dwise_predict.cost.load_cost_profile"
            )
        if not allow_mismatch:
            profile.check_compatible(self.fingerprint)
        return dataclasses.replace(self, modules={**self.modules, profile.kind: profile})

    # -- prediction -------------------------------------------------------------------------
    def predict_admission(
        self, prompts: str | Sequence[str], *, source: str = "lightgbm"
    ) -> np.ndarray:
        """Estimated total denoising rounds, one per raw prompt (bundled tokenizer + template).

        ``source`` is one of :data:`ADMISSION_SOURCES`; ``"lightgbm+dws"`` averages the
        admission model's estimate with :meth:`predict_dws_rounds` (an encoder pass per prompt,
        milliseconds on a CPU instead of microseconds).
        """
        estimates = self.need(AdmissionModel).predict(prompts)
        return self.admission_from_source(estimates, prompts, source)

    def admission_from_source(
        self, estimates: Any, prompts: str | Sequence[str], source: str
    ) -> np.ndarray:
        """The admission model's ``estimates`` (one per prompt) as ``source`` gives them: as
        they are for ``"lightgbm"``, averaged with :meth:`predict_dws_rounds` of ``prompts`` for
        ``"lightgbm+dws"``. The one place a source is turned into estimates (the simulator's
        replay and the SGLang plugin call it too)."""
        self.check_admission_source(source)
        est = np.asarray(estimates, dtype=np.float64)
        if source == "lightgbm+dws":
            est = mean_with_dws(est, self.predict_dws_rounds(prompts))
        return est

    def check_admission_source(self, source: str) -> None:
        """Refuse an admission source this bundle cannot serve, naming the fix."""
        if source not in ADMISSION_SOURCES:
            raise BundleError(f"admission source {source!r} is not one of {ADMISSION_SOURCES}")
        if source == "lightgbm+dws" and self.dws is None:
            raise BundleError(
                f"admission source 'lightgbm+dws' averages in the DWS surface's expected rounds, "
                f"but bundle '{self.name}' has no DWS predictor: train one with "
                "`dwise-predict train --only dws --cost-profile ...` or use 'lightgbm'"
            )

    def predict_dws_rounds(self, prompts: str | Sequence[str]) -> np.ndarray:
        """Expected total denoising rounds per prompt from the DWS surface: the sum of
        P(output block b needs step s) over b and s, the expected count of (block, step)
        pairs, i.e. of denoising rounds (the admission model's unit)."""
        surface = self.need(DWSPredictor).predict_surface(prompts)
        return np.asarray(surface.sum(axis=(1, 2), dtype=np.float64))

    def admission_row(self, text: str, prompt_tokens: int) -> tuple[float, ...]:
        """The admission model's feature row of one request: its user prompt (chat template
        removed) and its token count as served. Schedulers build rows here, so a bundle trained
        on other features (``admission.feature_names``) is fed what it was trained on."""
        return self.need(AdmissionModel).row(text, prompt_tokens)

    def predict_admission_features(self, X: np.ndarray) -> np.ndarray:
        """Estimated total denoising rounds from feature rows ``(n, len(feature_names))`` in
        the admission model's ``feature_names`` order."""
        return self.need(AdmissionModel).predict_features(X)

    def predict_admission_one(self, x: Sequence[float]) -> float:
        """One request's estimate from its feature row (:meth:`admission_row`): the
        per-arrival path of a serving loop, a few microseconds instead of a batch call's tens."""
        return self.need(AdmissionModel).predict_one(x)

    def predict_admission_prompt(self, text: str, prompt_tokens: int) -> float:
        """One request's estimate from its user prompt and served token count: its
        :meth:`admission_row` through :meth:`predict_admission_one`."""
        model = self.need(AdmissionModel)
        return model.predict_one(model.row(text, prompt_tokens))

    def predict_refined(
        self, hidden: Any, prompt_tokens: Any, output_budget: Any, *, raw: bool = False
    ) -> np.ndarray:
        """Estimated rounds still to go after the first denoising round, one per hidden row.

        ``raw=True`` gives the ensemble's uncalibrated restricted mean.
        """
        return self.need(RefinementEnsemble).predict(hidden, prompt_tokens, output_budget, raw=raw)

    def predict_surface(self, prompts: str | Sequence[str]) -> np.ndarray:
        """The DWS surface ``(n, N, S)``: P(output block b needs denoising step s), per prompt."""
        return self.need(DWSPredictor).predict_surface(prompts)

    def prompt_blocks(self, prompts: str | Sequence[str], prompt_tokens: Any = None) -> np.ndarray:
        """m per prompt: the served model's prompt blocks (chat template + tokenizer of the
        admission featurizer, or the given ``prompt_tokens``), counted in the bundle's block
        layout (absolute: floor(L / block), response: ceil, see
        :func:`dwise_predict.traces.prompt_blocks`)."""
        texts = check_prompts(prompts)
        if prompt_tokens is None:
            featurizer = self.admission.featurizer if self.admission is not None else None
            if featurizer is None:
                raise BundleError(
                    f"bundle '{self.name}' has no tokenizer of the served model to "
                    "count prompt blocks; pass prompt_tokens="
                )
            tokens = featurizer(texts)[:, 2]
        else:
            tokens = np.asarray(prompt_tokens, dtype=np.float64).reshape(-1)
            if tokens.size != len(texts) or not np.all(np.isfinite(tokens)) or np.any(tokens < 0):
                raise BundleError(f"prompt_tokens must hold {len(texts)} finite counts >= 0")
        return prompt_blocks(tokens, self.fingerprint.block_size, self.fingerprint.alignment)

    def predict_cost(self, prompts: str | Sequence[str], prompt_tokens: Any = None) -> np.ndarray:
        """Expected cost (ms) per prompt under the bundle's cost profile: the DWS surface priced
        by ``alpha*m + beta*E[n] + sum D*(K + delta*m)`` (see :mod:`dwise_predict.cost`)."""
        profile = self.cost_profile
        if profile is None:
            raise BundleError(
                f"bundle '{self.name}' has no cost profile; profile the deployment "
                "(`dwise-predict profile --bundle ...`) or use "
                "bundle.with_cost_profile(load_cost_profile(...))"
            )
        m = self.prompt_blocks(prompts, prompt_tokens)
        return profile.expected_cost(self.predict_surface(prompts), m)

    # -- guard ------------------------------------------------------------------------------
    def check(self, fingerprint: ModelFingerprint, allow_mismatch: bool = False) -> list[str]:
        """Refuse to serve a dLLM/decoding setting this bundle was not trained for.

        Returns the mismatching fields (empty when all agree); with ``allow_mismatch=True`` a
        mismatch only warns (for experts who know the difference is harmless).

        ``block_alignment`` is refused like any critical field when both sides record it (a
        bundle traced response-aligned on a server running absolute-position blocks). A bundle
        whose fingerprint predates the field was traced response-aligned; it is accepted with a
        logged warning naming both layouts, so bundles saved before the field keep serving.
        """
        note = self.fingerprint.legacy_alignment_note(fingerprint)
        if note is not None:
            log.warning("bundle '%s' on %s: %s", self.name, fingerprint.short(), note)
        diff = self.fingerprint.mismatches(fingerprint)
        if not diff:
            return []
        details = ", ".join(
            f"{k}: {getattr(self.fingerprint, k)!r} vs {getattr(fingerprint, k)!r}" for k in diff
        )
        msg = (
            f"bundle '{self.name}' was trained for {self.fingerprint.short()} but the server runs "
            f"{fingerprint.short()} ({details}): retrain, or pass allow_mismatch=True"
        )
        if not allow_mismatch:
            raise FingerprintMismatchError(msg)
        warnings.warn(msg, stacklevel=2)
        return diff

    def __repr__(self) -> str:
        return f"Bundle({self.name!r}, {self.fingerprint.short()}, modules={list(self.modules)})"


def save_bundle(
    out: str | Path,
    modules: Iterable[BundleModule],
    *,
    fingerprint: ModelFingerprint,
    training: dict[str, Any] | None = None,
    metrics: dict[str, Any] | None = None,
    name: str | None = None,
    requires: str = LIBRARY_REQUIREMENT,
    overwrite: bool = False,
) -> Path:
    """Write a bundle folder of ``modules`` atomically (built in a hidden sibling, then swapped in).

    Each module saves its own files and gives its manifest entry, stored under its kind; the
    manifest records the sha256 of every file written (the model card ``README.md`` included,
    rendered from the manifest; metrics "not evaluated yet" until :func:`record_evaluation`);
    ``requires`` is the PEP 440 range of library versions allowed to load it.
    """
    out = Path(out)
    parts = list(modules)
    if not parts:
        raise BundleError(f"a bundle needs at least one predictor (one of {sorted(registered())})")
    kinds = [module_class(m.kind, "save_bundle").kind for m in parts]
    if len(set(kinds)) != len(kinds):
        raise BundleError(
            f"a bundle holds one predictor per kind, got {kinds}; pass each kind once"
        )
    if out.exists() and not overwrite:
        raise BundleError(
            f"{out} already exists; choose another --out or pass overwrite=True (--force)"
        )
    if out.exists() and not (out / MANIFEST).is_file():
        raise BundleError(f"{out} exists and is not a bundle; refusing to replace it")
    with staged_folder(out) as tmp:
        predictors: dict[str, Any] = {}
        for module in parts:
            files = module.save(tmp)
            predictors[module.kind] = {"files": files, **module.entry()}
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "name": name or out.name,
            "library": {"name": "dwise-predict", "version": __version__, "requires": requires},
            "fingerprint": fingerprint.to_dict(),
            "predictors": predictors,
            "training": training or {},
            "metrics": metrics or {},
        }
        write_text(tmp / CARD_FILE, render_card(manifest))
        manifest["files"] = {
            p.relative_to(tmp).as_posix(): file_record(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        write_json(tmp / MANIFEST, manifest)
    return out


def read_manifest(ref: str | Path) -> dict[str, Any]:
    """The manifest of a bundle, parsed, format-checked and in the current layout (a format v1
    manifest is migrated in memory; nothing else is opened)."""
    path = resolve_bundle_path(ref)
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise BundleIntegrityError(
            f"{path}/{MANIFEST} is not valid JSON ({e}); the bundle is corrupt"
        ) from e
    if not isinstance(manifest, dict):
        raise BundleIntegrityError(f"{path}/{MANIFEST} is not a JSON object; the bundle is corrupt")
    check_format(manifest, str(path))
    return migrate(manifest)


def load_bundle(ref: str | Path) -> Bundle:
    """Load a bundle: format and version requirement first, then every sha256, then each
    declared module through the class registered for its kind."""
    resolved = resolve_bundle(ref)
    path = resolved.path
    manifest = read_manifest(path)
    verify_files(path, manifest, str(path))
    folder = BundleFolder(path, frozenset(manifest["files"]))
    try:
        fingerprint = ModelFingerprint.from_dict(manifest["fingerprint"])
    except (KeyError, TypeError) as e:
        raise BundleIntegrityError(
            f"{path}/{MANIFEST} has no valid fingerprint ({e}); re-save the bundle"
        ) from e
    modules: dict[str, BundleModule] = {}
    for kind, entry in declared(manifest):
        cls = module_class(kind, str(path))
        for f in entry.get("files", []):
            folder.path(f)  # every file a module declares must be listed (and so verified)
        try:
            module = cls.load(folder, entry)
        except PredictorError as e:
            raise BundleIntegrityError(
                f"{path}: the {kind} predictor is corrupt ({e}); re-save the bundle"
            ) from e
        module.check_fingerprint(fingerprint, str(path))
        modules[kind] = module
    if resolved.expected_fingerprint is not None:
        wrong = resolved.expected_fingerprint.mismatches(fingerprint)
        if wrong:
            raise BundleIntegrityError(
                f"zoo entry {str(ref)!r} promises {resolved.expected_fingerprint.short()} but the "
                f"bundle at {path} is for {fingerprint.short()} (differs in {', '.join(wrong)}); "
                "the zoo index and bundle are out of step: reinstall dwise-predict"
            )
    return Bundle(path=path, manifest=manifest, fingerprint=fingerprint, modules=modules)
