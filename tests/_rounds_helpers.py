"""Small requests served in the simulator in rounds: every round costs 1 ms, so an arrival at j
ms means "before round j" and a completion in ms is a count of rounds."""

from __future__ import annotations

import numpy as np

from dwise_predict.runtime import Arrivals, RoundTimeModel, SimRequest, Workload, simulate

ONE_MS_ROUNDS = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)


def request(
    rid: str, prompt_blocks: int, rounds: tuple[int, ...], estimate: float | None = None
) -> SimRequest:
    """A request of 32-token blocks whose admission estimate is its true total (or
    ``estimate``) and whose refined estimate is exact after the first round."""
    return SimRequest(
        rid,
        prompt_blocks,
        max(1, prompt_blocks * 32),
        rounds,
        output_budget=32 * len(rounds),
        block_size=32,
        admission_estimate=float(sum(rounds)) if estimate is None else estimate,
        refined_estimate=float(sum(rounds) - 1),
    )


def serve(reqs: list[SimRequest], arrive: list[int], policy, slots: int) -> np.ndarray:
    """Completion rounds of ``reqs`` (arrival round to the round it finished in, inclusive)."""
    wl = Workload.from_requests(reqs)
    arrivals = Arrivals(np.arange(wl.n, dtype=np.int64), np.asarray(arrive, dtype=float) / 1e3)
    run = simulate(wl, policy, arrivals=arrivals, slots=slots, k=8, round_time=ONE_MS_ROUNDS)
    return np.rint((run.finish_time - run.arrival_time) * 1e3).astype(int)
