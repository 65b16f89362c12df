"""Traces -> bundle: train the selected predictors and save them with their manifest."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
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
from dwise_predict.predictors.dws import DWSPredictor
from dwise_predict.traces import META_FINGERPRINT, TRACE_SCHEMA_VERSION

from .admission import AdmissionConfig
from .dataset import TraceArrays, as_table, category_counts, trace_arrays
from .devices import DeviceConfig, is_global_zero
from .kind import TrainSettings, trainable, trainer_for
from .refinement import RefinementConfig
from .streaming import ARRAY_COLUMNS, ParquetSource

__all__ = ["TrainSettings", "parse_only", "train_bundle", "train_models"]

log = logging.getLogger(__name__)


def parse_only(only: str | Sequence[str] | None, *, cost_profile: bool = False) -> tuple[str, ...]:
    """The kinds to train: the comma list given, else every trainable kind (those priced in
    ms only when a cost profile is given)."""
    if only is None:
        return tuple(
            k for k in trainable() if cost_profile or not trainer_for(k).needs_cost_profile
        )
    names = tuple(
        s.strip() for s in (only.split(",") if isinstance(only, str) else only) if s.strip()
    )
    known = trainable()
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise ConfigError(f"--only takes a comma list of {known}, got {only!r}")
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
) -> tuple[list[BundleModule], dict[str, float], dict[str, Any]]:
    """Train the selected kinds on ``arrays`` with the trainers the registry names; returns
    the modules (none in a process that does not write), seconds per kind, and each kind's
    training facts for the manifest."""
    modules: list[BundleModule] = []
    seconds: dict[str, float] = {}
    facts: dict[str, Any] = {}
    for i, kind in enumerate(only, 1):
        # the DWS encoder and the refinement ensemble train for minutes on a CPU: say which
        # step runs, so a long quiet stretch does not read as a hang
        log.info("training %s (%d of %d) on %d requests", kind, i, len(only), arrays.n)
        t0 = time.perf_counter()
        part = trainer_for(kind).train(arrays, settings)
        seconds[kind] = time.perf_counter() - t0
        log.info("%s trained in %.1f s", kind, seconds[kind])
        if part.module is not None:
            modules.append(part.module)
        if part.info:
            facts[kind] = part.info
    return modules, seconds, facts


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
    configs: Mapping[str, Any] | None = None,
) -> Path:
    """Train the selected predictors on ``traces`` and write a bundle folder at ``out``.

    ``cost_profile`` (a ``CostProfile``, a file or a shipped name) prices the kinds that work
    in ms (DWS: its baselines and evaluation) and is stored in the bundle; with one and
    ``only=None``, those kinds are trained too.

    ``streaming`` reads the traces (a path or URI; ``filesystem`` a ``pyarrow.fs`` one) in
    record batches: the refinement predictor never holds more than a shuffle window of hidden
    states, while the admission model (and DWS) load their small columns whole (a few bytes
    per request). Under several processes (``devices``) every process trains and only global
    rank 0 writes the bundle; the others return ``out`` unwritten.

    Each kind is trained by the trainer its class names in the kind registry
    (:mod:`dwise_predict.bundle.modules`); ``configs`` maps a kind to its training config
    (the shipped kinds' also come as ``admission_config`` and the rest).
    """
    profile = None
    if cost_profile is not None:
        from dwise_predict.cost import CostProfile, load_cost_profile

        profile = (
            cost_profile
            if isinstance(cost_profile, CostProfile)
            else load_cost_profile(cost_profile)
        )
    names = parse_only(only, cost_profile=profile is not None)
    trainers = {k: trainer_for(k) for k in names}
    priced = [k for k, t in trainers.items() if t.needs_cost_profile]
    if priced and profile is None:
        raise TrainingError(
            f"training {', '.join(priced)} needs a cost profile (its baselines and evaluation "
            "are in ms): pass --cost-profile FILE (from `dwise-predict profile`)"
        )
    needs_hidden = any(t.needs_hidden for t in trainers.values())
    reads_text = any(t.reads_text for t in trainers.values())
    source: ParquetSource | None = None
    if streaming:
        if isinstance(traces, pa.Table):
            raise ConfigError(
                "streaming reads trace files; pass their path (or train the table in memory)"
            )
        source = ParquetSource(traces, filesystem=filesystem)
        small = [c for c in ARRAY_COLUMNS if c != "first_round_hidden"]
        if reads_text:  # prompt text and rounds per block, never hidden states
            small = [c for c in source.head(1).column_names if c != "first_round_hidden"]
        table = source.read_columns(small)
        arrays = trace_arrays(table)
        head = source.head(64)
    else:
        table = as_table(traces)
        arrays = trace_arrays(table, need_hidden=needs_hidden)
        head = table
    check_training_data(arrays, allow_single_category=allow_single_category)
    fingerprint = trace_fingerprint(head, featurizer)
    if featurizer is not None:
        check_featurizer(head, featurizer)
    if profile is not None:
        profile.check_compatible(fingerprint)
    shipped = {
        AdmissionModel.kind: admission_config,
        RefinementEnsemble.kind: refinement_config,
        DWSPredictor.kind: dws_config,
    }
    given = {k: c for k, c in shipped.items() if c is not None}
    with tempfile.TemporaryDirectory(prefix="dwise-train-") as tmp:
        settings = TrainSettings(
            seed=seed,
            featurizer=featurizer,
            configs={**given, **dict(configs or {})},
            source=source,
            devices=devices,
            cost_profile=profile,
            table=table,
            workdir=Path(tmp),
        )
        modules, seconds, facts = train_models(arrays, names, settings)
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
            **facts,
        }
        parts = [*modules, *([profile] if profile is not None else [])]
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
