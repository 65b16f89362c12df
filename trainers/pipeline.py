"""Traces -> bundle: train the selected predictors and save them with their manifest."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle import save_bundle
from dwise_predict.bundle.modules import BundleModule
from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.traces import META_FINGERPRINT, TRACE_SCHEMA_VERSION

from .dataset import TraceArrays, as_table, category_counts, trace_arrays
from .devices import DeviceConfig, is_global_zero
from .kind import KindTrainer, TrainSettings, check_configs, trainable, trainer_for
from .streaming import ARRAY_COLUMNS, ParquetSource

__all__ = ["TrainSettings", "parse_only", "train_bundle", "train_models"]

log = logging.getLogger(__name__)


def parse_only(only: str | Sequence[str] | None, *, cost_profile: bool = False) -> tuple[str, ...]:
    """The kinds to train: the comma list given, else every trainable kind (those priced in
    ms only when a cost profile is given; the baselines, ``only_when_named``, never)."""
    if only is None:
        return tuple(
            k
            for k in trainable()
            if (cost_profile or not trainer_for(k).needs_cost_profile)
            and not trainer_for(k).only_when_named
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


@dataclass(frozen=True)
class TrainingData:
    """The traces as the selected trainers need them: ``arrays`` (hidden states only when a
    trainer reads them), ``table`` (the columns read, prompt text included), ``head`` (rows
    the fingerprint and the featurizer check read) and the streamed ``source``, if any."""

    arrays: TraceArrays
    table: pa.Table
    head: pa.Table
    source: ParquetSource | None = None


def train_bundle(
    traces: str | Path | pa.Table,
    out: str | Path,
    *,
    only: str | Sequence[str] | None = None,
    seed: int = 0,
    featurizer: PromptFeaturizer | None = None,
    configs: Mapping[str, object] | None = None,
    allow_single_category: bool = False,
    overwrite: bool = False,
    name: str | None = None,
    cost_profile: CostProfile | str | Path | None = None,
    devices: DeviceConfig | None = None,
    streaming: bool = False,
    filesystem: Any = None,
) -> Path:
    """Train the selected predictors on ``traces`` and write a bundle folder at ``out``.

    Each kind is trained by the trainer its class names in the kind registry
    (:mod:`dwise_predict.bundle.modules`); ``configs`` maps a kind to its training config, of
    the class its trainer declares (``configs={RefinementEnsemble.kind: RefinementConfig(...)}``;
    absent: the kind's default). ``cost_profile`` (a ``CostProfile``, a file or a shipped name)
    prices the kinds that work in ms (DWS) and is stored in the bundle; with one and
    ``only=None``, those kinds are trained too.

    In memory, the rows are put in :func:`canonical_order` first, so the same requests give the
    same bundle whatever order or sharding they were written in. ``streaming`` reads the traces
    (a path or URI; ``filesystem`` a ``pyarrow.fs`` one) in record batches, in file order: the
    refinement predictor never holds more than a shuffle window of hidden states, while the
    admission model (and DWS) load their small columns whole. Under several
    processes (``devices``) every process trains and only global rank 0 writes the bundle; the
    others return ``out`` unwritten.
    """
    profile = _load_profile(cost_profile)
    names = parse_only(only, cost_profile=profile is not None)
    check_configs(dict(configs or {}))
    trainers = _trainers(names, priced=profile is not None)
    data = read_training_data(traces, trainers.values(), streaming=streaming, filesystem=filesystem)
    check_training_data(data.arrays, allow_single_category=allow_single_category)
    fingerprint = _checked_fingerprint(data.head, featurizer, profile)
    with tempfile.TemporaryDirectory(prefix="dwise-train-") as tmp:
        settings = TrainSettings(
            seed=seed,
            featurizer=featurizer,
            configs=dict(configs or {}),
            source=data.source,
            devices=devices,
            cost_profile=profile,
            table=data.table,
            workdir=Path(tmp),
        )
        modules, seconds, facts = train_models(data.arrays, names, settings)
        if not is_global_zero():
            return Path(out)  # the other processes of a multi-process run: rank 0 writes
        training = training_record(data.arrays, names, seed, seconds, facts)
        parts = [*modules, *([profile] if profile is not None else [])]
        return save_bundle(
            out, parts, fingerprint=fingerprint, training=training, overwrite=overwrite, name=name
        )


def _load_profile(cost_profile: CostProfile | str | Path | None) -> CostProfile | None:
    """The cost profile given (a ``CostProfile``, a file or a shipped name), loaded."""
    if cost_profile is None or isinstance(cost_profile, CostProfile):
        return cost_profile
    return load_cost_profile(cost_profile)


def _trainers(names: Sequence[str], *, priced: bool) -> dict[str, KindTrainer]:
    """The trainers of ``names``; refused when a kind priced in ms has no cost profile."""
    trainers = {k: trainer_for(k) for k in names}
    needs_profile = [k for k, t in trainers.items() if t.needs_cost_profile]
    if needs_profile and not priced:
        raise TrainingError(
            f"training {', '.join(needs_profile)} needs a cost profile (its baselines and "
            "evaluation are in ms): pass --cost-profile FILE (from `dwise-predict profile`)"
        )
    return trainers


def read_training_data(
    traces: str | Path | pa.Table,
    trainers: Iterable[KindTrainer],
    *,
    streaming: bool = False,
    filesystem: Any = None,
) -> TrainingData:
    """Read what ``trainers`` need of ``traces``: hidden states only when one reads them; when
    streaming, the small columns whole (prompt text too when one reads text) and the hidden
    states left to the streamed source."""
    trainers = list(trainers)
    needs_hidden = any(t.needs_hidden for t in trainers)
    reads_text = any(t.reads_text for t in trainers)
    if not streaming:
        table = canonical_order(as_table(traces))
        return TrainingData(trace_arrays(table, need_hidden=needs_hidden), table, table)
    if isinstance(traces, pa.Table):
        raise ConfigError(
            "streaming reads trace files; pass their path (or train the table in memory)"
        )
    source = ParquetSource(traces, filesystem=filesystem)
    small = [c for c in ARRAY_COLUMNS if c != "first_round_hidden"]
    if reads_text:  # prompt text and rounds per block, never hidden states
        small = [c for c in source.head(1).column_names if c != "first_round_hidden"]
    table = source.read_columns(small)
    return TrainingData(trace_arrays(table), table, source.head(64), source)


def canonical_order(table: pa.Table) -> pa.Table:
    """``table`` sorted by request id (stable): the trainers batch and split by row position, so
    without this the same requests written in another order (finish order, several writers,
    resumed or compacted shards) would train another bundle."""
    import pyarrow.compute as pc

    order = pc.sort_indices(table, sort_keys=[("request_id", "ascending")])
    return table.take(order)


def _checked_fingerprint(
    head: pa.Table, featurizer: PromptFeaturizer | None, profile: CostProfile | None
) -> ModelFingerprint:
    """The traces' fingerprint, after checking the featurizer reproduces their features (a
    warning) and the cost profile was measured for the same dLLM (refused)."""
    fingerprint = trace_fingerprint(head, featurizer)
    if featurizer is not None:
        check_featurizer(head, featurizer)
    if profile is not None:
        profile.check_compatible(fingerprint)
    return fingerprint


def training_record(
    arrays: TraceArrays,
    names: Sequence[str],
    seed: int,
    seconds: Mapping[str, float],
    facts: Mapping[str, Any],
) -> dict[str, Any]:
    """The manifest's ``training``: what the bundle was trained on, and each kind's facts."""
    return {
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
