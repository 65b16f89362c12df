"""Scheduler overhead per round and simulator wall time (DWISE paper: ranking + reorder 1.16 ms).

1. Per-round scheduling time (plan_round + update, median over rounds) of plain DWISE (the
   paper's; ``dwise-uncapped``) and of the library's default ``dwise`` (DWISE with the tail
   guard), with 1,024 residents and
   3,072 waiting requests, B = 128, k = 8, in two states: "churn" (2 requests finish and 2
   arrive every round, so the admission path ranks waiting ∪ resident every round) and "at cap"
   (1,024 residents, no admission possible). Peers measured in the same run on the same state:
   the same Scheduler with its argpartition selection swapped for a full ``np.lexsort`` (churn),
   and the obvious pure-Python implementation (one object per request, ``sorted`` by R every
   round; ranking and batch update only, no admission).
2. Simulator wall time of the 4,096-request paper-matched replay (burst) per policy, median of
   --reps repetitions.

    python benchmarks/scheduler.py [--rounds 300] [--reps 3]

Prints a table and writes benchmarks/results/scheduler.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from dwise_predict.atomic import write_json
from dwise_predict.runtime import (
    DWISE,
    Policy,
    RoundResult,
    Scheduler,
    make_policy,
    simulate,
    synthetic_workload,
)
from dwise_predict.tables import format_table

B, K, RESIDENTS, WAITING = 128, 8, 1024, 3072


def _populated(
    seed: int = 0, policy: Policy | None = None
) -> tuple[Scheduler, np.random.Generator, list[int]]:
    """A scheduler (plain DWISE unless ``policy``) holding 1,024 residents and 3,072 waiting."""
    rng = np.random.default_rng(seed)
    s = Scheduler(policy or DWISE(), slots=B, k=K, kv_pool_tokens=1 << 22, capacity=8192)
    nid = [0]

    def add(est: float) -> None:
        s.add_request(
            nid[0],
            int(rng.integers(1, 6)),
            est,
            prompt_tokens=150,
            output_budget=256,
            block_size=32,
        )
        nid[0] += 1

    for wave in range(K):  # each wave outranks the last, so all of it is admitted
        for _ in range(B):
            add(1000.0 - 100.0 * wave + float(rng.random()) * 10)
        p = s.plan_round()
        s.update(RoundResult(p.rows, np.zeros(p.rows.size, bool)))
    for _ in range(WAITING):
        add(float(rng.random()) * 1000.0)
    assert s.n_resident == RESIDENTS and s.n_waiting == WAITING
    return s, rng, nid


def bench_runtime(rounds: int, churn: bool, policy: Policy | None = None) -> float:
    s, rng, nid = _populated(policy=policy)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        p = s.plan_round()
        fin = np.zeros(p.rows.size, bool)
        if churn:
            fin[:2] = True
            fin &= ~p.prompt
        s.update(RoundResult(p.rows, fin))
        times.append(time.perf_counter() - t0)
        for _ in range(int(fin.sum())):
            s.add_request(
                nid[0],
                int(rng.integers(1, 6)),
                float(rng.random()) * 1000.0,
                prompt_tokens=150,
                output_budget=256,
                block_size=32,
            )
            nid[0] += 1
    return statistics.median(times) * 1e6


def _lexsort_smallest(keys: np.ndarray, tiebreak: np.ndarray, m: int) -> np.ndarray:
    return np.lexsort((tiebreak, keys))[:m]


def bench_full_sort(rounds: int) -> float:
    """Peer: the same Scheduler with its linear-time selection swapped for a full lexsort."""
    import dwise_predict.runtime.scheduler as sched_mod

    original = sched_mod.smallest
    sched_mod.smallest = _lexsort_smallest
    try:
        return bench_runtime(rounds, churn=True)
    finally:
        sched_mod.smallest = original


class _Req:
    __slots__ = ("P", "r", "seq", "resident")

    def __init__(self, P: int, r: float, seq: int, resident: bool) -> None:
        self.P, self.r, self.seq, self.resident = P, r, seq, resident


def bench_python_objects(rounds: int) -> float:
    """Peer: one Python object per request, ``sorted`` by (R, seq) every round."""
    rng = np.random.default_rng(0)
    reqs = [
        _Req(int(rng.integers(0, 6)), float(rng.random() * 1000), i, i < RESIDENTS)
        for i in range(RESIDENTS + WAITING)
    ]
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ranked = sorted(reqs, key=lambda q: (q.P + q.r, q.seq))
        run = [q for q in ranked if q.resident][:B]
        for q in run:
            if q.P:
                q.P -= 1
            else:
                q.r = max(q.r - 1.0, 0.0)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_replays(reps: int) -> dict[str, dict[str, float]]:
    w = synthetic_workload(seed=0)
    out = {}
    for name in ("fcfs", "mlfq", "sjf", "dwise", "oracle", "dws-sjf"):
        walls, rounds = [], 0
        for _ in range(reps):
            run = simulate(w, make_policy(name), arrivals="burst", slots=B, k=K)
            walls.append(run.wall_s)
            rounds = run.round_ms.size
        med = statistics.median(walls)
        out[name] = {"wall_s_median": med, "rounds": rounds, "us_per_round": med / rounds * 1e6}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "scheduler.json"
    )
    args = ap.parse_args()

    per_round = {
        "dwise_runtime_churn_us": bench_runtime(args.rounds, churn=True),
        "dwise_runtime_at_cap_us": bench_runtime(args.rounds, churn=False),
        # the library's default policy (DWISE with the tail guard) on the same states
        "default_tail_guard_churn_us": bench_runtime(args.rounds, True, make_policy("dwise")),
        "default_tail_guard_at_cap_us": bench_runtime(args.rounds, False, make_policy("dwise")),
        "peer_same_scheduler_full_lexsort_churn_us": bench_full_sort(args.rounds),
        "peer_python_objects_sorted_us": bench_python_objects(min(args.rounds, 100)),
        "paper_ranking_plus_reorder_us": 1160.0,
        "goal_us": 200.0,
    }
    print(
        f"Per-round scheduling time, {RESIDENTS} residents + {WAITING} "
        f"waiting, B={B}, k={K} (median of {args.rounds} rounds)"
    )
    print(
        format_table(
            ["implementation", "us/round"], [[k, f"{v:.1f}"] for k, v in per_round.items()]
        )
    )
    replays = bench_replays(args.reps)
    print(
        "\n"
        f"Simulator wall time, 4,096-request paper-matched replay, burst (median of {args.reps}; "
        "goal <= 5 s)"
    )
    print(
        format_table(
            ["policy", "wall_s", "rounds", "us/round"],
            [
                [k, f"{v['wall_s_median']:.2f}", v["rounds"], f"{v['us_per_round']:.1f}"]
                for k, v in replays.items()
            ],
        )
    )
    result = {
        "benchmark": "scheduler",
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
        },
        "config": {
            "slots": B,
            "k": K,
            "residents": RESIDENTS,
            "waiting": WAITING,
            "rounds": args.rounds,
            "reps": args.reps,
        },
        "per_round_us_median": per_round,
        "replay_4096_burst": replays,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result, sort_keys=False)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
