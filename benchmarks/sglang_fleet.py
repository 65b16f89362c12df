"""The fleet served in SGLang's loop: R real schedulers behind SGLang's real data-parallel
controller code, each dispatch method, and the simulator replaying every run.

R (``--replicas``, default 4) of the CPU harness's SGLang schedulers (tiny-bd computing the
logits, the plugin on its default policy on every replica, B = ``--slots``, k = ``--k``) sit
behind SGLang 0.5.23's ``DataParallelController`` dispatch code, in one process and in lockstep
(``tests/sglang_plugin/fleet_harness.py`` says exactly which parts are SGLang's and which are
stand-ins). Per mix (``stratified``: round-robin over categories; ``split``: the eval split's
own mix) of ``--requests`` eval-split requests:

* a burst on the fleet (SGLang's round robin) measures each request's true work (the rounds it
  ran in), which ``oracle`` dispatches by; the fleet's capacity is R·B blocks a round over the
  mean true work, in requests per round (as ``benchmarks/fleet_dispatch.py`` sets it);
* Poisson arrivals at each of ``--loads`` times that capacity (default 0.8 and 1.1), served once
  per dispatch method: ``round_robin``, ``total_requests``, ``total_tokens`` (SGLang's own,
  ``--load-balance-method``), ``dwise`` (the plugin's, ``DWISE_SGLANG_DISPATCH=dwise``) and
  ``oracle`` (the same rule with true work);
* the simulator (``runtime.fleet.simulate_fleet``) replays every served run from the plugin's
  record of each request, with the same arrivals, and the gap of its mean is reported.

``at_scale``: 100,000 paper-matched synthetic requests on 32 replicas x B = 128 at 1.1x
capacity in the simulator (``benchmarks/fleet_dispatch.py``'s code), the plugin's default on
every replica; by default its figures are read from
``benchmarks/results/fleet_dispatch_at_scale_default.json`` (about 11 minutes on 2 cores to
recompute: ``--at-scale 100000``).

    .venv-sglang/bin/python benchmarks/sglang_fleet.py                  # the full run
    .venv-sglang/bin/python benchmarks/sglang_fleet.py --requests 64 --mixes stratified \\
        --loads 1.1 --out runs/fleet.json                                # a quick look

Writes ``benchmarks/results/sglang_fleet.json``:
``mixes[MIX]["regimes"][REGIME]["runs"][METHOD]`` and ``["replays"][METHOD]``, ``at_scale``,
``must_show``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "sglang_plugin"))

SGLANG_METHODS = ("round_robin", "total_requests", "total_tokens")
METHODS = (*SGLANG_METHODS, "dwise", "oracle")
MIXES = ("stratified", "split")
POOL_TOKENS = 1 << 20  # the harness's KV pool per replica


def serve_fleet(
    reqs: list[Any],
    ticks: list[int],
    method: str,
    runner: Any,
    args: argparse.Namespace,
    true_work: dict[str, float] | None = None,
) -> Any:
    """One served fleet run under ``method``; SGLang's methods run as the controller's own,
    ``dwise``/``oracle`` as the plugin's method on a controller started with round robin."""
    from fleet_harness import run_fleet
    from harness import environ, plugin_env, remove_hooks
    from sglang.srt.plugins import load_plugins

    from dwise_predict.sglang import dispatch
    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    remove_hooks()
    plugin_method = method in ("dwise", "oracle")
    settings: dict[str, Any] = {"slots": args.slots, "k": args.k}
    if plugin_method:
        settings["dispatch"] = "dwise"
    with environ({**plugin_env("tiny-bd", **settings), "SGLANG_PLUGINS": "dwise"}):
        load_plugins()
        config = load_config()
        if config is None:
            raise RuntimeError("the plugin is not configured")

        def keep(s: Any) -> None:
            attach(s, config).keep_finished = True

        def make(controller: Any, true_loads: Any) -> Any:
            if method == "dwise":
                return dispatch.install(controller, config)
            wd = dispatch.WorkDispatch(
                controller, config, method="oracle", loads=true_loads, true_work=true_work
            )
            from dwise_predict.sglang import seam

            seam.install_dispatch(controller, wd)
            return wd

        res = run_fleet(
            reqs,
            ticks,
            dp_size=args.replicas,
            method="round_robin" if plugin_method else method,
            runner=runner,
            max_running_requests=args.slots * args.k,
            on_scheduler=keep,
            make_dispatch=make if plugin_method else None,
            true_work=true_work,
        )
    remove_hooks()
    return res


def replay(
    reqs: list[Any], tracks: dict[str, Any], ticks: list[int], method: str, a: Any
) -> dict[str, Any]:
    """The simulator's fleet replay of one served run (same requests, arrivals and method)."""
    from sglang_ladder import sim_workload

    from dwise_predict.runtime import make_policy
    from dwise_predict.runtime.arrivals import Arrivals
    from dwise_predict.runtime.fleet import simulate_fleet
    from dwise_predict.sglang.config import PluginConfig

    wl = sim_workload(tracks, [(s.rid, s.category) for s in reqs], {})
    order = np.argsort(np.asarray(ticks), kind="stable")
    arrivals = Arrivals(order, np.asarray(ticks, dtype=np.float64)[order] / 1000.0)
    policy = make_policy(PluginConfig(bundle="tiny-bd").policy)
    run = simulate_fleet(
        wl,
        policy,
        replicas=a.replicas,
        method=method,
        arrivals=arrivals,
        round_ms=1.0,
        slots=a.slots,
        k=a.k,
        kv_pool_tokens=POOL_TOKENS,
        snapshot="sglang-dllm",  # SGLang's methods see what its snapshots of a dLLM server say
    )
    s = run.summary()
    return {
        "mean_completion_rounds": round(float(s["mean_completion_rounds"]), 2),
        "p99_completion_rounds": round(float(s["p99_completion_rounds"]), 2),
        "finished": s["finished"],
        "requests": s["requests"],
        "requests_per_replica": s["requests_per_replica"],
    }


def serve_mix(
    mix: str, args: argparse.Namespace, runner: Any, log: Any, checkpoint: Any = None
) -> dict[str, Any]:
    from harness import eval_requests
    from sglang_ladder import arrival_rounds
    from sglang_scheduler import track_json

    reqs = eval_requests(
        args.requests, runner, max_new_tokens=args.max_new_tokens, stratified=mix == "stratified"
    )
    n = len(reqs)
    t0 = time.perf_counter()
    burst = serve_fleet(reqs, [0] * n, "round_robin", runner, args)
    true_work = {rid: float(w) for rid, w in burst.work.items()}
    # R·B blocks a round over the mean work (fleet_dispatch.py's capacity): a burst's drain
    # time is set by its longest requests, not by throughput
    capacity = args.replicas * args.slots / float(np.mean(list(true_work.values())))
    tracks = {rid: track_json(tr) for per in burst.tracks for rid, tr in per.items()}
    doc: dict[str, Any] = {
        "requests": n,
        "mix": {c: sum(s.category == c for s in reqs) for c in sorted({s.category for s in reqs})},
        "capacity_requests_per_round": round(capacity, 5),
        "capacity_rule": "replicas x slots / mean true work (rounds a request runs in)",
        "burst_drain_requests_per_round": round(n / burst.ticks, 5),
        "calibration": {"burst_round_robin": burst.summary(args.replicas)},
        "mean_true_work_rounds": round(float(np.mean(list(true_work.values()))), 2),
        "regimes": {},
    }
    log(
        f"{mix}: burst {burst.ticks} rounds, capacity {capacity:.4f} requests/round "
        f"({time.perf_counter() - t0:.0f} s)"
    )
    for load in args.loads:
        rate = load * capacity
        ticks = arrival_rounds("poisson", n, rate, args.seed)
        regime: dict[str, Any] = {
            "arrival": f"poisson: {rate:.5f} requests/round ({load:g}x fleet capacity)",
            "runs": {},
            "replays": {},
        }
        doc["regimes"][f"poisson-{load:g}x"] = regime
        for method in args.methods:
            t1 = time.perf_counter()
            try:
                res = serve_fleet(reqs, ticks, method, runner, args, true_work)
            except Exception as e:  # recorded, so one failing method does not lose the others
                regime["runs"][method] = {"error": f"{type(e).__name__}: {e}"}
                log(f"{mix} {load:g}x {method}: FAILED {e!r}")
                continue
            run = res.summary(args.replicas)
            run["wall_s"] = round(time.perf_counter() - t1, 1)
            regime["runs"][method] = run
            try:
                rep = replay(reqs, tracks, ticks, method, args)
                rep["mean_gap"] = round(
                    rep["mean_completion_rounds"] / run["mean_completion_rounds"] - 1, 4
                )
            except Exception as e:
                rep = {"error": f"{type(e).__name__}: {e}", "mean_completion_rounds": math.nan}
                rep["mean_gap"] = math.nan
            regime["replays"][method] = rep
            log(
                f"{mix} {load:g}x {method:15s} mean {run['mean_completion_rounds']:8.2f} "
                f"p99 {run['p99_completion_rounds']:8.2f} finished {run['finished']}/{n} "
                f"kv leaked {run['kv_leaked_tokens']} per replica {run['requests_per_replica']} "
                f"| replay mean {rep['mean_completion_rounds']:8.2f} ({rep['mean_gap']:+.1%}) "
                f"({run['wall_s']:.0f} s)"
            )
            if checkpoint is not None:
                checkpoint(doc)
    return doc


def at_scale(args: argparse.Namespace) -> dict[str, Any]:
    """``at_scale[METHOD]`` from fleet_dispatch.py's code (recomputed, or read from its JSON)."""
    if args.at_scale:
        from fleet_dispatch import run_fleet

        fleet = run_fleet(args.at_scale, 32, 128, [1.1], args.seed, "dwise")
        source = f"recomputed: benchmarks/fleet_dispatch.py run_fleet({args.at_scale}, 32, 128)"
        policy = "dwise on every replica"
    else:
        path = ROOT / args.at_scale_from
        data = json.loads(path.read_text())
        fleet = data["fleets"][0]
        source = f"read from {args.at_scale_from} (benchmarks/fleet_dispatch.py)"
        policy = data.get("policy", "dwise-uncapped on every replica")
    regime = fleet["regimes"]["poisson-1.1x"]
    out: dict[str, Any] = {
        "source": source,
        "requests": fleet["requests"],
        "replicas": fleet["replicas"],
        "slots": fleet["slots"],
        "regime": "poisson-1.1x (Poisson at 1.1x the fleet's capacity)",
        "policy": policy,
    }
    for m in METHODS:
        r = regime[m]
        out[m] = {
            "mean_completion_rounds": round(r["mean_completion_rounds"], 2),
            "p99_completion_rounds": round(r["p99_completion_rounds"], 2),
            "finished": r["finished"],
            "requests": r["requests"],
            "requests_per_replica": r["requests_per_replica"],
        }
    out["pooled"] = regime.get("pooled")
    out["other_regimes"] = {
        k: {
            m: {key: v[m][key] for key in ("mean_completion_rounds", "p99_completion_rounds")}
            for m in METHODS
        }
        for k, v in fleet["regimes"].items()
        if k != "poisson-1.1x"
    }
    return out


def must_show(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's criteria, each with the figures it rests on."""
    served = []
    for mix, md in doc["mixes"].items():
        for regime, rd in md["regimes"].items():
            runs = rd["runs"]
            if not all(m in runs and "error" not in runs[m] for m in METHODS):
                continue
            best = min(SGLANG_METHODS, key=lambda m: runs[m]["mean_completion_rounds"])
            b_mean = runs[best]["mean_completion_rounds"]
            b_p99 = runs[best]["p99_completion_rounds"]
            low_p99 = min(runs[m]["p99_completion_rounds"] for m in SGLANG_METHODS)
            d, o = runs["dwise"], runs["oracle"]
            oracle_gain = 1 - o["mean_completion_rounds"] / b_mean
            closes = (
                (b_mean - d["mean_completion_rounds"]) / (b_mean - o["mean_completion_rounds"])
                if oracle_gain >= 0.05
                else None
            )
            served.append(
                {
                    "mix": mix,
                    "regime": regime,
                    "best_sglang": best,
                    "dwise_mean_vs_best": round(d["mean_completion_rounds"] / b_mean, 4),
                    "dwise_p99_vs_best_p99": round(d["p99_completion_rounds"] / b_p99, 4),
                    "mean_no_worse": d["mean_completion_rounds"] <= b_mean,
                    "p99_no_worse": d["p99_completion_rounds"] <= b_p99,
                    "dwise_p99_vs_lowest_sglang_p99": round(
                        d["p99_completion_rounds"] / low_p99, 4
                    ),
                    "oracle_gain": round(oracle_gain, 4),
                    "dwise_closes": None if closes is None else round(closes, 3),
                    "closes_half": None if closes is None else closes >= 0.5,
                    "replay_max_mean_gap": max(abs(r["mean_gap"]) for r in rd["replays"].values()),
                    "all_finished_no_leaks": all(
                        r["finished"] == r["requests"] and r["kv_leaked_tokens"] == 0
                        for r in runs.values()
                    ),
                }
            )
    a = doc.get("at_scale") or {}
    scale = None
    if a:
        best = min(SGLANG_METHODS, key=lambda m: a[m]["mean_completion_rounds"])
        b = a[best]["mean_completion_rounds"]
        ratio = b / a["dwise"]["mean_completion_rounds"]
        oracle_ratio = b / a["oracle"]["mean_completion_rounds"]
        share = (ratio - 1) / (oracle_ratio - 1) if oracle_ratio > 1 else None
        scale = {
            "best_sglang": best,
            "dwise_speedup": round(ratio, 4),
            "oracle_speedup": round(oracle_ratio, 4),
            "dwise_share_of_oracle_gain": None if share is None else round(share, 3),
            "holds": ratio >= 1.2
            or (oracle_ratio < 1.25 and ratio >= 1 and (share is None or share >= 0.6)),
            "p99_no_worse": a["dwise"]["p99_completion_rounds"] <= a[best]["p99_completion_rounds"],
            "dwise_p99_vs_lowest_sglang_p99": round(
                a["dwise"]["p99_completion_rounds"]
                / min(a[m]["p99_completion_rounds"] for m in SGLANG_METHODS),
                4,
            ),
        }
    return {"served": served, "at_scale": scale}


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Mean and p99 completion per dispatch method, one panel per mix, a group per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dwise_predict.runtime.fleet import method_bars

    mixes = list(doc["mixes"])
    fig, axes = plt.subplots(1, len(mixes), figsize=(6.0 * len(mixes), 4.0), squeeze=False)
    for ax, mix in zip(axes[0], mixes):
        regimes = doc["mixes"][mix]["regimes"]
        runs = {r: regimes[r]["runs"] for r in regimes}
        method_bars(ax, list(runs), METHODS, lambda r, m, runs=runs: runs[r].get(m, {}))
        n = doc["mixes"][mix]["requests"]
        ax.set_title(f"{mix}: {n} requests, {doc['replicas']} replicas x B = {doc['slots']}")
    fig.suptitle(f"Dispatch across SGLang {doc['sglang_version']} replicas (tiny-bd, CPU)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def merge(args: argparse.Namespace) -> int:
    """One document from runs of separate mixes (same settings), with the criteria."""
    docs = [json.loads(p.read_text()) for p in args.merge]
    doc = dict(docs[0])
    doc["mixes"] = {}
    for d in docs:  # a later run of the same mix adds its regimes (e.g. another load), and
        # of the same regime its methods (e.g. dwise and oracle rerun after a change)
        for m, md in d["mixes"].items():
            if m not in doc["mixes"]:
                doc["mixes"][m] = json.loads(json.dumps(md))
                continue
            regimes = doc["mixes"][m]["regimes"]
            for name, reg in md["regimes"].items():
                if name not in regimes:
                    regimes[name] = reg
                    continue
                for part in ("runs", "replays"):
                    regimes[name][part].update(reg[part])
    doc["command"] = " ; ".join(d["command"] for d in docs)
    doc["wall_s"] = [d.get("wall_s") for d in docs]
    doc["at_scale"] = at_scale(args)  # read anew: --at-scale-from (or recomputed, --at-scale)
    doc["must_show"] = must_show(doc)
    if args.extra:  # runs of another size, kept apart from the main mixes
        doc["extra_runs"] = {}
        for path in args.extra:
            extra = json.loads(path.read_text())
            for m, md in extra["mixes"].items():
                doc["extra_runs"][f"{m}-{md['requests']}"] = md
        doc["extra_must_show"] = must_show({"mixes": doc["extra_runs"]})["served"]
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot(doc, args.plot)
    print(json.dumps(doc["must_show"], indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    from harness import install_torchvision_shim

    install_torchvision_shim()
    import importlib.metadata

    from harness import TinyBDRunner

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--loads", default="0.8,1.1", help="x the fleet's capacity")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--at-scale", type=int, default=0, help="recompute at_scale with N requests")
    ap.add_argument(
        "--at-scale-from", default="benchmarks/results/fleet_dispatch_at_scale_default.json"
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/sglang_fleet.json")
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="merge the mixes of earlier runs' JSONs (e.g. one process per mix) into --out",
    )
    ap.add_argument("--plot", type=Path, default=None, help="also draw the served figures")
    ap.add_argument("--extra", nargs="+", type=Path, help="with --merge: runs of another size")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args)
    args.loads = [float(x) for x in args.loads.split(",")]
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        raise SystemExit(f"unknown methods {sorted(unknown)}; choose from {METHODS}")
    import logging

    logging.getLogger("dwise_predict.sglang.dispatch").setLevel(logging.ERROR)
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)

    doc: dict[str, Any] = {
        "command": "benchmarks/sglang_fleet.py " + " ".join(argv or sys.argv[1:]),
        "sglang_version": importlib.metadata.version("sglang"),
        "replicas": args.replicas,
        "slots": args.slots,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "policy": "the plugin's default on every replica",
        "what_is_sglang": (
            "SGLang's own code: each replica's Scheduler dLLM loop (CPU harness), "
            "publish_load_snapshot with SchedulerLoadInquirer.get_loads and "
            "ShmLoadSnapshotWriter, and the DataParallelController dispatch path "
            "(dispatch_batch_generate, refresh_load_budget, DPBudget, ShmLoadSnapshotReader, "
            "round_robin/total_requests/total_tokens_scheduler, sock_send of real "
            "TokenizedGenerateReqInput). Stand-ins: the model forward (tiny-bd on CPU), the "
            "controller's __init__ (no process launch), the zmq sockets (in-process inboxes), "
            "pool statistics and zero counters in the load inquirer; the fleet runs in lockstep, "
            "one round per tick on every replica, and the controller's 20 ms refresh throttle "
            "lets one refresh per tick"
        ),
        "mixes": {},
    }
    runner = TinyBDRunner(block_size=32, memo=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc["at_scale"] = None
    for mix in args.mixes.split(","):

        def checkpoint(mix_doc: dict[str, Any], mix: str = mix) -> None:
            doc["mixes"][mix] = mix_doc
            args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")

        checkpoint(serve_mix(mix, args, runner, log, checkpoint))
    doc["at_scale"] = at_scale(args)
    doc["must_show"] = must_show(doc)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    log(f"wrote {args.out}")
    print(json.dumps(doc["must_show"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
