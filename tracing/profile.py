"""Profile a dLLM deployment: serve requests one at a time and time every phase.

Why one at a time: a batched round's time depends on what else shares the batch, so it
cannot say what *this* request costs. Served alone, a request's prefill blocks, each
denoising step (b, s) and each block's commit/KV refresh are timed separately (the engine's
``split_commit`` mode), which is what the cost model's alpha, K/delta and beta price.
A few warm-up requests run first and are not recorded (first calls allocate caches).

Why a speed probe: on a shared machine the same forward's time moves by 10-40% with what the
other cores run, even on the thread's own CPU clock (caches, memory bandwidth, the host's
scheduling of a VM's cores), and that drift, not the cost form, was most of the profile's error.
Between requests the profiler times a fixed forward (one masked block over an empty cache,
``probe_reps`` times); each request records the mean of the probes before and after it
(``ProfiledRequest.probe_ms``), and the fit prices every request at the run's median speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from dwise_predict.trainers.cost_profile import ProfiledRequest, hardware_description

from dwise_predict.errors import ConfigError, WorkloadError

from .adapters.base import BlockBatch
from .decoders import DEFAULT_THRESHOLDS, LOW_CONFIDENCE
from .engine import DecodeConfig, DecodeRequest, decode, validate_requests
from .runner import DEFAULT_MAX_NEW_TOKENS, as_trace_record

#: The clocks a profile can be timed with (seconds).
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}


@dataclass
class ProfileRun:
    """What a profiling run measured (in workload order)."""

    requests: list[ProfiledRequest]
    request_ids: list[str]
    prompt_tokens: list[int]
    step_ms: list[list[float]]
    fingerprint: dict[str, Any]
    hardware: str
    block_size: int
    wall_s: float = 0.0
    warmup: list[str] = field(default_factory=list)


def profile_workload(
    adapter: Any,
    records: Iterable[Any],
    *,
    limit: int | None = None,
    threshold: float | None = None,
    block_size: int | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    warmup: int = 3,
    clock: str = "wall",
    progress: Any = None,
    probe_reps: int = 3,
) -> ProfileRun:
    """Serve ``records`` (the first ``limit``) one at a time with ``adapter``, timing phases.

    ``clock="wall"`` times phases by wall clock (what a server sees); ``clock="cpu"`` by the
    calling thread's CPU time, which other processes on a shared machine cannot inflate
    (meaningful only when the model computes in that thread: torch with one thread).
    ``probe_reps`` forwards make each speed probe between requests (module docstring);
    0 measures no probe (``probe_ms`` stays None and the fit takes the times as measured)."""
    if clock not in CLOCKS:
        raise ConfigError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    tick = CLOCKS[clock]
    if getattr(adapter, "native_loop", False):
        raise ConfigError(
            f"{adapter.info.model_id} decodes in its own loop; profiling needs a "
            "step adapter (tiny-bd, hf-mask-predict) whose phases can be timed"
        )
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit must be >= 1, got {limit}")
    if probe_reps < 0:
        raise ConfigError(f"--speed-probe must be >= 0, got {probe_reps}")
    recs = [as_trace_record(r, f"workload record #{i}") for i, r in enumerate(records)]
    recs = recs[:limit] if limit is not None else recs
    for r in recs:
        if not r.prompt.strip():
            raise WorkloadError(f"request {r.id!r} has an empty prompt; drop it from the workload")
    bs = adapter.resolve_block_size(block_size)
    thr = DEFAULT_THRESHOLDS[LOW_CONFIDENCE] if threshold is None else float(threshold)
    # the layout the model is served in, so m (prompt blocks) means what a server's m means
    alignment = adapter.resolve_block_alignment(None)
    config = DecodeConfig(
        block_size=bs, threshold=thr, max_new_tokens=max_new_tokens, block_alignment=alignment
    )
    fingerprint = adapter.fingerprint(
        block_size=bs,
        threshold=thr,
        max_new_tokens=max_new_tokens,
        decoding=LOW_CONFIDENCE,
        max_steps_per_block=config.max_steps_per_block,
        block_alignment=alignment,
    ).to_dict()
    requests = [DecodeRequest(r.id, adapter.encode_prompt(r.prompt)) for r in recs]
    validate_requests(requests, config, adapter.info.max_context)
    warm = [DecodeRequest(f"warmup-{q.request_id}", q.prompt_ids) for q in requests[:warmup]]
    for _ in decode(adapter, warm, config, batch_size=1, split_commit=True, clock=tick):
        pass
    hardware = hardware_description() + f", clock={clock}"
    run = ProfileRun([], [], [], [], fingerprint, hardware, bs, warmup=[q.request_id for q in warm])
    t0 = time.perf_counter()
    probe = _speed_probe(adapter, bs, probe_reps, tick) if probe_reps else None
    if probe:
        probe()  # its first call allocates, as a request's does: not a speed
    before = probe() if probe else None
    for q in requests:
        (res,) = decode(adapter, [q], config, batch_size=1, split_commit=True, clock=tick)
        after = probe() if probe else None
        m = res.prompt_blocks
        walls = [float(w) for w in res.round_wall_ms]
        run.requests.append(
            ProfiledRequest(
                prompt_blocks=m,
                rounds_per_block=tuple(int(r) for r in res.rounds_per_block),
                prefill_ms=sum(walls[:m]),
                denoise_ms=sum(walls[m:]),
                refresh_ms=float(sum(res.refresh_wall_ms)),
                probe_ms=None if before is None or after is None else (before + after) / 2,
            )
        )
        before = after
        run.request_ids.append(res.request_id)
        run.prompt_tokens.append(res.prompt_tokens)
        run.step_ms.append(walls[m:])
        if progress is not None:
            progress.update(1)
    run.wall_s = time.perf_counter() - t0
    return run


def _speed_probe(
    adapter: Any, block_size: int, reps: int, tick: Callable[[], float]
) -> Callable[[], float]:
    """A function timing the same work every call: ``reps`` forwards of one fully masked block
    over an empty cache (ms, mean), which says how fast the machine runs right now."""
    mask_id = adapter.info.mask_token_id
    if mask_id is None:
        raise ConfigError(f"{adapter.info.model_id} has no mask token; it cannot be profiled")
    batch = BlockBatch(
        slots=[0],
        input_ids=torch.full((1, block_size), int(mask_id), dtype=torch.long),
        position_ids=torch.arange(block_size, dtype=torch.long)[None],
        n_valid=[block_size],
        commit=[0],  # reads the (empty) cache, writes nothing
    )

    def probe() -> float:
        adapter.open_slots(1, block_size)
        total = 0.0
        with torch.inference_mode():
            for _ in range(reps):
                t0 = tick()
                out = adapter.forward(batch)
                float(out.logits[0, 0, 0])  # waits for the device, where the model runs on one
                total += tick() - t0
        return 1e3 * total / reps

    return probe
