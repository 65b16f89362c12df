"""Trace a workload with a dLLM adapter into Parquet shards: the function behind `dwise-predict
trace`.

Order of work is chosen so a bad input costs nothing: every prompt is checked and tokenized
(empty prompt, prompt over the model's context) *before* the output folder is touched or a
single round runs. Then requests are decoded (continuous batching for step adapters, the
model's own loop for native-loop adapters) and each finished request becomes one trace row.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.errors import ConfigError, TraceError, WorkloadError
from dwise_predict.features import prompt_counts
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.signals import terminate_as_interrupt
from dwise_predict.trace_writer import (
    DEFAULT_FLUSH_INTERVAL_S,
    DEFAULT_SHARD_SIZE,
    TraceWriter,
    existing_shards,
)
from dwise_predict.traces import TRACE_SCHEMA_VERSION

from .decoders import DEFAULT_EDIT_THRESHOLD, DEFAULT_MAX_POST_EDIT_STEPS
from .engine import DecodeConfig, DecodeRequest, RequestResult, validate_requests
from .plans import Adapter, DecodePlan, DecodeSettings, plan_decoding

DEFAULT_MAX_NEW_TOKENS = 256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TraceRecord:
    """The fields of a workload record the tracer reads."""

    id: str
    category: str
    source: str
    prompt: str


@dataclass
class TraceSummary:
    """What a tracing run did."""

    out_dir: Path
    fingerprint: ModelFingerprint
    traced: int
    skipped: int
    total: int
    shards: list[Path] = field(default_factory=list)
    wall_s: float = 0.0
    engine_rounds: int = 0
    request_rounds: int = 0
    denoising_rounds: int = 0
    write_s: float = 0.0  #: seconds spent writing shards, fsync included

    @property
    def requests_per_s(self) -> float:
        return self.traced / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rounds_per_s(self) -> float:
        """Batched forward rounds per second (one round = one forward of the whole batch)."""
        return self.engine_rounds / self.wall_s if self.wall_s > 0 else 0.0


def as_trace_record(obj: Any, where: str = "record") -> TraceRecord:
    """A workload record (``WorkloadRecord``, dict or anything with the fields) as a TraceRecord."""
    get = obj.get if isinstance(obj, dict) else (lambda k: getattr(obj, k, None))
    vals = {k: get(k) for k in ("id", "category", "source", "prompt")}
    for k, v in vals.items():
        if not isinstance(v, str):
            raise WorkloadError(f"{where}: field {k!r} must be a string, got {type(v).__name__}")
    if not vals["id"]:
        raise WorkloadError(f"{where}: empty request id; every request needs a unique id")
    return TraceRecord(**vals)  # type: ignore[arg-type]


def check_output(out_dir: str | Path, resume: bool) -> None:
    """Refuse early (before loading a model) an output folder holding shards without ``resume``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise TraceError(f"--out {out} is a file; pass a folder for the trace shards")
    shards = existing_shards(out)
    if shards and not resume:
        raise TraceError(
            f"{out} already holds {len(shards)} trace shard(s); pass --resume to continue that "
            "run, or choose another --out folder"
        )


def trace_workload(
    adapter: Adapter,
    records: Iterable[Any],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    threshold: float | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    block_size: int | None = None,
    limit: int | None = None,
    resume: bool = False,
    seed: int = 0,
    progress: Any = None,
    shard_size: int = DEFAULT_SHARD_SIZE,
    redact_prompts: bool = False,
    flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S,
    decoding: str | None = None,
    edit_threshold: float = DEFAULT_EDIT_THRESHOLD,
    max_post_edit_steps: int = DEFAULT_MAX_POST_EDIT_STEPS,
    block_alignment: str | None = None,
) -> TraceSummary:
    """Decode ``records`` with ``adapter`` and write one trace row per request under ``out_dir``.

    ``limit`` keeps the first N records of the workload (so an interrupted ``--limit N`` run is
    completed by the same command with ``resume=True``). ``progress`` is a tqdm-like bar
    (``update``, ``set_postfix``) or None. ``decoding`` picks the engine's decoder
    (``low_confidence``, the default, or ``joint_threshold`` with ``edit_threshold`` and
    ``max_post_edit_steps``); ``threshold`` defaults to that decoder's SGLang default. A
    native-loop model (DiffusionGemma) decodes with its own sampler unless ``decoding`` names an
    engine decoder (:mod:`.plans` has one function per adapter kind). ``block_alignment`` is the
    block layout (``absolute`` or ``response``, docs/tracing.md); None takes the adapter's
    default, how its model is served. It is recorded in the fingerprint, so a bundle trained on
    these traces is refused by a server of the other layout. Shards are written every
    ``shard_size`` requests and at least every ``flush_interval_s`` seconds (:class:`TraceWriter`);
    SIGTERM stops it like Ctrl-C (the finished requests are written, then ``Terminated`` raised).
    """
    recs = _select_records(records, limit)
    settings = DecodeSettings(
        max_new_tokens=max_new_tokens,
        threshold=threshold,
        block_size=block_size,
        block_alignment=block_alignment,
        decoding=decoding,
        edit_threshold=edit_threshold,
        max_post_edit_steps=max_post_edit_steps,
        batch_size=batch_size,
        seed=seed,
    )
    plan = plan_decoding(adapter, settings)
    requests = _checked_requests(adapter, recs, plan, out_dir, resume)
    make_row = partial(_row_of, {r.id: r for r in recs}, adapter, plan, seed, redact_prompts)
    open_writer = partial(
        TraceWriter,
        out_dir,
        plan.fingerprint,
        shard_size=shard_size,
        flush_interval_s=flush_interval_s,
        resume=resume,
    )
    return _decode_into(open_writer, out_dir, plan, recs, requests, make_row, progress)


def _row_of(
    by_id: dict[str, TraceRecord],
    adapter: Adapter,
    plan: DecodePlan,
    seed: int,
    redact_prompts: bool,
    res: RequestResult,
) -> dict[str, Any]:
    """The trace row of a finished request (:func:`build_row` with its workload record)."""
    rec = by_id[res.request_id]
    return build_row(res, rec, adapter, plan.config, plan.fingerprint, seed, redact_prompts)


def _select_records(records: Iterable[Any], limit: int | None) -> list[TraceRecord]:
    """The workload's first ``limit`` records (all without one), each checked."""
    if limit is not None and limit < 0:
        raise ConfigError(f"--limit must be >= 0, got {limit}")
    recs = [as_trace_record(r, f"workload record #{i}") for i, r in enumerate(records)]
    return recs if limit is None else recs[:limit]


def _checked_requests(
    adapter: Adapter, recs: list[TraceRecord], plan: DecodePlan, out_dir: str | Path, resume: bool
) -> list[DecodeRequest]:
    """Every prompt checked (not empty, within the model's context) and tokenized, then the
    output folder checked: all before anything is written."""
    for r in recs:
        if not r.prompt.strip():
            raise WorkloadError(f"request {r.id!r} has an empty prompt; drop it from the workload")
    requests = [DecodeRequest(r.id, adapter.encode_prompt(r.prompt)) for r in recs]
    validate_requests(requests, plan.config, adapter.info.max_context)
    check_output(out_dir, resume)
    return requests


def _decode_into(
    open_writer: Callable[[], TraceWriter],
    out_dir: str | Path,
    plan: DecodePlan,
    recs: list[TraceRecord],
    requests: list[DecodeRequest],
    make_row: Callable[[RequestResult], dict[str, Any]],
    progress: Any,
) -> TraceSummary:
    """Decode the requests ``out_dir`` does not hold yet, shortest prompts first, and write a
    row for each through the writer ``open_writer`` opens; SIGTERM stops it like Ctrl-C."""
    summary = TraceSummary(
        out_dir=Path(out_dir), fingerprint=plan.fingerprint, traced=0, skipped=0, total=len(recs)
    )
    with terminate_as_interrupt(), open_writer() as writer:
        check_reused_ids(recs, writer.done_ids, out_dir)
        todo = [q for q in requests if q.request_id not in writer.done_ids]
        # Requests of similar prompt length share a batch: a row attends only its own cache, but the
        # batch is padded to its longest cache, so one long-context prompt would slow 15 short ones.
        # Results do not depend on batching (tests/test_tracing_engine.py), only the speed does.
        todo.sort(key=lambda q: len(q.prompt_ids))
        summary.skipped = len(requests) - len(todo)
        if progress is not None and summary.skipped:
            progress.update(summary.skipped)
        _write_results(plan, todo, make_row, writer, summary, progress)
    summary.shards = list(writer.written)
    summary.write_s = writer.write_s
    return summary


def _write_results(
    plan: DecodePlan,
    todo: list[DecodeRequest],
    make_row: Callable[[RequestResult], dict[str, Any]],
    writer: TraceWriter,
    summary: TraceSummary,
    progress: Any,
) -> None:
    """Run the plan's request loop, writing each result as it finishes and counting rounds."""
    t0 = time.perf_counter()

    def on_round(n_rows: int, _secs: float) -> None:
        summary.engine_rounds += 1
        summary.request_rounds += n_rows

    results = plan.run(todo, on_round)
    try:
        for res in results:
            if plan.counts_rounds_per_result:
                summary.engine_rounds += len(res.round_wall_ms)
                summary.request_rounds += len(res.round_wall_ms)
            writer.add(make_row(res))
            log.debug("traced %s", res.request_id)
            summary.traced += 1
            summary.denoising_rounds += res.total_rounds
            if progress is not None:
                el = max(time.perf_counter() - t0, 1e-9)
                progress.update(1)
                progress.set_postfix(
                    req_s=f"{summary.traced / el:.2f}",
                    rounds_s=f"{summary.engine_rounds / el:.1f}",
                    refresh=False,
                )
    finally:
        summary.wall_s = time.perf_counter() - t0
        results.close()  # an early stop frees the loop's seats and caches


def check_reused_ids(recs: list[TraceRecord], done: dict[str, str], out_dir: str | Path) -> None:
    """Refuse a workload whose ids are already in the folder for other prompts.

    Resume skips a request whose id is traced, so a second workload reusing ids (``req-0``
    ...) for other prompts would silently lose its own requests.
    """
    for r in recs:
        sha = done.get(r.id)
        if sha is not None and sha != hashlib.sha256(r.prompt.encode("utf-8")).hexdigest():
            raise WorkloadError(
                f"request id {r.id!r} is already traced in {out_dir} for another prompt; request "
                "ids must be unique across every workload written into one folder. Trace this "
                "workload into its own --out folder, or give its requests other ids"
            )


def build_row(
    res: RequestResult,
    rec: TraceRecord,
    adapter: Adapter,
    config: DecodeConfig,
    fingerprint: ModelFingerprint,
    seed: int,
    redact_prompts: bool = False,
) -> dict[str, Any]:
    """One trace row of the current schema from a decoded request."""
    info = adapter.info
    content = res.content_ids(info.eos_token_ids)
    hidden = res.first_round_hidden
    if hidden is not None and not np.all(np.isfinite(hidden)):
        raise TraceError(
            f"request {rec.id!r}: the first-round hidden state has NaN/inf; the model diverged "
            "(try float32 weights)"
        )
    walls = [float(w) for w in res.round_wall_ms]
    if any(not math.isfinite(w) for w in walls):
        raise TraceError(f"request {rec.id!r}: non-finite round wall time")
    return {
        "schema_version": TRACE_SCHEMA_VERSION,
        "request_id": rec.id,
        "category": rec.category,
        "source": rec.source,
        "prompt": None if redact_prompts else rec.prompt,
        "prompt_sha256": hashlib.sha256(rec.prompt.encode("utf-8")).hexdigest(),
        "prompt_tokens": res.prompt_tokens,
        **prompt_counts(rec.prompt),
        "prompt_blocks": res.prompt_blocks,
        "output_budget": config.max_new_tokens,
        "block_size": config.block_size,
        "decoding": fingerprint.decoding,
        "threshold": config.threshold,
        "max_steps_per_block": int(fingerprint.max_steps_per_block or config.max_steps_per_block),
        "seed": int(seed),
        "output_tokens": len(content),
        "output_text": adapter.decode(content),
        "output_blocks": res.output_blocks,
        "rounds_per_block": [int(r) for r in res.rounds_per_block],
        "total_rounds": res.total_rounds,
        "finished_eos": bool(res.finished_eos),
        "hit_budget": bool(res.hit_budget),
        "first_round_hidden": None if hidden is None else hidden.astype(np.float32).tolist(),
        "round_wall_ms": walls,
        "model_id": info.model_id,
        "model_revision": info.revision,
        "model_dtype": info.dtype,
        "mask_token_id": info.mask_token_id,
        "hidden_size": info.hidden_size,
    }
