"""Per-policy figures from a :class:`~.simulator.SimulationRun` (metrics as defined in
docs/concepts.md).

Latency = finish − arrival; TTFT = time the first output block is committed − arrival (the
paper's dLLM definition: prefill alone yields no token); throughput = requests / makespan,
makespan = last finish − first arrival. Round composition: a prefill-only round carries only
prompt blocks; filled slots per round and idle slots (%) are against B.
"""

from __future__ import annotations

import numpy as np

from .simulator import SimulationRun


def summarize(run: SimulationRun) -> dict[str, float]:
    lat = run.finish_time - run.arrival_time
    ttft = run.first_block_time - run.arrival_time
    n = lat.size
    rounds = run.round_ms.size
    makespan = float(np.nanmax(run.finish_time) - run.arrival_time.min())
    prefill_only = (run.round_prompt == run.round_filled) & (run.round_filled > 0)
    total_ms = float(run.round_ms.sum())
    sched_us = run.round_sched_s * 1e6
    return {
        "requests": float(n),
        "mean_latency": float(lat.mean()),
        "p50_latency": float(np.percentile(lat, 50)),
        "p99_latency": float(np.percentile(lat, 99)),
        "mean_ttft": float(ttft.mean()),
        "p50_ttft": float(np.percentile(ttft, 50)),
        "p99_ttft": float(np.percentile(ttft, 99)),
        "throughput": float(n / makespan) if makespan > 0 else float("inf"),
        "makespan": makespan,
        "rounds": float(rounds),
        "prefill_only_round_frac": float(prefill_only.mean()) if rounds else 0.0,
        "prefill_only_time_frac": float(run.round_ms[prefill_only].sum() / total_ms)
        if total_ms
        else 0.0,
        "filled_slots_per_round": float(run.round_filled.mean()) if rounds else 0.0,
        "filled_slots_per_prefill_only_round": float(run.round_filled[prefill_only].mean())
        if prefill_only.any()
        else 0.0,
        "idle_slots_pct": float(100.0 * (1.0 - run.round_filled.mean() / run.slots))
        if rounds
        else 100.0,
        "median_round_ms": float(np.median(run.round_ms)) if rounds else 0.0,
        "preemptions_per_request": float(run.preemptions / n),
        "refinements_per_request": float(run.refinements / n),
        "scheduler_us_per_round_mean": float(sched_us.mean()) if rounds else 0.0,
        "scheduler_us_per_round_p50": float(np.median(sched_us)) if rounds else 0.0,
        "simulator_wall_s": float(run.wall_s),
    }


def per_category(run: SimulationRun) -> dict[str, dict[str, float]]:
    """Mean/p99/max latency per request category (the paper's Table 16 view)."""
    lat = run.finish_time - run.arrival_time
    out: dict[str, dict[str, float]] = {}
    for c in sorted(set(run.categories.tolist())):
        m = run.categories == c
        out[str(c)] = {
            "requests": float(m.sum()),
            "mean_latency": float(lat[m].mean()),
            "p99_latency": float(np.percentile(lat[m], 99)),
            "max_latency": float(lat[m].max()),
        }
    return out
