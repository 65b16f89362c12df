"""Traces -> bundle: train the selected predictors and save them with their manifest."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle import save_bundle
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.traces import META_FINGERPRINT, TRACE_SCHEMA_VERSION

from .admission import AdmissionConfig, train_admission
from .dataset import TraceArrays, as_table, category_counts, trace_arrays
from .refinement import RefinementConfig, train_refinement

log = logging.getLogger(__name__)
PREDICTORS = ("admission", "refine", "dws")
#: what ``only=None`` trains (DWS joins when a cost profile is given)
DEFAULT_PREDICTORS = ("admission", "refine")


def parse_only(only: str | Sequence[str] | None) -> tuple[str, ...]:
    if only is None:
        return DEFAULT_PREDICTORS
    names = tuple(s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip())
    bad = [n for n in names if n not in PREDICTORS]
    if bad or not names:
        raise ConfigError(f"--only takes a comma list of {PREDICTORS}, got {only!r}")
    return names


def check_training_data(arrays: TraceArrays, *, allow_single_category: bool = False) -> None:
    """Refuse data that cannot give a meaningful predictor, with the fix in the message."""
    cats = category_counts(arrays.category)
    if len(cats) < 2 and not allow_single_category:
        raise TrainingError(f"the traces hold a single category {list(cats)}: within-category ranking, per-category "
                            "metrics and held-out evaluation need several; trace a mixed workload "
                            "(`dwise-predict workload`), or pass allow_single_category=True (--allow-single-category)")


def train_models(arrays: TraceArrays, only: tuple[str, ...], seed: int, *, featurizer: PromptFeaturizer | None = None,
                 admission_config: AdmissionConfig | None = None, refinement_config: RefinementConfig | None = None
                 ) -> tuple[Any, Any, dict[str, float]]:
    """Train the selected predictors on arrays; returns (admission | None, refinement | None, seconds)."""
    seconds: dict[str, float] = {}
    admission = refinement = None
    if "admission" in only:
        t0 = time.perf_counter()
        adm_cfg = replace(admission_config or AdmissionConfig(), seed=seed)
        admission = train_admission((arrays.features, arrays.total_rounds), adm_cfg, featurizer=featurizer)
        seconds["admission"] = time.perf_counter() - t0
    if "refine" in only:
        if arrays.hidden is None:
            raise TrainingError("the traces have no first_round_hidden; re-trace with hidden-state capture, or "
                                "train with --only admission")
        t0 = time.perf_counter()
        ref_cfg = replace(refinement_config or RefinementConfig(), seed=seed)
        refinement = train_refinement(arrays, ref_cfg)
        seconds["refine"] = time.perf_counter() - t0
    return admission, refinement, seconds


def train_bundle(traces: str | Path | pa.Table, out: str | Path, *, only: str | Sequence[str] | None = None,
                 seed: int = 0, featurizer: PromptFeaturizer | None = None,
                 admission_config: AdmissionConfig | None = None, refinement_config: RefinementConfig | None = None,
                 allow_single_category: bool = False, overwrite: bool = False, name: str | None = None,
                 cost_profile: Any = None, dws_config: Any = None) -> Path:
    """Train the selected predictors on ``traces`` and write a bundle folder at ``out``.

    ``cost_profile`` (a ``CostProfile``, a file or a shipped name) prices the DWS predictor's
    baselines and evaluation; with one and ``only=None``, DWS is trained too.
    """
    names = parse_only(only)
    profile = None
    if cost_profile is not None:
        from dwise_predict.cost import CostProfile, load_cost_profile

        profile = cost_profile if isinstance(cost_profile, CostProfile) else load_cost_profile(cost_profile)
        if only is None:
            names = (*names, "dws")
    if "dws" in names and profile is None:
        raise TrainingError("training DWS needs a cost profile (its baselines and evaluation are in ms): "
                            "pass --cost-profile FILE (from `dwise-predict profile`)")
    table = as_table(traces)
    arrays = trace_arrays(table, need_hidden="refine" in names)
    check_training_data(arrays, allow_single_category=allow_single_category)
    fingerprint = trace_fingerprint(table, featurizer)
    if featurizer is not None:
        check_featurizer(table, featurizer)
    admission, refinement, seconds = train_models(arrays, names, seed, featurizer=featurizer,
                                                  admission_config=admission_config,
                                                  refinement_config=refinement_config)
    training = {
        "n_requests": arrays.n, "categories": category_counts(arrays.category),
        "trace_schema_version": TRACE_SCHEMA_VERSION, "seed": seed, "predictors": list(names),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "total_rounds": {"min": int(arrays.total_rounds.min()), "median": float(np.median(arrays.total_rounds)),
                         "max": int(arrays.total_rounds.max())},
        "hit_budget_fraction": float(arrays.hit_budget.mean()),
    }
    if admission is not None:
        training["admission"] = admission.info
    if refinement is not None:
        training["refinement"] = refinement.info
    path = save_bundle(out, fingerprint=fingerprint, admission=admission, refinement=refinement, training=training,
                       overwrite=overwrite, name=name, allow_no_predictor="dws" in names)
    if "dws" in names:
        from .dws_bundle import train_dws_module

        t0 = time.perf_counter()
        profile.check_compatible(fingerprint)
        path, _ = train_dws_module(table, path, profile, config=dws_config, seed=seed)
        from dwise_predict.bundle.cost_profile import write_bundle_cost_profile

        write_bundle_cost_profile(path, profile)  # the profile the DWS costs are priced under
        log.info("DWS trained and exported in %.1f s", time.perf_counter() - t0)
    return path


def trace_fingerprint(table: pa.Table, featurizer: PromptFeaturizer | None) -> ModelFingerprint:
    """The traces' fingerprint (file metadata, else the columns), with the featurizer's hashes."""
    import json

    raw = (table.schema.metadata or {}).get(META_FINGERPRINT)
    if raw is not None:
        fp = ModelFingerprint.from_dict(json.loads(raw))
    else:
        row = table.slice(0, 1).to_pylist()[0]
        fp = ModelFingerprint(model_id=row["model_id"], block_size=int(row["block_size"]),
                              threshold=float(row["threshold"]), decoding=row["decoding"],
                              mask_token_id=row.get("mask_token_id"), hidden_size=row.get("hidden_size"),
                              max_new_tokens=int(row["output_budget"]), revision=row.get("model_revision"),
                              dtype=row.get("model_dtype"))
    if featurizer is not None:
        fp = replace(fp, tokenizer_hash=fp.tokenizer_hash or featurizer.tokenizer_hash,
                     chat_template_hash=fp.chat_template_hash or featurizer.chat_template_hash)
    return fp


def check_featurizer(table: pa.Table, featurizer: PromptFeaturizer, sample: int = 64) -> None:
    """Warn when the featurizer does not reproduce the traces' features (wrong tokenizer/template)."""
    if "prompt" not in table.column_names:
        return
    rows = [r for r in table.slice(0, sample).select(["prompt", "word_count", "newline_count", "prompt_tokens"])
            .to_pylist() if r["prompt"] is not None]
    if not rows:
        return
    got = featurizer([r["prompt"] for r in rows])
    want = np.array([[r["word_count"], r["newline_count"], r["prompt_tokens"]] for r in rows], dtype=np.float64)
    bad = int(np.sum(np.any(got != want, axis=1)))
    if bad:
        log.warning("the tokenizer/chat template reproduce the traced features for only %d of %d prompts: raw-text "
                    "admission estimates will be off; pass the served model's tokenizer and chat template",
                    len(rows) - bad, len(rows))
