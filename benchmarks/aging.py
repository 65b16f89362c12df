"""Tails under overload: what each anti-starvation rule of DWISE buys, and what it costs.

Under sustained overload SRPT (DWISE with aging = 0, the paper's setting) starves long requests:
its mean beats FCFS several times over while its p99 ends up above FCFS's. This sweep replays
the paper-matched synthetic workload (``paper-llada2.1-mini``, the one the 100,000-request
measurement of issue 42 used) under ``burst+poisson:16``, more than a mixed-phase FCFS server
can serve (its throughput is printed), at each --sizes, B = 128, k = 8, under:

* ``fcfs-mixed`` (the peer: the goal is set against it) and ``dwise`` with no rule;
* ``aging`` = a: linear aging, the key drops by a per round spent without running;
* ``cap-age`` = C: ``starvation_cap`` with the ``age`` clock (rounds since arrival);
* ``cap-waited`` = C: the same with the ``waited`` clock (rounds without running);
* ``slack`` = c: ``starvation_slack``, a deadline per request of c times the rounds FCFS would
  take to clear the work live at its arrival (scale-free: the same c at every size);
* ``cap-projected`` = C and ``slack-projected`` = c: the same on the ``projected`` clock (age
  plus the estimated work left), which promotes a request in time to finish by the deadline
  instead of once the deadline has passed;
* ``oracle-cap-projected`` = C (smaller sizes only): the oracle under the projected cap, with
  the true work: what the rule could do with perfect knowledge.

Caps are swept as fractions of fcfs-mixed's makespan in rounds at that size (the rounds a
workload takes grow with it, so a cap in rounds does not carry from one size to another), and
recorded in rounds too.

Per setting: mean, p50, p99 and max latency (s); the mean gain over fcfs-mixed G; the share of
dwise's gain it keeps, (G - 1) / (G0 - 1) with G0 = plain dwise's gain (the excess over
fcfs-mixed: 1 = all of it, 0 = none), and G / G0 beside it; the p99 and max ratios to
fcfs-mixed. The goal (issue 42): p99 ratio <= 1 while keeping >= 90% of the gain.

    .venv/bin/python benchmarks/aging.py [--sizes 4096,100000] [--plot docs/img/aging-tradeoff.png]

Prints a table per size, writes benchmarks/results/aging.json (with the command) and the plot
(gain kept against p99 ratio, one point per setting, the goal region shaded). Wall time on a
busy 2-core machine: about 1 minute at 4,096 requests, 15 at 100,000.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.atomic import write_json
from dwise_predict.runtime import make_policy, simulate, synthetic_workload
from dwise_predict.tables import format_table

AGING = (0.05, 0.25, 1.0)
CAP_FRACTIONS = (0.3, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)
WAITED_FRACTIONS = (0.45, 0.55)
SLACKS = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25)
PROJECTED_FRACTIONS = (0.55, 0.6, 0.65, 0.7, 0.75, 0.8)
PROJECTED_SLACKS = (0.8, 1.0, 1.2, 1.5)
#: at large sizes (a minute a run) only the band where the trade-off turns
QUICK_FRACTIONS = (0.5, 0.55, 0.58, 0.6, 0.62, 0.65)
QUICK_PROJECTED_FRACTIONS = (0.65, 0.7, 0.75)
GOAL_KEPT = 0.9


def _run(workload: Any, policy: Any, arrival: str, slots: int, k: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    run = simulate(workload, policy, arrivals=arrival, slots=slots, k=k, seed=0)
    lat = run.finish_time - run.arrival_time
    return {
        "mean_s": float(np.mean(lat)),
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "max_s": float(np.max(lat)),
        "rounds": int(run.round_ms.size),
        "makespan_s": float(np.max(run.finish_time)),
        "finished": int(np.count_nonzero(np.isfinite(run.finish_time))),
        "wall_s": round(time.perf_counter() - t0, 1),
    }


def sweep(n: int, arrival: str, slots: int, k: int, quick: bool) -> dict[str, Any]:
    w = synthetic_workload("paper-llada2.1-mini", n=n, seed=0)
    base = _run(w, make_policy("fcfs-mixed"), arrival, slots, k)
    plain = _run(w, make_policy("dwise-uncapped"), arrival, slots, k)  # the paper's DWISE
    g0 = base["mean_s"] / plain["mean_s"]
    settings: list[tuple[str, float, dict[str, Any]]] = [("none", 0, {})]
    settings += [("aging", a, {"aging": a}) for a in AGING]
    fracs = QUICK_FRACTIONS if quick else CAP_FRACTIONS
    settings += [("cap-age", f, {"starvation_cap": round(f * base["rounds"])}) for f in fracs]
    settings += [
        (
            "cap-waited",
            f,
            {"starvation_cap": round(f * base["rounds"]), "starvation_clock": "waited"},
        )
        for f in (() if quick else WAITED_FRACTIONS)
    ]
    settings += [("slack", c, {"starvation_slack": c}) for c in SLACKS]
    projected = {"starvation_clock": "projected"}
    pfracs = QUICK_PROJECTED_FRACTIONS if quick else PROJECTED_FRACTIONS
    settings += [
        ("cap-projected", f, {"starvation_cap": round(f * base["rounds"]), **projected})
        for f in pfracs
    ]
    settings += [
        ("slack-projected", c, {"starvation_slack": c, **projected}) for c in PROJECTED_SLACKS
    ]
    settings += [
        ("oracle-cap-projected", f, {"starvation_cap": round(f * base["rounds"]), **projected})
        for f in (() if quick else pfracs)
    ]
    rows = []
    for rule, param, kwargs in settings:
        name = "oracle" if rule.startswith("oracle") else "dwise-uncapped"
        r = plain if rule == "none" else _run(w, make_policy(name, **kwargs), arrival, slots, k)
        g = base["mean_s"] / r["mean_s"]
        row = {
            "rule": rule,
            "param": param,
            "policy_kwargs": kwargs,
            **r,
            "gain": g,
            "gain_kept": (g - 1) / (g0 - 1),
            "gain_ratio": g / g0,
            "p99_ratio": r["p99_s"] / base["p99_s"],
            "max_ratio": r["max_s"] / base["max_s"],
        }
        row["meets_goal"] = bool(row["p99_ratio"] <= 1.0 and row["gain_kept"] >= GOAL_KEPT)
        rows.append(row)
        print(
            f"  n={n} {rule:10s} {param:<6g} mean {r['mean_s']:9.1f} p99 {r['p99_s']:9.1f} "
            f"kept {row['gain_kept']:.2f} p99 ratio {row['p99_ratio']:.2f} ({r['wall_s']} s)",
            flush=True,
        )
    return {
        "requests": n,
        "fcfs_mixed": base,
        "fcfs_mixed_throughput_req_per_s": n / base["makespan_s"],
        "dwise_gain": g0,
        "settings": rows,
    }


def print_table(res: dict[str, Any], arrival: str) -> None:
    b = res["fcfs_mixed"]
    print(
        f"\n{res['requests']} requests, {arrival}: fcfs-mixed mean {b['mean_s']:.1f} s, "
        f"p99 {b['p99_s']:.1f} s, max {b['max_s']:.1f} s, {b['rounds']} rounds, "
        f"{res['fcfs_mixed_throughput_req_per_s']:.2f} req/s served; dwise gain "
        f"{res['dwise_gain']:.2f}x"
    )
    headers = ["rule", "param", "cap_rounds", "mean_s", "p99_s", "max_s"]
    headers += ["gain", "kept", "G/G0", "p99/fcfs", "max/fcfs", "goal"]
    rows = [
        [
            r["rule"],
            f"{r['param']:g}",
            r["policy_kwargs"].get("starvation_cap", "-"),
            f"{r['mean_s']:.1f}",
            f"{r['p99_s']:.1f}",
            f"{r['max_s']:.1f}",
            f"{r['gain']:.2f}x",
            f"{r['gain_kept']:.2f}",
            f"{r['gain_ratio']:.2f}",
            f"{r['p99_ratio']:.2f}",
            f"{r['max_ratio']:.2f}",
            "yes" if r["meets_goal"] else "no",
        ]
        for r in res["settings"]
    ]
    print(format_table(headers, rows))


MARKERS = {
    "none": "*",
    "aging": "s",
    "cap-age": "o",
    "cap-waited": "^",
    "slack": "D",
    "cap-projected": "v",
    "slack-projected": "P",
    "oracle-cap-projected": "x",
}


def plot(doc: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ax.fill_between([0.0, 1.0], GOAL_KEPT, 1.2, color="green", alpha=0.12, label="goal")
    for i, res in enumerate(doc["sizes"]):
        c = colors[i % len(colors)]
        for rule, m in MARKERS.items():
            pts = [r for r in res["settings"] if r["rule"] == rule]
            if not pts:
                continue
            ax.scatter(
                [r["p99_ratio"] for r in pts],
                [r["gain_kept"] for r in pts],
                marker=m,
                color=c,
                s=60 if rule == "none" else 30,
                label=f"{res['requests']:,} req: {rule}",
            )
            if rule in ("cap-age", "slack", "cap-projected", "slack-projected"):
                for r in pts:
                    ax.annotate(
                        f"{r['param']:g}",
                        (r["p99_ratio"], r["gain_kept"]),
                        fontsize=6,
                        xytext=(3, 2),
                        textcoords="offset points",
                    )
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.axhline(GOAL_KEPT, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("p99 latency / fcfs-mixed's p99")
    ax.set_ylabel("share of dwise's mean gain kept, (G - 1) / (G0 - 1)")
    ax.set_xlim(0.9, max(1.4, max(r["p99_ratio"] for s in doc["sizes"] for r in s["settings"])))
    ax.set_ylim(-0.05, 1.15)
    ax.set_title(
        f"Anti-starvation rules under overload ({doc['arrival']}, B = {doc['slots']}, "
        f"k = {doc['k']})\nlabels: the cap as a fraction of fcfs-mixed's rounds, or the slack c",
        fontsize=8,
    )
    ax.legend(fontsize=6, ncol=2, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--sizes", default="4096,100000")
    ap.add_argument("--arrival", default="burst+poisson:16")
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument(
        "--quick-above",
        type=int,
        default=50_000,
        help="sizes above this sweep fewer caps (each run there takes about a minute)",
    )
    ap.add_argument("--out", default="benchmarks/results/aging.json")
    ap.add_argument("--plot", default="docs/img/aging-tradeoff.png")
    ap.add_argument("--from-json", metavar="JSON", help="print and plot a finished run's JSON")
    args = ap.parse_args(argv)
    if args.from_json:
        import json

        doc = json.loads(Path(args.from_json).read_text())
    else:
        cmd = "benchmarks/aging.py " + " ".join(sys.argv[1:] if argv is None else argv)
        doc = {
            "command": ".venv/bin/python " + cmd.strip(),
            "workload": "paper-llada2.1-mini (synthetic, seed 0)",
            "arrival": args.arrival,
            "slots": args.slots,
            "k": args.k,
            "goal": "p99 <= fcfs-mixed's p99 while keeping >= 90% of dwise's mean gain "
            "(gain_kept = (G - 1) / (G0 - 1))",
            "sizes": [],
        }
        for n in [int(s) for s in args.sizes.split(",") if s.strip()]:
            doc["sizes"].append(
                sweep(n, args.arrival, args.slots, args.k, quick=n > args.quick_above)
            )
            write_json(Path(args.out), doc)  # after every size: a long run loses little
        print(f"wrote {args.out}")
    for res in doc["sizes"]:
        print_table(res, doc["arrival"])
    print(f"wrote {plot(doc, Path(args.plot))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
