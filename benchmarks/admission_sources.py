"""Admission sources: the admission model alone against its mean with DWS's expected rounds.

Under a burst, DWISE ranks every waiting request by P + r̂ before any has run, so the admission
estimate decides most of the order. This benchmark measures both sources on held-out requests
of the reference model, in SGLang's layout:

* the tiny-bd eval split, category-stratified in the split's order (the SGLang ladder's 256
  requests are the first 256 of them; the next ones are a second, disjoint sample), traced
  with ``dwise-predict trace --model tiny-bd`` (absolute blocks, as SGLang serves it);
* per source: Spearman ρ of the estimate against the traced total rounds, overall and per
  category;
* per sample: the simulator under a burst, B = 16, k = 8, SGLang's r + 1 forwards per block
  (the replay that matches the ladder's served runs exactly), for ``dwise-r0``, ``dwise``
  with each source (refinement on) and ``oracle``; the share of the gap from ``dwise-r0`` to
  the oracle each closes, (L(r0) - L) / (L(r0) - L(oracle)).

Neither the bundle nor the mean is fitted to these requests (the mean has no weight to fit).

    .venv/bin/python benchmarks/admission_sources.py [--requests 516] [--traces DIR]

Tracing 516 requests takes about 4 minutes on 2 idle cores, 12 beside another benchmark
(``--traces`` reuses a folder traced before). Prints a table, writes
``benchmarks/results/admission_sources.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.ranking import spearman

SAMPLE = 256  # the SGLang ladder's request count
SLOTS, K = 16, 8
SOURCES = ("lightgbm", "lightgbm+dws")


def rho3(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's ρ to 3 places (None when undefined: too few requests or a constant side)."""
    rho = spearman(x, y)
    return None if rho is None else round(rho, 3)


def run_sample(
    reqs: list[Any],
    estimates: dict[str, tuple[np.ndarray, np.ndarray]],
    sources: Sequence[str] = SOURCES,
    policies: Sequence[str] = ("dwise",),
) -> dict:
    """Mean completion rounds under a burst for ``fcfs-mixed``, ``dwise-r0``, each of
    ``policies`` with each of ``sources`` (``estimates[source]`` = (admission, refined)) and the
    oracle (the baselines once), and the share of the gap from ``dwise-r0`` to the oracle each
    closes: ``gap_closed[policy][source]``."""
    from dwise_predict.runtime import Arrivals, RoundTimeModel, Workload, make_policy, simulate

    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)

    def mean_rounds(policy: str, source: str) -> float:
        adm, ref = estimates[source]
        rr = [
            dataclasses.replace(r, admission_estimate=float(a), refined_estimate=float(f))
            for r, a, f in zip(reqs, adm, ref)
        ]
        wl = Workload.from_requests(rr)
        run = simulate(
            wl,
            make_policy("dwise-uncapped" if policy == "dwise" else policy),  # the paper's DWISE
            arrivals=Arrivals(np.arange(wl.n), np.zeros(wl.n)),
            slots=SLOTS,
            k=K,
            round_time=rt,
            kv_pool_tokens=1 << 20,
        )
        return float(np.mean(run.finish_time)) * 1e3

    any_source = next(iter(estimates))  # the baselines read no estimate
    out = {
        "fcfs-mixed": mean_rounds("fcfs-mixed", any_source),
        "dwise-r0": mean_rounds("dwise-r0", any_source),
        **{f"{p} ({s})": mean_rounds(p, s) for p in policies for s in sources},
        "oracle": mean_rounds("oracle", any_source),
    }
    gap = out["dwise-r0"] - out["oracle"]
    return {
        "requests": len(reqs),
        "mean_completion_rounds": {k: round(v, 2) for k, v in out.items()},
        "gap_closed": {
            p: {s: round((out["dwise-r0"] - out[f"{p} ({s})"]) / gap, 3) for s in sources}
            for p in policies
        },
    }


def stratified_traces(n: int, traces: Path | None, workdir: Path) -> Any:
    """The first ``n`` category-stratified eval requests, traced (into ``workdir/traces``
    unless ``traces`` names a folder traced before), as a table in the stratified order."""
    from block_alignment import stratified  # the SGLang harness's order, long contexts too

    from dwise_predict.cli import main as cli
    from dwise_predict.traces import read_traces

    picked = stratified(n)
    if traces is None:
        workdir.mkdir(parents=True, exist_ok=True)
        workload = workdir / "eval-stratified.jsonl"
        workload.write_text("".join(json.dumps(r) + "\n" for r in picked), encoding="utf-8")
        traces = workdir / "traces"
        t0 = time.perf_counter()
        argv_trace = ["trace", "--model", "tiny-bd", "--workload", str(workload)]
        argv_trace += ["--out", str(traces), "--max-new-tokens", "256", "--batch-size", "8"]
        if cli([*argv_trace, "--resume"] if traces.exists() else argv_trace) != 0:
            raise SystemExit(f"tracing the stratified eval requests into {traces} failed")
        print(f"traced {len(picked)} requests in {time.perf_counter() - t0:.0f} s", flush=True)
    table = read_traces(traces)
    pos = {r: i for i, r in enumerate(table.column("request_id").to_pylist())}
    missing = [r["id"] for r in picked if r["id"] not in pos]
    if missing:
        raise SystemExit(f"{len(missing)} requests are not in {traces} (e.g. {missing[0]})")
    return table.take([pos[r["id"]] for r in picked])


def burst_requests(table: Any) -> tuple[list[Any], np.ndarray]:
    """The simulator's requests with SGLang's r + 1 forwards per block (the replay that matches
    the ladder's served runs), and each request's traced total rounds."""
    from dwise_predict.runtime import requests_from_traces

    traced = requests_from_traces(table)
    reqs = [
        dataclasses.replace(r, rounds_per_block=tuple(x + 1 for x in r.rounds_per_block))
        for r in traced
    ]
    return reqs, np.array([sum(r.rounds_per_block) for r in traced], float)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=2 * SAMPLE + 4, help="stratified, >= 256")
    ap.add_argument("--traces", type=Path, help="a folder traced before (skips tracing)")
    ap.add_argument("--workdir", type=Path, default=Path("runs/admission-sources"))
    ap.add_argument("--out", default="benchmarks/results/admission_sources.json")
    args = ap.parse_args(argv)

    from dwise_predict import load_bundle
    from dwise_predict.atomic import write_json
    from dwise_predict.runtime import estimates_from_bundle
    from dwise_predict.tables import format_table

    table = stratified_traces(args.requests, args.traces, args.workdir)
    bundle = load_bundle("tiny-bd")
    estimates = {s: estimates_from_bundle(bundle, table, admission_source=s) for s in SOURCES}
    reqs, true = burst_requests(table)
    cats = np.array(table.column("category").to_pylist())
    quality: dict[str, Any] = {"all": {}}
    for s in SOURCES:
        quality["all"][s] = rho3(estimates[s][0], true)
        for c in sorted(set(cats)):
            m = cats == c
            quality.setdefault(c, {})[s] = rho3(estimates[s][0][m], true[m])
    samples = {
        "ladder's 256": list(range(min(SAMPLE, len(reqs)))),
        "the next ones": list(range(SAMPLE, len(reqs))),
        "all": list(range(len(reqs))),
    }
    results = {}
    for name, idx in samples.items():
        if len(idx) < 2 * SLOTS:
            continue
        sub = {s: (e[0][idx], e[1][idx]) for s, e in estimates.items()}
        r = run_sample([reqs[i] for i in idx], sub)
        results[name] = {**r, "gap_closed": r["gap_closed"]["dwise"]}

    print("\nSpearman ρ of the admission estimate against the traced total rounds")
    rows = [[c, *(f"{quality[c][s]:.3f}" for s in SOURCES)] for c in quality]
    print(format_table(["category", *SOURCES], rows))
    print(f"\nburst, B = {SLOTS}, k = {K}: mean completion in rounds, and the gap closed")
    names = list(next(iter(results.values()))["mean_completion_rounds"])
    rows = [
        [
            name,
            str(r["requests"]),
            *(f"{r['mean_completion_rounds'][n]:.1f}" for n in names),
            *(f"{r['gap_closed'][s]:.2f}" for s in SOURCES),
        ]
        for name, r in results.items()
    ]
    print(format_table(["sample", "n", *names, *(f"closed: {s}" for s in SOURCES)], rows))
    doc = {
        "command": "python benchmarks/admission_sources.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "bundle": bundle.name,
        "fingerprint": bundle.fingerprint.short(),
        "requests": len(reqs),
        "slots": SLOTS,
        "k": K,
        "spearman": quality,
        "burst": results,
    }
    write_json(Path(args.out), doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
