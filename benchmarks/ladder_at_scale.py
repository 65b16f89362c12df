"""The SGLang ladder at 4,096 requests, in the simulator, beside the 256 served in SGLang's loop.

``benchmarks/sglang_ladder.py`` serves 256 requests through SGLang's real loop and replays each
run in the simulator (within 0.4% for every mixed-phase rung). 256 requests on 16 rows is a
small queue; this benchmark asks whether the ladder's shape holds on a workload sixteen times
larger, with the same settings and the same definitions:

* requests: the tiny-bd eval split (held out from the zoo bundle's training), traced in
  SGLang's layout (absolute blocks) with ``dwise-predict trace --model tiny-bd``; each request
  spends SGLang's r + 1 forwards per block, as the ladder's replay does;
* two mixes of ``--requests``: ``served`` (equal shares per category, as the served ladder's
  round-robin draws them) and ``split`` (the eval split's own mix). A category with fewer
  traces than its share repeats each of them as often as whole copies fit, then a seeded
  sample of them once more (every trace appears ⌊m/n⌋ or ⌈m/n⌉ times); arrival order is a
  seeded shuffle;
* B, k and the KV pool: the served ladder's (read from its JSON);
* regimes as the ladder sets them, from this workload's own burst: ``poisson-below`` /
  ``-above`` at 0.7 / 1.5 times stock's capacity, ``poisson-overload`` at 1.5 times
  fcfs-mixed's (requests per round over the burst);
* policies: every rung (stock, fcfs-mixed, dwise-r0, dwise-admission, dwise, oracle,
  mlfq-mixed, dws-sjf), ``dwise@dws`` (the ``lightgbm+dws`` admission source), and
  ``dwise@pcap0.25`` / ``oracle@pcap0.25`` (the projected starvation cap docs/runtime.md
  recommends under sustained overload, at 0.25 of fcfs-mixed's rounds), and under
  ``poisson-overload`` a grid of the anti-starvation rules (caps on the age and projected
  clocks as fractions of fcfs-mixed's rounds, slacks; the oracle under the projected cap);
  the estimates are the zoo bundle's, computed from the traces as the plugin computes them in
  the loop.

Per run: mean, p50, p99 and max completion rounds, mean rounds to the first block, per
category mean and p99; per regime the gain of each over fcfs-mixed, the share of the gap from
dwise-r0 to the oracle that dwise closes and, under the burst, the SPT optimum.

    .venv/bin/python benchmarks/ladder_at_scale.py [--traces runs/eval-absolute/traces]

Without traces in ``--traces`` it traces the eval split there first (3,513 requests, about
13 minutes on 2 idle cores; ``--resume``s an interrupted folder). The replay itself takes a few
minutes. Prints a table, writes ``benchmarks/results/sglang_ladder_at_scale.json`` and a plot
of the gain per rung, the served runs solid and the simulated ones dashed or dotted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from sglang_ladder import (  # benchmarks/sglang_ladder.py: the served ladder's definitions
    REGIMES,
    RUNGS,
    arrival_rounds,
    replay,
    spt_mean_completion,
    variant_settings,
)

LADDER_JSON = Path("benchmarks/results/sglang_ladder.json")
PLAIN = ("stock", "fcfs-mixed", "dwise-r0", "dwise-admission", "dwise", "oracle", "mlfq-mixed")
EXTRA = ("dws-sjf", "dwise@dws", "dwise@pcap0.25", "oracle@pcap0.25")
#: anti-starvation rules swept under poisson-overload, where the tails are decided
TAILS = (
    *(f"dwise@cap{f:g}" for f in (0.2, 0.3, 0.4, 0.5)),
    *(f"dwise@slack{c:g}" for c in (0.8, 1.0, 1.5)),
    *(f"{p}@pcap{f:g}" for p in ("dwise", "oracle") for f in (0.3, 0.4, 0.5, 0.6, 0.7)),
)
MIXES = ("served", "split")


def tile(idx: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` draws from ``idx``: every element ⌊m/n⌋ times, then a sample of the rest once."""
    whole, rest = divmod(m, idx.size)
    return np.concatenate([np.tile(idx, whole), rng.choice(idx, rest, replace=False)])


def draw(categories: np.ndarray, m: int, mix: str, seed: int) -> np.ndarray:
    """Row indices of an ``m``-request workload of the given mix, in a seeded arrival order."""
    rng = np.random.default_rng(seed)
    if mix == "split":
        rows = tile(np.arange(categories.size), m, rng)
    else:
        cats = sorted(set(categories.tolist()))
        shares = [m // len(cats) + (i < m % len(cats)) for i in range(len(cats))]
        rows = np.concatenate(
            [tile(np.flatnonzero(categories == c), s, rng) for c, s in zip(cats, shares)]
        )
    return rng.permutation(rows)


def summarize(run: Any, arrive: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    """A simulated run's figures, in rounds from each request's arrival (1 ms a round)."""
    lat = (np.asarray(run.finish_time) * 1e3) - arrive
    ttft = (np.asarray(run.first_block_time) * 1e3) - arrive
    per_cat = {
        c: {
            "requests": int((cats == c).sum()),
            "mean_completion_rounds": round(float(lat[cats == c].mean()), 2),
            "p99_completion_rounds": round(float(np.percentile(lat[cats == c], 99)), 2),
        }
        for c in sorted(set(cats.tolist()))
    }
    return {
        "mean_completion_rounds": round(float(lat.mean()), 2),
        "p50_completion_rounds": round(float(np.percentile(lat, 50)), 2),
        "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
        "max_completion_rounds": round(float(lat.max()), 2),
        "mean_ttft_rounds": round(float(ttft.mean()), 2),
        "rounds": int(round(float(np.max(run.finish_time)) * 1e3)),
        "finished": int(np.isfinite(run.finish_time).sum()),
        "requests": int(lat.size),
        "per_category": per_cat,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--traces", type=Path, default=Path("runs/eval-absolute/traces"))
    ap.add_argument("--requests", type=int, default=4096)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--ladder", type=Path, default=LADDER_JSON, help="the served ladder's JSON")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/sglang_ladder_at_scale.json")
    ap.add_argument("--plot", default="docs/img/sglang-ladder-at-scale.png")
    ap.add_argument("--from-json", metavar="JSON", help="print and plot a finished run's JSON")
    args = ap.parse_args(argv)
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        print_table(doc)
        print_tails(doc)
        print(f"wrote {plot(doc, json.loads(args.ladder.read_text()), Path(args.plot))}")
        return 0

    from dwise_predict import load_bundle
    from dwise_predict.atomic import write_json
    from dwise_predict.runtime import (
        Arrivals,
        Workload,
        costs_from_bundle,
        estimates_from_bundle,
        requests_from_traces,
    )
    from dwise_predict.traces import read_traces

    ladder = json.loads(args.ladder.read_text())
    slots, k = int(ladder["slots"]), int(ladder["k"])
    kv_pool = int(ladder["regimes"]["burst"]["runs"]["stock"]["kv_free_before"])
    if trace_eval_split(args.traces) != 0:
        return 1
    table = read_traces(args.traces)
    bundle = load_bundle("tiny-bd")
    t0 = time.perf_counter()
    adm, ref = estimates_from_bundle(bundle, table)
    adm_dws, _ = estimates_from_bundle(bundle, table, admission_source="lightgbm+dws")
    cost = costs_from_bundle(bundle, table)
    print(f"estimated {table.num_rows} traced requests in {time.perf_counter() - t0:.0f} s")
    base = [
        dataclasses.replace(
            r,
            rounds_per_block=tuple(x + 1 for x in r.rounds_per_block),  # SGLang's r + 1
            admission_estimate=float(a),
            refined_estimate=float(f),
            cost=float(c),
        )
        for r, a, f, c in zip(requests_from_traces(table), adm, ref, cost)
    ]
    categories = np.array(table.column("category").to_pylist())
    doc: dict[str, Any] = {
        "command": "python benchmarks/ladder_at_scale.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "bundle": bundle.name,
        "fingerprint": bundle.fingerprint.short(),
        "traced_requests": table.num_rows,
        "requests": args.requests,
        "slots": slots,
        "k": k,
        "kv_pool_tokens": kv_pool,
        "served_ladder": str(args.ladder),
        "mixes": {},
    }
    for mix in args.mixes.split(","):
        rows = draw(categories, args.requests, mix, args.seed)
        reqs = [
            dataclasses.replace(base[i], request_id=f"{j}:{base[i].request_id}")
            for j, i in enumerate(rows)
        ]
        cats = categories[rows]
        plain = Workload.from_requests(reqs)
        dws = Workload.from_requests(
            [
                dataclasses.replace(r, admission_estimate=float(adm_dws[i]))
                for r, i in zip(reqs, rows)
            ]
        )
        out: dict[str, Any] = {
            "mix": {c: int((cats == c).sum()) for c in sorted(set(cats.tolist()))},
            "regimes": {},
        }
        capacity: dict[str, float] = {}
        for regime in REGIMES:
            rate = None
            if regime != "burst":
                load = 0.7 if regime == "poisson-below" else 1.5
                peer = "fcfs-mixed" if regime == "poisson-overload" else "stock"
                rate = load * capacity[peer]
            arrive = np.asarray(arrival_rounds(regime, len(reqs), rate, args.seed), float)
            arrivals = Arrivals(np.arange(len(reqs)), arrive / 1e3)
            runs: dict[str, Any] = {}
            for label in (*PLAIN, *EXTRA, *(TAILS if regime == "poisson-overload" else ())):
                settings: dict[str, Any] = {}
                if "@" in label:
                    settings = variant_settings(label, runs["fcfs-mixed"]["rounds"])[1]
                t1 = time.perf_counter()
                wl = dws if "admission" in settings else plain
                run = replay(wl, label, settings, arrivals, slots, k, kv_pool)
                runs[label] = {**summarize(run, arrive, cats), **settings}
                v = runs[label]
                print(
                    f"{mix:7s}{regime:18s}{label:17s}mean {v['mean_completion_rounds']:>9.1f}"
                    f" p99 {v['p99_completion_rounds']:>9.1f} "
                    f"({time.perf_counter() - t1:.0f} s)",
                    flush=True,
                )
                if regime == "burst" and label in ("stock", "fcfs-mixed"):
                    capacity[label] = len(reqs) / runs[label]["rounds"]
            entry: dict[str, Any] = {
                "arrival": "burst" if rate is None else f"poisson: {rate:.5f} requests/round",
                "rate_per_round": rate,
                "runs": runs,
                "gap_closed": gap_closed(runs),
            }
            if rate is None:
                work = [r.prompt_blocks + sum(r.rounds_per_block) for r in reqs]
                best = spt_mean_completion(work, slots)
                entry["optimum"] = {
                    "mean_completion_rounds": round(best, 2),
                    "gain_over_fcfs_mixed": round(
                        runs["fcfs-mixed"]["mean_completion_rounds"] / best, 3
                    ),
                }
            out["regimes"][regime] = entry
        out["stock_capacity_requests_per_round"] = capacity["stock"]
        out["fcfs_mixed_capacity_requests_per_round"] = capacity["fcfs-mixed"]
        doc["mixes"][mix] = out
        write_json(Path(args.out), doc)  # after every mix: a long run loses little
    print_table(doc)
    print_tails(doc)
    print(f"wrote {args.out} and {plot(doc, ladder, Path(args.plot))}")
    return 0


def trace_eval_split(traces: Path) -> int:
    """Trace the whole eval split into ``traces`` in SGLang's layout, unless it is there."""
    from block_alignment import stratified  # the eval split, categories round-robin

    from dwise_predict.cli import main as cli
    from dwise_predict.traces import read_traces

    records = stratified(sys.maxsize)
    if any(traces.glob("*.parquet")) and read_traces(traces).num_rows >= len(records):
        return 0
    workload = traces.parent / "eval-split.jsonl"
    workload.parent.mkdir(parents=True, exist_ok=True)
    workload.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    argv = ["trace", "--model", "tiny-bd", "--workload", str(workload), "--out", str(traces)]
    argv += ["--max-new-tokens", "256", "--batch-size", "8"]
    t0 = time.perf_counter()
    rc = cli([*argv, "--resume"] if traces.exists() else argv)
    print(f"traced {len(records)} requests in {time.perf_counter() - t0:.0f} s", flush=True)
    return rc


def gap_closed(runs: dict[str, Any]) -> dict[str, float | None]:
    """(L(dwise-r0) - L) / (L(dwise-r0) - L(oracle)) for dwise and dwise@dws (None where the
    gap is under a round: no queue, nothing to close)."""
    r0 = runs["dwise-r0"]["mean_completion_rounds"]
    gap = r0 - runs["oracle"]["mean_completion_rounds"]
    return {
        p: (round((r0 - runs[p]["mean_completion_rounds"]) / gap, 3) if gap >= 1 else None)
        for p in ("dwise", "dwise@dws")
    }


def print_table(doc: dict[str, Any]) -> None:
    print(
        f"\n{'mix':8s}{'regime':18s}{'policy':17s}{'mean':>9s}{'p50':>8s}{'p99':>9s}{'max':>8s}"
        f"{'vs fcfs-mixed':>15s}"
    )
    for mix, m in doc["mixes"].items():
        for regime, r in m["regimes"].items():
            base = r["runs"]["fcfs-mixed"]["mean_completion_rounds"]
            for policy, run in r["runs"].items():
                print(
                    f"{mix:8s}{regime:18s}{policy:17s}{run['mean_completion_rounds']:>9.1f}"
                    f"{run['p50_completion_rounds']:>8.1f}{run['p99_completion_rounds']:>9.1f}"
                    f"{run['max_completion_rounds']:>8.0f}"
                    f"{base / run['mean_completion_rounds']:>14.2f}x"
                )
            closed = ", ".join(f"{p} {v:.2f}" for p, v in r["gap_closed"].items() if v is not None)
            if closed:
                print(f"{'':26s}gap closed (dwise-r0 -> oracle): {closed}")
            if "optimum" in r:
                o = r["optimum"]
                print(
                    f"{'':26s}optimum (shortest work first): {o['mean_completion_rounds']:.1f}, "
                    f"{o['gain_over_fcfs_mixed']:.2f}x"
                )


def print_tails(doc: dict[str, Any]) -> None:
    """Each anti-starvation rule against the tail goal, under poisson-overload: the share of
    dwise's mean gain over fcfs-mixed kept, (G - 1) / (G0 - 1), and the p99 and max ratios."""
    for mix, m in doc["mixes"].items():
        runs = m["regimes"].get("poisson-overload", {}).get("runs", {})
        if "dwise" not in runs:
            continue
        base = runs["fcfs-mixed"]
        g0 = base["mean_completion_rounds"] / runs["dwise"]["mean_completion_rounds"]
        print(f"\n{mix} mix, poisson-overload: gain kept, p99 and max / fcfs-mixed's")
        for label, v in runs.items():
            if "@" not in label and label != "dwise":
                continue
            g = base["mean_completion_rounds"] / v["mean_completion_rounds"]
            print(
                f"  {label:18s} mean {v['mean_completion_rounds']:>8.1f} "
                f"kept {(g - 1) / (g0 - 1):>5.2f} "
                f"p99 {v['p99_completion_rounds'] / base['p99_completion_rounds']:.2f}x "
                f"max {v['max_completion_rounds'] / base['max_completion_rounds']:.2f}x"
            )


def plot(doc: dict[str, Any], ladder: dict[str, Any], path: Path) -> Path:
    """Gain over fcfs-mixed per rung: served in SGLang (solid) and at scale (dashed, dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 4.6))
    styles = {"served": "--", "split": ":"}
    for i, regime in enumerate(r for r in REGIMES if r in ladder["regimes"]):
        color = f"C{i}"

        def gains(runs: dict[str, Any]) -> list[float]:
            base = runs["fcfs-mixed"]["mean_completion_rounds"]
            return [base / runs[p]["mean_completion_rounds"] for p in RUNGS]

        ax.plot(
            RUNGS,
            gains(ladder["regimes"][regime]["runs"]),
            marker="o",
            color=color,
            label=f"{regime}: SGLang, {ladder['requests']} requests",
        )
        for mix, m in doc["mixes"].items():
            if regime in m["regimes"]:
                ax.plot(
                    RUNGS,
                    gains(m["regimes"][regime]["runs"]),
                    ls=styles.get(mix, "-."),
                    marker=".",
                    color=color,
                    label=f"{regime}: simulator, {doc['requests']:,} ({mix} mix)",
                )
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("mean completion, gain over fcfs-mixed")
    ax.set_title(
        f"DWISE's ladder: served in SGLang's loop and simulated at {doc['requests']:,} requests "
        f"(tiny-bd, B = {doc['slots']}, k = {doc['k']})",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    raise SystemExit(main())
