"""How much can dispatch across replicas gain? Fleet replays against one pooled server.

R replicas, each a core scheduler under the same policy (plain DWISE), run in lockstep behind
each dispatch method of :mod:`dwise_predict.runtime.fleet` on the paper-matched synthetic
workload, under Poisson arrivals at 0.8x and 1.1x the fleet's capacity (R·B blocks a round
over the workload's mean work) and a burst. Beside them, the *pooled* server: one scheduler
with R·B slots, which can do whatever any dispatcher can and also move requests between
replicas at no cost, so its mean bounds what a dispatch method can reach.

    .venv/bin/python benchmarks/fleet_dispatch.py                # 4,096 requests on 4 x B=16
    .venv/bin/python benchmarks/fleet_dispatch.py --requests 100000 --fleets 32x128 \
        --loads 1.1 --out benchmarks/results/fleet_dispatch_at_scale.json
    .venv/bin/python benchmarks/fleet_dispatch.py --requests 100000 --fleets 32x128 \
        --loads 1.1 --policy dwise --out benchmarks/results/fleet_dispatch_at_scale_default.json

Prints a table per fleet and load, writes ``benchmarks/results/fleet_dispatch.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from dwise_predict.runtime import make_policy, simulate, synthetic_workload
from dwise_predict.runtime.fleet import DISPATCH_METHODS, compare_dispatch, fleet_table
from dwise_predict.runtime.roundtime import RoundTimeModel
from dwise_predict.runtime.simulator import DEFAULT_KV_POOL_TOKENS

ROOT = Path(__file__).resolve().parents[1]
ONE_MS = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)


def run_fleet(
    n: int,
    replicas: int,
    slots: int,
    loads: list[float],
    seed: int,
    policy_name: str = "dwise-uncapped",
) -> dict:
    w = synthetic_workload("paper-llada2.1-mini", n=n, seed=seed)
    policy = make_policy(policy_name)
    capacity = replicas * slots / float(np.mean(w.prompt_blocks + w.total_rounds)) * 1000.0
    out: dict = {"replicas": replicas, "slots": slots, "requests": n, "regimes": {}}
    for load in loads:
        arrival = "burst" if load == 0 else f"poisson:{load * capacity:.6g}"
        regime = "burst" if load == 0 else f"poisson-{load:g}x"
        t0 = time.perf_counter()
        runs = compare_dispatch(
            w, [policy], replicas=replicas, arrivals=arrival, slots=slots, seed=seed
        )
        pooled = simulate(
            w,
            policy,
            arrivals=arrival,
            slots=replicas * slots,
            kv_pool_tokens=replicas * DEFAULT_KV_POOL_TOKENS,  # every replica's pool, as one
            round_time=ONE_MS,
        )
        lat = (pooled.finish_time - pooled.arrival_time) * 1000.0
        row = {r.method: r.summary() for r in runs}
        row["pooled"] = {
            "mean_completion_rounds": float(lat.mean()),
            "p99_completion_rounds": float(np.percentile(lat, 99)),
        }
        best_sglang = min(row[m]["mean_completion_rounds"] for m in DISPATCH_METHODS[:3])
        row["headroom_vs_best_sglang"] = best_sglang / row["pooled"]["mean_completion_rounds"]
        out["regimes"][regime] = row
        print(f"\n{replicas} replicas x B={slots}, {n} requests, {regime} ({arrival})")
        print(fleet_table(runs))
        print(
            f"pooled server (R·B slots): mean {row['pooled']['mean_completion_rounds']:.1f}, "
            f"p99 {row['pooled']['p99_completion_rounds']:.1f}; best SGLang method / pooled = "
            f"{row['headroom_vs_best_sglang']:.3f}x  ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=4096)
    p.add_argument("--fleets", default="4x16", help="RxB,... (replicas x slots)")
    p.add_argument("--loads", default="0,0.8,1.1", help="0 = burst; else x fleet capacity")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--policy",
        default="dwise-uncapped",
        help="every replica's policy: dwise-uncapped (the paper's DWISE) or dwise (the "
        "plugin's default, with the tail guard)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/fleet_dispatch.json")
    args = p.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    fleets = [tuple(int(v) for v in f.split("x")) for f in args.fleets.split(",")]
    result = {
        "workload": "paper-llada2.1-mini (synthetic)",
        "policy": f"{args.policy} on every replica",
        "fleets": [
            run_fleet(args.requests, r, b, loads, args.seed, args.policy) for r, b in fleets
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
