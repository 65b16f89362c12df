"""`dwise-predict simulate`: replay traces under scheduling policies in the trace-driven simulator.

    dwise-predict simulate --synthetic paper-llada2.1-mini --policies fcfs,mlfq,sjf,dwise,oracle \\
        --arrival burst --slots 128 --k 8 --out sim/
    dwise-predict simulate --traces traces/ --bundle my-bundle/ --policies fcfs,dwise --out sim/
    dwise-predict simulate --synthetic paper-llada2.1-mini --policies dwise --replicas 4 \\
        --slots 16 --arrival poisson:900 --out fleet/

Prints the comparison table and writes DIR/summary.json, DIR/latency_cdf.png and
DIR/round_composition.png; with ``--replicas R`` (R > 1), a fleet of R such servers behind each
``--dispatch`` method, DIR/fleet.json and DIR/fleet.png. Everything here is a call to
:mod:`dwise_predict.runtime`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError

log = logging.getLogger(__name__)


class _ListPolicies(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        from ..runtime.registry import policy_entries

        for e in policy_entries().values():
            print(f"{e.name:16s} {e.summary}")
        parser.exit()


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Replay traces under scheduling policies in the trace-driven simulator",
        description="Replay traces (or the paper-matched "
        "synthetic workload) under scheduling policies.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--traces", type=Path, help="trace file or folder written by `dwise-predict trace`"
    )
    src.add_argument(
        "--synthetic",
        choices=["paper-llada2.1-mini"],
        help="the DWISE paper's LLaDA2.1-mini workload, synthesized",
    )
    p.add_argument(
        "--bundle",
        help="predictor bundle giving DWISE's admission and refined estimates (with --traces)",
    )
    p.add_argument(
        "--admission",
        default="lightgbm",
        choices=["lightgbm", "lightgbm+dws"],
        help="with --bundle: the admission estimate, the admission model's alone or its mean "
        "with the DWS surface's expected rounds (default: %(default)s)",
    )
    p.add_argument(
        "--policies",
        default="fcfs,mlfq,sjf,dwise,oracle",
        help="comma-separated registered policy names (default: %(default)s; "
        "`dwise-predict simulate --list-policies` lists them)",
    )
    p.add_argument(
        "--list-policies",
        action=_ListPolicies,
        nargs=0,
        help="print every registered policy with one line on what it is, and exit",
    )
    p.add_argument(
        "--arrival",
        default="burst",
        help="burst | poisson:RATE | burst+poisson:RATE (req/s; default: burst)",
    )
    p.add_argument(
        "--aging",
        type=float,
        default=None,
        help="DWISE family: work units subtracted per round a request spends without running "
        "(0 = off; default: the policy's own)",
    )
    p.add_argument(
        "--starvation-cap",
        type=int,
        default=None,
        metavar="ROUNDS",
        help="DWISE family: a request past ROUNDS on the starvation clock runs ahead of all "
        "others, in arrival order (0 = off; default: the policy's own; docs/runtime.md)",
    )
    p.add_argument(
        "--starvation-clock",
        choices=["age", "waited", "projected"],
        default=None,
        help="what --starvation-cap and --starvation-slack count: rounds since arrival (age), "
        "rounds spent without running (waited; the cap only), or rounds since arrival plus "
        "the estimated work left (projected: promotes a request in time to finish by the "
        "deadline) (default: the policy's own)",
    )
    p.add_argument(
        "--starvation-slack",
        type=float,
        default=None,
        metavar="C",
        help="DWISE family: a request in the system longer than C times the rounds FCFS would "
        "take to clear the work present at its arrival runs ahead of all others "
        "(0 = off; default: the policy's own; docs/runtime.md)",
    )
    p.add_argument("--slots", type=int, default=128, help="block slots B per round (default: 128)")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="simulate a fleet of this many replicas, each with --slots and --kv-pool-tokens, "
        "behind every --dispatch method (default: 1, one server; docs/fleet.md)",
    )
    p.add_argument(
        "--dispatch",
        default=None,
        help="with --replicas: comma-separated dispatch methods (default: all of "
        "round_robin, total_requests, total_tokens, dwise, oracle)",
    )
    p.add_argument(
        "--dispatch-tolerance",
        type=float,
        default=None,
        metavar="SHARE",
        help="with --replicas: dwise/oracle take the replicas within SHARE of the least added "
        "cost in turn (0: always the least; default: the library's, 0.2)",
    )
    p.add_argument("--k", type=int, default=8, help="resident-set multiplier k (default: 8)")
    p.add_argument(
        "--kv-pool-tokens",
        type=int,
        default=1 << 21,
        help="KV pool size in tokens (default: %(default)s)",
    )
    p.add_argument(
        "--requests", type=int, default=4096, help="synthetic workload size (default: 4096)"
    )
    p.add_argument(
        "--spearman",
        type=float,
        default=0.87,
        help="synthetic: Spearman rho of the refined estimates "
        "with the truth (default: 0.87, the paper's)",
    )
    p.add_argument(
        "--spearman-admission",
        type=float,
        default=0.74,
        help="synthetic: Spearman rho of the admission estimates (default: 0.74, the paper's)",
    )
    p.add_argument(
        "--cost-profile",
        metavar="NAME_OR_FILE",
        help="time rounds with a cost profile (e.g. paper-llada2.0-mini, or a "
        "cost_profile.json) instead of the round-time defaults",
    )
    p.add_argument(
        "--batch-share",
        type=float,
        default=0.04,
        help="with --cost-profile: share of each non-dearest slot's cost a batched "
        "round adds (default: 0.04; 1 = serial)",
    )
    p.add_argument(
        "--out", type=Path, required=True, help="output folder for summary.json and the plots"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=run)


def tunables(args: argparse.Namespace) -> dict[str, Any]:
    """The anti-starvation flags the user set (the others keep each policy's own setting)."""
    from ..runtime.registry import TUNABLES

    return {k: getattr(args, k) for k in TUNABLES if getattr(args, k, None) is not None}


def _workload(args: argparse.Namespace, policies: list[Any]) -> Any:
    from ..runtime import Workload, estimates_from_bundle, requests_from_traces, synthetic_workload

    if args.admission != "lightgbm" and not args.bundle:
        raise ConfigError("--admission chooses a bundle's admission estimate: pass --bundle too")
    if args.synthetic:
        if args.bundle:
            raise ConfigError(
                "--bundle applies to --traces; the synthetic "
                "workload carries its own noisy estimates"
            )
        synthetic = synthetic_workload(
            args.synthetic,
            n=args.requests,
            seed=args.seed,
            spearman=args.spearman,
            spearman_admission=args.spearman_admission,
        )
        if any("length" in p.needs for p in policies):  # output-length baselines (lengths.py)
            from ..runtime.lengths import synthetic_lengths

            synthetic = synthetic.with_estimates(
                lengths=synthetic_lengths(synthetic, seed=args.seed)
            )
        return synthetic
    from ..traces import read_traces

    table = read_traces(args.traces)
    admission = refined = None
    cost = None
    if args.bundle:
        from ..bundle import load_bundle
        from ..runtime import costs_from_bundle

        bundle = load_bundle(args.bundle)
        admission, refined = estimates_from_bundle(bundle, table, admission_source=args.admission)
        if any("cost" in p.needs for p in policies):
            cost = costs_from_bundle(bundle, table)
    workload = Workload.from_requests(requests_from_traces(table, admission, refined))
    if args.bundle and any("length" in p.needs for p in policies):
        from ..runtime.lengths import lengths_from_bundle

        workload = workload.with_estimates(lengths=lengths_from_bundle(bundle, table))
    return workload if cost is None else workload.with_estimates(cost=cost)


def run(args: argparse.Namespace) -> int:
    from ..runtime import compare_policies, parse_policies
    from ._common import progress

    if args.replicas < 1:
        raise ConfigError(f"--replicas {args.replicas}: a fleet needs at least one replica")
    fleet = args.replicas > 1
    if not fleet and (args.dispatch_tolerance is not None or args.dispatch is not None):
        raise ConfigError(
            "--dispatch and --dispatch-tolerance apply to a fleet: pass --replicas R (R > 1)"
        )
    if fleet and args.cost_profile:
        raise ConfigError(
            "--cost-profile times one server's rounds; a fleet runs in lockstep rounds: "
            "drop --cost-profile with --replicas"
        )
    policies = parse_policies(args.policies, **tunables(args))
    workload = _workload(args, policies)
    if fleet:
        return _run_fleet(args, policies, workload)
    bar = progress(total=len(policies), desc="simulating", unit="policy", quiet=args.quiet)
    round_time = None
    if args.cost_profile:
        from ..cost import load_cost_profile
        from ..runtime.costtime import ProfileRoundTime

        round_time = ProfileRoundTime(
            load_cost_profile(args.cost_profile), args.batch_share, name=str(args.cost_profile)
        )
    report = compare_policies(
        workload,
        policies,
        args.arrival,
        args.slots,
        args.k,
        args.seed,
        kv_pool_tokens=args.kv_pool_tokens,
        round_time=round_time,
        progress=lambda _n: bar.update(1),
    )
    bar.close()
    print(report.table())
    path = report.to_json(args.out / "summary.json")
    print(f"wrote {path}")
    if not args.no_plots:
        for p in report.plot(args.out):
            print(f"wrote {p}")
    return 0


def _run_fleet(args: argparse.Namespace, policies: list[Any], workload: Any) -> int:
    """Every policy behind every dispatch method on ``--replicas`` servers."""
    from ..atomic import write_json
    from ..runtime.fleet import (
        DEFAULT_TOLERANCE,
        DISPATCH_METHODS,
        compare_dispatch,
        fleet_table,
        plot_fleet,
    )
    from ._common import progress

    spec = args.dispatch
    methods = list(DISPATCH_METHODS) if spec is None else [m.strip() for m in spec.split(",")]
    tolerance = DEFAULT_TOLERANCE if args.dispatch_tolerance is None else args.dispatch_tolerance
    bar = progress(
        total=len(policies) * len(methods), desc="simulating", unit="run", quiet=args.quiet
    )
    runs = compare_dispatch(
        workload,
        policies,
        methods,
        replicas=args.replicas,
        arrivals=args.arrival,
        slots=args.slots,
        k=args.k,
        kv_pool_tokens=args.kv_pool_tokens,
        seed=args.seed,
        tolerance=tolerance,
        progress=lambda _run: bar.update(1),
    )
    bar.close()
    print(fleet_table(runs))
    doc = {
        "replicas": args.replicas,
        "slots": args.slots,
        "k": args.k,
        "arrival": args.arrival,
        "requests": workload.n,
        "dispatch_tolerance": tolerance,
        "runs": [{"policy": r.policy, "method": r.method, **r.summary()} for r in runs],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"wrote {write_json(args.out / 'fleet.json', doc, sort_keys=False, allow_nan=True)}")
    if not args.no_plots:
        title = f"{args.replicas} replicas x B={args.slots}, {args.arrival}"
        print(f"wrote {plot_fleet(runs, args.out / 'fleet.png', title)}")
    return 0
