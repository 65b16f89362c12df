"""Traces -> bundle: train the selected predictors and save them with their manifest."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle import save_bundle
from dwise_predict.bundle.modules import BundleModule
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.predictors import AdmissionModel, RefinementEnsemble
from dwise_predict.traces import META_FINGERPRINT, TRACE_SCHEMA_VERSION

from .admission import AdmissionConfig, train_admission
from .dataset import TraceArrays, as_table, category_counts, trace_arrays
from .devices import DeviceConfig, is_global_zero
from .refinement import RefinementConfig, train_refinement
from .streaming import ARRAY_COLUMNS, ParquetSource, RowSource

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """What every kind's trainer may use: the seed, the featurizer and per-kind configs."""

    seed: int = 0
    featurizer: PromptFeaturizer | None = None
    admission_config: AdmissionConfig | None = None
    refinement_config: RefinementConfig | None = None
    #: streamed traces feed the refinement predictor instead of the in-memory arrays
    source: RowSource | None = None
    devices: DeviceConfig | None = None


def _train_admission(arrays: TraceArrays, s: TrainSettings) -> AdmissionModel:
    cfg = replace(s.admission_config or AdmissionConfig(), seed=s.seed)
    return train_admission((arrays.features, arrays.total_rounds), cfg, featurizer=s.featurizer)


def _train_refinement(arrays: TraceArrays, s: TrainSettings) -> RefinementEnsemble:
    if arrays.hidden is None and s.source is None:
        raise TrainingError(
            "the traces have no first_round_hidden; re-trace with hidden-state "
            f"capture, or train with --only {AdmissionModel.kind}"
        )
    rows = s.source if s.source is not None else arrays
    cfg = replace(s.refinement_config or RefinementConfig(), seed=s.seed)
    return train_refinement(rows, cfg, devices=s.devices)


#: bundle module kind -> its trainer; a new kind adds one line here to be trainable
TRAINERS: dict[str, Callable[[TraceArrays, TrainSettings], BundleModule]] = {
    AdmissionModel.kind: _train_admission,
    RefinementEnsemble.kind: _train_refinement,
}
#: kinds whose trainer reads the first-round hidden state
NEEDS_HIDDEN = frozenset({RefinementEnsemble.kind})


#: trained from prompt text with a cost profile, outside TRAINERS (see trainers/dws_bundle.py)
DWS = "dws"


def parse_only(only: str | Sequence[str] | None) -> tuple[str, ...]:
    """The kinds to train: all trainable kinds by default, else the comma list given."""
    if only is None:
        return tuple(TRAINERS)
    names = tuple(
        s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()
    )
    bad = [n for n in names if n not in TRAINERS and n != DWS]
    if bad or not names:
        raise ConfigError(f"--only takes a comma list of {[*TRAINERS, DWS]}, got {only!r}")
    return names


def check_training_data(arrays: TraceArrays, *, allow_single_category: bool = False) -> None:
    """Refuse data that cannot give a meaningful predictor, with the fix in the message."""
    cats = category_counts(arrays.category)
    if len(cats) < 2 and not allow_single_category:
        raise TrainingError(
            f"the traces hold a single category {list(cats)}: within-category ranking, "
            "per-category metrics and held-out evaluation need several; trace a mixed workload "
            "(`dwise-predict workload`), or pass allow_single_category=True "
            "(--allow-single-category)"
        )


def train_models(
    arrays: TraceArrays, only: Sequence[str], settings: TrainSettings
) -> tuple[list[BundleModule], dict[str, float]]:
    """Train the selected kinds on ``arrays``; returns the modules and seconds per kind."""
    modules: list[BundleModule] = []
    seconds: dict[str, float] = {}
    for kind in only:
        t0 = time.perf_counter()
        modules.append(TRAINERS[kind](arrays, settings))
        seconds[kind] = time.perf_counter() - t0
    return modules, seconds


def train_bundle(
    traces: str | Path | pa.Table,
    out: str | Path,
    *,
    only: str | Sequence[str] | None = None,
    seed: int = 0,
    featurizer: PromptFeaturizer | None = None,
    admission_config: AdmissionConfig | None = None,
    refinement_config: RefinementConfig | None = None,
    allow_single_category: bool = False,
    overwrite: bool = False,
    name: str | None = None,
    cost_profile: Any = None,
    dws_config: Any = None,
    devices: DeviceConfig | None = None,
    streaming: bool = False,
    filesystem: Any = None,
) -> Path:
    """Train the selected predictors on ``traces`` and write a bundle folder at ``out``.

    ``cost_profile`` (a ``CostProfile``, a file or a shipped name) prices the DWS predictor's
    baselines and evaluation and is stored in the bundle; with one and ``only=None``, DWS is
    trained too.

    ``streaming`` reads the traces (a path or URI; ``filesystem`` a ``pyarrow.fs`` one) in
    record batches: the refinement predictor never holds more than a shuffle window of hidden
    states, while the admission model (and DWS) load their small columns whole (a few bytes
    per request). Under several processes (``devices``) every process trains and only global
    rank 0 writes the bundle; the others return ``out`` unwritten.
    """
    names = parse_only(only)
    profile = None
    if cost_profile is not None:
        from dwise_predict.cost import CostProfile, load_cost_profile

        profile = (
            cost_profile
            if isinstance(cost_profile, CostProfile)
            else load_cost_profile(cost_profile)
        )
        if only is None:
            names = (*names, DWS)
    if DWS in names and profile is None:
        raise TrainingError(
            "training DWS needs a cost profile (its baselines and evaluation are "
            "in ms): pass --cost-profile FILE (from `dwise-predict profile`)"
        )
    source: ParquetSource | None = None
    if streaming:
        if isinstance(traces, pa.Table):
            raise ConfigError(
                "streaming reads trace files; pass their path (or train the table in memory)"
            )
        source = ParquetSource(traces, filesystem=filesystem)
        small = [c for c in ARRAY_COLUMNS if c != "first_round_hidden"]
        if DWS in names:  # DWS reads the prompt text and rounds per block, never hidden states
            small = [c for c in source.head(1).column_names if c != "first_round_hidden"]
        table = source.read_columns(small)
        arrays = trace_arrays(table)
        head = source.head(64)
    else:
        table = as_table(traces)
        arrays = trace_arrays(table, need_hidden=bool(NEEDS_HIDDEN & set(names)))
        head = table
    check_training_data(arrays, allow_single_category=allow_single_category)
    fingerprint = trace_fingerprint(head, featurizer)
    if featurizer is not None:
        check_featurizer(head, featurizer)
    settings = TrainSettings(
        seed=seed,
        featurizer=featurizer,
        admission_config=admission_config,
        refinement_config=refinement_config,
        source=source,
        devices=devices,
    )
    modules, seconds = train_models(arrays, tuple(n for n in names if n != DWS), settings)
    if not is_global_zero():
        return Path(out)  # the other processes of a multi-process run: rank 0 writes
    training: dict[str, Any] = {
        "n_requests": arrays.n,
        "categories": category_counts(arrays.category),
        "trace_schema_version": TRACE_SCHEMA_VERSION,
        "seed": seed,
        "predictors": list(names),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "total_rounds": {
            "min": int(arrays.total_rounds.min()),
            "median": float(np.median(arrays.total_rounds)),
            "max": int(arrays.total_rounds.max()),
        },
        "hit_budget_fraction": float(arrays.hit_budget.mean()),
    }
    if profile is None:
        return save_bundle(
            out, modules, fingerprint=fingerprint, training=training, overwrite=overwrite, name=name
        )
    profile.check_compatible(fingerprint)
    with tempfile.TemporaryDirectory(prefix="dwise-dws-") as tmp:
        parts = [*modules, profile]
        if DWS in names:
            from .dws_bundle import train_dws_module

            t0 = time.perf_counter()
            dws, trained = train_dws_module(table, profile, tmp, config=dws_config, seed=seed)
            training["seconds"][DWS] = round(time.perf_counter() - t0, 3)
            training[DWS] = trained.info
            parts.append(dws)
        return save_bundle(
            out, parts, fingerprint=fingerprint, training=training, overwrite=overwrite, name=name
        )


def trace_fingerprint(table: pa.Table, featurizer: PromptFeaturizer | None) -> ModelFingerprint:
    """The traces' fingerprint (file metadata, else the columns), with the featurizer's hashes."""
    import json

    raw = (table.schema.metadata or {}).get(META_FINGERPRINT)
    if raw is not None:
        fp = ModelFingerprint.from_dict(json.loads(raw))
    else:
        row = table.slice(0, 1).to_pylist()[0]
        fp = ModelFingerprint(
            model_id=row["model_id"],
            block_size=int(row["block_size"]),
            threshold=float(row["threshold"]),
            decoding=row["decoding"],
            mask_token_id=row.get("mask_token_id"),
            hidden_size=row.get("hidden_size"),
            max_new_tokens=int(row["output_budget"]),
            revision=row.get("model_revision"),
            dtype=row.get("model_dtype"),
            max_steps_per_block=row.get("max_steps_per_block"),
        )
    if featurizer is not None:
        fp = replace(
            fp,
            tokenizer_hash=fp.tokenizer_hash or featurizer.tokenizer_hash,
            chat_template_hash=fp.chat_template_hash or featurizer.chat_template_hash,
        )
    return fp


def check_featurizer(table: pa.Table, featurizer: PromptFeaturizer, sample: int = 64) -> None:
    """Warn when the featurizer does not reproduce the traces' features (wrong
    tokenizer/template)."""
    if "prompt" not in table.column_names:
        return
    rows = [
        r
        for r in table.slice(0, sample)
        .select(["prompt", "word_count", "newline_count", "prompt_tokens"])
        .to_pylist()
        if r["prompt"] is not None
    ]
    if not rows:
        return
    got = featurizer([r["prompt"] for r in rows])
    want = np.array(
        [[r["word_count"], r["newline_count"], r["prompt_tokens"]] for r in rows], dtype=np.float64
    )
    bad = int(np.sum(np.any(got != want, axis=1)))
    if bad:
        log.warning(
            "the tokenizer/chat template reproduce the traced features for only %d of %d prompts: "
            "raw-text admission estimates will be off; pass the served model's tokenizer and chat "
            "template",
            len(rows) - bad,
            len(rows),
        )
