"""What ordering adds inside SGLang: DWISE's component ladder in SGLang 0.5.23's real loop.

The same category-stratified eval requests are served through SGLang's real scheduler classes
(the CPU harness of ``tests/sglang_plugin/harness.py``, tiny-bd computing the logits) under
stock SGLang and under each plugin policy, in three arrival regimes:

* ``burst``: every request arrives before round 0;
* ``poisson-below``: Poisson arrivals at ``--load-below`` times stock's capacity (its requests
  per round in the burst run);
* ``poisson-above``: the same at ``--load-above`` times, more than stock can serve;
* ``poisson-overload``: Poisson at ``--load-above`` times the capacity of ``fcfs-mixed`` (its
  requests per round in the burst run), more than a mixed-phase server can serve: the regime
  where ordering decides the tails. Stock SGLang's capacity is far below a mixed-phase
  server's, so the first two Poisson regimes load the plugin's policies lightly.

Policies (the simulator's names; stock = SGLang's own prefill-first FCFS with B residents):
``fcfs-mixed`` (arrival order, prompt and denoising blocks in one round: what an upstream SGLang
change adds), ``dwise-r0`` (ranked by prompt blocks left alone), ``dwise-admission`` (plus the
admission estimate), ``dwise`` (plus the refined estimate), ``oracle`` (true remaining work,
from the burst ``dwise`` run's record of each request), ``mlfq-mixed``, ``dws-sjf``. Rounds are
the unit: completion = the round a request finished in minus the round it arrived before.

Each run is replayed in the project's simulator with the same arrival rounds, the same B, k
and KV pool, each request's work as SGLang spent it, and the estimates the plugin computed.

    .venv-sglang/bin/python benchmarks/sglang_scheduler.py --ladder --requests 512 \\
        --out benchmarks/results/sglang_ladder.json

Tails under overload (docs/runtime.md): ``--policies fcfs-mixed,dwise`` serves a subset, and
``--cap-fractions F,..`` / ``--slacks C,..`` add ``dwise`` under DWISE's starvation cap (F times
fcfs-mixed's rounds in the same regime) or slack, on the ``age`` clock (labelled ``dwise@capF``,
``dwise@slackC``); ``--projected-caps`` / ``--projected-slacks`` the same on the ``projected``
clock (``dwise@pcapF``, ``dwise@pslackC``: promoted in time to finish by the deadline). With
any of them, the simulator also replays a grid of every rule beside the served runs, the
oracle under the projected cap included (``oracle@pcapF``: what the rule does with perfect
knowledge), in ``simulator_cap_sweep``. Write such partial runs to their own JSON, never over
the full ladder's:

    .venv-sglang/bin/python benchmarks/sglang_scheduler.py --ladder --requests 256 \
        --regimes burst,poisson-overload --policies fcfs-mixed,dwise \
        --cap-fractions 0.2,0.3 --slacks 1 --projected-caps 0.25,0.3,0.35 \
        --projected-slacks 1.5,2 --out runs/sglang-tails-check.json

``--mix split`` serves the eval split's first requests in its own mix (most of them chat, math
and mcq) instead of the category round-robin.

``--dws-admission`` adds ``dwise@dws``: ``dwise`` with ``DWISE_SGLANG_ADMISSION=lightgbm+dws``,
the admission estimate averaged with the DWS surface's expected rounds (the simulator replays
it with the estimates that run ranked by).

Checking a replay request by request: ``--save-tracks DIR`` writes each plugin run's record
(SGLang's queue order, arrival rounds, every request's rounds per block and estimates, every
round's batch) to ``DIR/REGIME.POLICY.tracks.json``, and ``--from-json JSON --check-replays
DIR`` replays each one and compares the round every request finished in (exit status 1 if
any differs). ``--rates-from JSON`` takes the Poisson rates from an earlier ladder, so that
one rung can be served in one regime alone with that ladder's arrivals:

    .venv-sglang/bin/python benchmarks/sglang_scheduler.py --ladder --requests 512 \
        --regimes poisson-above --policies dws-sjf --save-tracks runs/check \
        --rates-from benchmarks/results/sglang_ladder.json --out runs/check/ladder.json
    .venv/bin/python benchmarks/sglang_ladder.py --from-json runs/check/ladder.json \
        --check-replays runs/check

The model runner computes each request's block forward once and reuses it in later runs (its
output is a function of the request and the block's tokens only), so the first run costs the
model's forwards and the others mostly SGLang's own loop. Prints a table, writes the JSON.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

BLOCK_SIZE = 32
PLUGIN_POLICIES = (
    "fcfs-mixed",
    "dwise-r0",
    "dwise-admission",
    "dwise",
    "oracle",
    "mlfq-mixed",
    "dws-sjf",
)
POLICIES = ("stock", *PLUGIN_POLICIES)
REGIMES = ("burst", "poisson-below", "poisson-above", "poisson-overload")
#: anti-starvation variants, labelled POLICY@RULEVALUE: the setting and the clock of each rule
VARIANT_RULES = {
    "cap": ("starvation_cap", "age"),
    "slack": ("starvation_slack", "age"),
    "pcap": ("starvation_cap", "projected"),
    "pslack": ("starvation_slack", "projected"),
}


#: the ladder's "dwise" rung is the paper's DWISE, registered as "dwise-uncapped" since the
#: tail guard became the library's default "dwise" (benchmarks/sglang_tails.py serves that)
PAPER_NAMES = {"dwise": "dwise-uncapped"}


#: the variant whose admission estimate is the mean of the admission model's and DWS's
#: expected rounds (DWISE_SGLANG_ADMISSION=lightgbm+dws), labelled dwise@dws
DWS_RULE = "dws"


def variant_settings(label: str, fcfs_mixed_rounds: int) -> tuple[str, dict[str, Any]]:
    """``dwise@pcap0.3`` -> ("dwise", {"starvation_cap": 0.3 x fcfs-mixed's rounds,
    "starvation_clock": "projected"}); caps are fractions of fcfs-mixed's rounds in the regime
    (a cap in rounds does not carry from one workload to another), slacks are as given;
    ``dwise@dws`` -> ("dwise", {"admission": "lightgbm+dws"})."""
    policy, _, rule = label.partition("@")
    if rule == DWS_RULE:  # the admission estimate averaged with DWS's expected rounds
        return policy, {"admission": "lightgbm+dws"}
    kind = rule.rstrip("0123456789.")
    if kind not in VARIANT_RULES:
        raise ValueError(f"{label!r}: the rule is not one of {sorted(VARIANT_RULES)}")
    key, clock = VARIANT_RULES[kind]
    value = float(rule[len(kind) :])
    setting = round(value * fcfs_mixed_rounds) if key == "starvation_cap" else value
    return policy, {key: setting, "starvation_clock": clock}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def summarize(res: Any, reqs: list[Any]) -> dict[str, Any]:
    """A served run's figures, in rounds from each request's arrival."""
    arrive = res.arrival_round
    lat = {r: res.completion_round[r] - arrive[r] for r in res.completion_round}
    ttft = {r: res.first_block_round[r] - arrive[r] for r in res.first_block_round}
    done = list(lat.values())
    per_cat: dict[str, dict[str, float]] = {}
    for cat in sorted({s.category for s in reqs}):
        vals = [lat[s.rid] for s in reqs if s.category == cat and s.rid in lat]
        per_cat[cat] = {
            "requests": sum(s.category == cat for s in reqs),
            "mean_completion_rounds": round(statistics.mean(vals), 2) if vals else None,
            "p99_completion_rounds": round(_pct(vals, 99), 2) if vals else None,
        }
    return {
        "mean_completion_rounds": round(statistics.mean(done), 2),
        "p50_completion_rounds": round(_pct(done, 50), 2),
        "p99_completion_rounds": round(_pct(done, 99), 2),
        "max_completion_rounds": int(max(done)),
        "mean_ttft_rounds": round(statistics.mean(ttft.values()), 2),
        "rounds": res.rounds,
        "idle_rounds": res.idle_rounds,
        "finished": len(done),
        "requests": len(reqs),
        "kv_free_before": res.kv_free_before,
        "kv_free_after": res.kv_free_after,
        "req_slots_free_before": res.req_slots_free_before,
        "req_slots_free_after": res.req_slots_free_after,
        "kv_balanced_every_round": res.kv_balanced_every_round,
        "per_category": per_cat,
        "wall_s": round(res.wall_seconds, 1),
    }


def arrival_rounds(regime: str, n: int, rate: float | None, seed: int) -> list[int]:
    """The round before which each request (in the requests' order) arrives."""
    if regime == "burst":
        return [0] * n
    if rate is None or rate <= 0:
        raise ValueError(f"{regime} needs a positive rate")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.floor(np.cumsum(gaps) - gaps[0]).astype(int).tolist()


def serve_policy(
    policy: str,
    reqs: list[Any],
    arrive: list[int],
    runner: Any,
    slots: int,
    k: int,
    oracle_file: Path | None,
    extra: dict[str, Any] | None = None,
    bundle: str = "tiny-bd",
) -> tuple[Any, Any]:
    from harness import environ, plugin_env, remove_hooks, serve
    from sglang.srt.plugins import load_plugins

    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    remove_hooks()
    if policy == "stock":
        with environ({"DWISE_SGLANG_BUNDLE": None, "DWISE_SGLANG_POLICY": None}):
            load_plugins()
            res, s = serve(reqs, max_running_requests=slots, runner=runner, arrival_rounds=arrive)
        remove_hooks()
        return res, None

    def keep(sch: Any) -> None:
        config = load_config()
        if config is None or config.policy != policy:
            raise RuntimeError(f"the plugin is not configured for {policy}")
        attach(sch, config).keep_finished = True

    settings: dict[str, Any] = {"slots": slots, "k": k, "policy": policy, **(extra or {})}
    if policy == "oracle":
        settings["oracle"] = oracle_file
    with environ({**plugin_env(bundle, **settings), "SGLANG_PLUGINS": "dwise"}):
        load_plugins()
        res, s = serve(
            reqs,
            max_running_requests=slots * k,
            runner=runner,
            on_scheduler=keep,
            arrival_rounds=arrive,
        )
    remove_hooks()
    return res, s.dwise_serving


def spt_mean_completion(work: list[int], slots: int) -> float:
    """The least mean completion any schedule reaches when every request arrives at round 0:
    shortest work first, the j-th shortest on row j mod B (optimal for P|pmtn|sum C_j)."""
    rows = np.zeros(slots)
    done = []
    for j, w in enumerate(sorted(work)):
        rows[j % slots] += w
        done.append(rows[j % slots])
    return float(np.mean(done))


def tracks_of(state: Any) -> dict[str, dict[str, Any]]:
    from sglang_scheduler import track_json  # benchmarks/sglang_scheduler.py

    return {str(rid): track_json(tr) for rid, tr in state.finished}


def prices_with_encoder(label: str, settings: dict[str, Any]) -> bool:
    """Whether the plugin prices this run's arrivals with DWS's text encoder (``dws-sjf``, the
    ``lightgbm+dws`` admission source): with B residents they join the plan a round late."""
    return label.split("@")[0] == "dws-sjf" or settings.get("admission") == "lightgbm+dws"


def replay(
    wl: Any,
    label: str,
    settings: dict[str, Any],
    arrivals: Any,
    slots: int,
    k: int,
    kv_pool: int,
) -> Any:
    """One labelled run as the ladder replays it in the simulator: ``stock`` is the simulator's
    FCFS, ``POLICY@RULE`` the policy under ``settings`` (its anti-starvation rule; an
    ``admission`` source is already in ``wl``'s estimates), a round priced at 1 ms so that
    times are round counts, and arrivals the plugin prices with the encoder a round late."""
    from dwise_predict.runtime import FCFS, RoundTimeModel, make_policy, simulate

    rule = {key: v for key, v in settings.items() if key != "admission"}
    name = label.split("@")[0]
    policy = FCFS() if label == "stock" else make_policy(PAPER_NAMES.get(name, name), **rule)
    return simulate(
        wl,
        policy,
        arrivals=arrivals,
        slots=slots,
        k=k,
        round_time=RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0),
        kv_pool_tokens=kv_pool,
        priced_late_when_full=prices_with_encoder(label, settings),
    )


def sim_workload(
    tracks: dict[str, dict[str, Any]], order: list[tuple[str, str]], costs: dict[str, float]
) -> Any:
    """The simulator's workload of served requests ((request id, category) in arrival
    order): each one's prompt, rounds per block and estimates as the plugin recorded them."""
    from dwise_predict.runtime import SimRequest, Workload

    return Workload.from_requests(
        [
            SimRequest(
                rid,
                tracks[rid]["prompt_tokens"] // BLOCK_SIZE,
                tracks[rid]["prompt_tokens"],
                tuple(r + 1 for r in tracks[rid]["rounds_per_block"]),  # SGLang's r + 1
                tracks[rid]["output_budget"],
                BLOCK_SIZE,
                category=category,
                admission_estimate=tracks[rid]["admission"],
                refined_estimate=tracks[rid]["refined"],
                cost=costs.get(rid),
            )
            for rid, category in order
        ]
    )


def check_replays(tracks_dir: Path, doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Replay every run saved with ``--save-tracks`` from its own record and compare request by
    request: the round each finished in, served against replayed.

    A mean within a few percent can hide a different schedule; equal finish rounds for every
    request cannot (the saved batches go further, round by round, when one differs).
    """
    import json

    from dwise_predict.runtime import Arrivals

    out = {}
    for path in sorted(tracks_dir.glob("*.tracks.json")):
        regime, label = path.name[: -len(".tracks.json")].split(".", 1)
        runs = doc["regimes"][regime]["runs"]
        saved = json.loads(path.read_text())
        arrive, tracks = saved["arrival_rounds"], saved["tracks"]
        if "order" not in saved:
            raise SystemExit(
                f"{path} has no request order (saved before the ladder wrote one); FCFS and "
                "every tie follow the order requests entered SGLang's queue, so it cannot be "
                "replayed faithfully: serve it again with --save-tracks"
            )
        order = saved["order"]
        costs = {r: t["cost_ms"] for r, t in tracks.items() if t["cost_ms"] is not None}
        wl = sim_workload(tracks, [(r, "") for r in order], costs)
        times = np.array([arrive[r] for r in order], dtype=np.float64)
        settings = variant_settings(label, runs["fcfs-mixed"]["rounds"])[1] if "@" in label else {}
        kv_pool = int(runs["stock" if "stock" in runs else "fcfs-mixed"]["kv_free_before"])
        run = replay(
            wl,
            label,
            settings,
            Arrivals(np.arange(wl.n, dtype=np.int64), times / 1e3),
            doc["slots"],
            doc["k"],
            kv_pool,
        )
        # the round a request finished in: the server's count of rounds after its last batch
        # (idle rounds included), and the replay's clock in 1 ms rounds when it finished
        last = {rid: r for r, ids, _ in saved["batches"] for rid in ids}
        served = np.array([last[r] for r in order], dtype=np.int64)
        replayed = np.round(np.asarray(run.finish_time) * 1e3).astype(np.int64)
        diff = replayed - served
        out[f"{regime} {label}"] = {
            "requests": int(diff.size),
            "finish_round_differs": int(np.count_nonzero(diff)),
            "max_abs_rounds": int(np.abs(diff).max()),
            "served_mean_completion_rounds": round(float(np.mean(served - times)), 2),
            "replayed_mean_completion_rounds": round(float(np.mean(replayed - times)), 2),
        }
    return out


def simulate_regime(
    tracks: dict[str, dict[str, Any]],
    costs: dict[str, float],
    reqs: list[Any],
    arrive: list[int],
    slots: int,
    k: int,
    kv_pool: int,
    policies: list[str] | None = None,
    variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Every policy in the simulator, with the real runs' arrival rounds and work
    (``variants``: the anti-starvation settings of each ``POLICY@RULE`` label)."""
    from dwise_predict.runtime import Arrivals

    wl = sim_workload(tracks, [(s.rid, s.category) for s in reqs], costs)
    arrivals = Arrivals(np.arange(wl.n, dtype=np.int64), np.asarray(arrive, dtype=np.float64) / 1e3)
    out = {}
    for name in policies or POLICIES:
        settings = (variants or {})[name] if "@" in name else {}
        run = replay(wl, name, settings, arrivals, slots, k, kv_pool)
        lat = (np.asarray(run.finish_time) - np.asarray(arrive, dtype=np.float64) / 1e3) * 1e3
        out[name] = {
            "mean_completion_rounds": round(float(np.mean(lat)), 2),
            "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
            "max_completion_rounds": round(float(np.max(lat)), 2),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse
    import importlib.metadata

    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ladder", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--load-below", type=float, default=0.7, help="x stock's capacity")
    ap.add_argument("--load-above", type=float, default=1.5, help="x stock's capacity")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help="a subset to serve (fcfs-mixed always runs: the overload regime's rate is set "
        "from it; write the result elsewhere than the full ladder's JSON)",
    )
    ap.add_argument(
        "--cap-fractions",
        default="",
        help="also serve dwise with starvation_cap = F x fcfs-mixed's rounds in the same "
        "regime, per F listed (labelled dwise@capF; benchmarks/aging.py sweeps F)",
    )
    ap.add_argument(
        "--slacks",
        default="",
        help="also serve dwise with starvation_slack = C, per C listed (labelled dwise@slackC)",
    )
    ap.add_argument(
        "--projected-caps",
        default="",
        help="as --cap-fractions on the projected clock: promoted in time to finish by the cap "
        "(labelled dwise@pcapF)",
    )
    ap.add_argument(
        "--projected-slacks",
        default="",
        help="as --slacks on the projected clock (labelled dwise@pslackC)",
    )
    ap.add_argument(
        "--dws-admission",
        action="store_true",
        help="also serve dwise with DWISE_SGLANG_ADMISSION=lightgbm+dws (the admission "
        "estimate averaged with the DWS surface's expected rounds; labelled dwise@dws)",
    )
    ap.add_argument(
        "--mix",
        choices=("stratified", "split"),
        default="stratified",
        help="stratified: round-robin over categories (the ladder's); split: the eval split's "
        "first requests, in its own mix (most of them chat, math and mcq)",
    )
    ap.add_argument(
        "--rates-from",
        metavar="JSON",
        help="take the Poisson regimes' rates from an earlier ladder's JSON (its burst "
        "capacities) instead of serving the burst first: serve one regime alone, with the "
        "same arrival rounds as that ladder's (same --requests, --mix and --seed)",
    )
    ap.add_argument(
        "--save-tracks",
        metavar="DIR",
        help="write each served run's record (SGLang's queue order, arrival rounds, every "
        "request's rounds per block and estimates, every round's batch) to "
        "DIR/REGIME.POLICY.tracks.json, to compare a run with its replay (--check-replays)",
    )
    ap.add_argument(
        "--check-replays",
        metavar="DIR",
        help="with --from-json: replay every run saved in DIR by --save-tracks and compare the "
        "round each request finished in, served against replayed (written beside the JSON as "
        "NAME.replays.json); serve nothing",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/results/sglang_ladder.json")
    ap.add_argument("--plot", default="docs/img/sglang-ladder.png", help="the gain-per-rung plot")
    ap.add_argument(
        "--tails-plot",
        default="docs/img/sglang-tails.png",
        help="with anti-starvation variants: gain kept against the p99 ratio, per rule",
    )
    ap.add_argument(
        "--from-json", metavar="JSON", help="print and plot a finished run's JSON, serve nothing"
    )
    args = ap.parse_args(argv)
    if args.from_json:
        import json

        doc = json.loads(Path(args.from_json).read_text())
        if args.check_replays:
            checks = check_replays(Path(args.check_replays), doc)
            print(
                f"{'run':34s} {'requests':>8s} {'differ':>6s} {'max':>4s} {'served':>9s} replayed"
            )
            for name, c in checks.items():
                print(
                    f"{name:34s} {c['requests']:8d} {c['finish_round_differs']:6d} "
                    f"{c['max_abs_rounds']:4d} {c['served_mean_completion_rounds']:9.2f} "
                    f"{c['replayed_mean_completion_rounds']:.2f}"
                )
            from dwise_predict.atomic import write_json

            out = Path(args.from_json).with_suffix(".replays.json")
            differ = [name for name, c in checks.items() if c["finish_round_differs"]]
            write_json(
                out,
                {
                    "command": "python benchmarks/sglang_ladder.py "
                    + " ".join(sys.argv[1:] if argv is None else argv),
                    "ladder": args.from_json,
                    "runs_checked": len(checks),
                    "runs_with_a_request_in_another_round": differ,
                    "runs": checks,
                },
            )
            print(f"{len(checks)} runs replayed, {len(differ)} with a request in another round")
            print(f"wrote {out}")
            return 0 if not differ else 1
        print_table(doc)
        print_sweep(doc)
        first = next(iter(doc["regimes"].values()))
        if all(p in first["runs"] for p in RUNGS):
            print(f"wrote {plot(doc, Path(args.plot))}")
        if any("simulator_cap_sweep" in r for r in doc["regimes"].values()):
            print(f"wrote {plot_tails(doc, Path(args.tails_plot))}")
        return 0
    command = ".venv-sglang/bin/python benchmarks/sglang_scheduler.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang_plugin"))
    from harness import TinyBDRunner, eval_requests, install_torchvision_shim

    install_torchvision_shim()
    from dwise_predict.atomic import write_json

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if args.save_tracks:
        Path(args.save_tracks).mkdir(parents=True, exist_ok=True)
    runner = TinyBDRunner(block_size=BLOCK_SIZE, memo=True)
    reqs = eval_requests(
        args.requests,
        runner,
        max_new_tokens=args.max_new_tokens,
        stratified=args.mix == "stratified",
    )
    mix = {c: sum(r.category == c for r in reqs) for c in sorted({r.category for r in reqs})}
    print(f"{len(reqs)} eval-split requests, {args.mix}: {mix}", flush=True)
    doc: dict[str, Any] = {
        "command": command,
        "sglang_version": importlib.metadata.version("sglang"),
        "requests": len(reqs),
        "slots": args.slots,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "mix_kind": args.mix,
        "mix": mix,
        "regimes": {},
    }
    oracle_file = out_path.with_suffix(".oracle.json")
    wanted = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = sorted(set(wanted) - set(POLICIES))
    if unknown:
        raise SystemExit(f"unknown policies {unknown}; choose from {', '.join(POLICIES)}")
    if "oracle" in wanted and "dwise" not in wanted:
        raise SystemExit("oracle reads the burst dwise run's record: list dwise too")
    variants = [
        f"dwise@{rule}{float(v):g}"
        for rule, values in (
            ("cap", args.cap_fractions),
            ("slack", args.slacks),
            ("pcap", args.projected_caps),
            ("pslack", args.projected_slacks),
        )
        for v in values.split(",")
        if v.strip()
    ]
    tail_variants = list(variants)  # the anti-starvation ones: they get the simulator's grid
    if args.dws_admission:
        variants.append(f"dwise@{DWS_RULE}")
    # fcfs-mixed first: the capped dwise runs are sized from its rounds in the same regime
    served = ["fcfs-mixed", *[p for p in POLICIES if p in wanted and p != "fcfs-mixed"]]
    doc["policies"] = served + variants
    capacity: float | None = None  # stock's requests per round in the burst
    capacity_mixed: float | None = None  # fcfs-mixed's
    if args.rates_from:
        import json

        earlier = json.loads(Path(args.rates_from).read_text())
        if earlier["requests"] != len(reqs) or earlier.get("mix_kind", "stratified") != args.mix:
            raise SystemExit(
                f"{args.rates_from} served {earlier['requests']} requests "
                f"({earlier.get('mix_kind', 'stratified')} mix), not {len(reqs)} ({args.mix}): "
                "its rates would not give the same arrivals; match --requests and --mix"
            )
        capacity = earlier["stock_capacity_requests_per_round"]
        capacity_mixed = earlier["fcfs_mixed_capacity_requests_per_round"]
        doc["rates_from"] = args.rates_from
    for regime in args.regimes.split(","):
        rate = None
        if regime != "burst":
            if capacity_mixed is None or (capacity is None and regime != "poisson-overload"):
                raise SystemExit(
                    "the Poisson regimes are set from the burst run (stock's capacity, or "
                    "fcfs-mixed's for poisson-overload): run it first, with stock for the others"
                )
            load = args.load_below if regime == "poisson-below" else args.load_above
            rate = load * (capacity_mixed if regime == "poisson-overload" else capacity)
        arrive = arrival_rounds(regime, len(reqs), rate, args.seed)
        runs: dict[str, Any] = {}
        states: dict[str, Any] = {}
        settings: dict[str, dict[str, Any]] = {}
        for policy in served + variants:
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            if "@" in policy:
                settings[policy] = variant_settings(policy, runs["fcfs-mixed"]["rounds"])[1]
                extra = settings[policy]
            name = policy.split("@")[0]
            res, state = serve_policy(
                PAPER_NAMES.get(name, name),
                reqs,
                arrive,
                runner,
                args.slots,
                args.k,
                oracle_file,
                extra,
            )
            runs[policy] = summarize(res, reqs)
            runs[policy].update(settings.get(policy, {}))
            states[policy] = state
            if args.save_tracks and state is not None:
                write_json(
                    Path(args.save_tracks) / f"{regime}.{policy}.tracks.json",
                    {
                        "order": [s.rid for s in reqs],  # SGLang's queue order: ties follow it
                        "arrival_rounds": dict(zip((s.rid for s in reqs), arrive)),
                        "tracks": tracks_of(state),
                        "batches": res.batches,
                    },
                )
            if policy == "stock" and regime == "burst" and not args.rates_from:
                capacity = len(reqs) / res.rounds
            if policy == "fcfs-mixed" and regime == "burst" and not args.rates_from:
                capacity_mixed = len(reqs) / res.rounds
            if policy == "dwise" and regime == "burst":
                # the oracle's knowledge: each request's forwards, as this run spent them
                write_json(oracle_file, {r: t["forwards"] for r, t in tracks_of(state).items()})
            print(
                f"{regime:14s} {policy:16s} mean {runs[policy]['mean_completion_rounds']:>9} "
                f"p99 {runs[policy]['p99_completion_rounds']:>9} "
                f"finished {runs[policy]['finished']}/{len(reqs)} "
                f"({time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
        tracks = tracks_of(states["dwise" if "dwise" in states else "fcfs-mixed"])
        costs = (
            {r: t["cost_ms"] for r, t in tracks_of(states["dws-sjf"]).items() if t["cost_ms"]}
            if "dws-sjf" in states
            else {}
        )
        kv_pool = int(runs["stock" if "stock" in runs else "fcfs-mixed"]["kv_free_before"])
        plain = [p for p in runs if not p.endswith(f"@{DWS_RULE}")]
        sim = simulate_regime(
            tracks, costs, reqs, arrive, args.slots, args.k, kv_pool, plain, settings
        )
        for label in set(runs) - set(plain):  # replayed with the estimates that run ranked by
            sim.update(
                simulate_regime(
                    tracks_of(states[label]),
                    costs,
                    reqs,
                    arrive,
                    args.slots,
                    args.k,
                    kv_pool,
                    [label],
                    settings,
                )
            )
        for policy in runs:
            real = runs[policy]["mean_completion_rounds"]
            sim[policy]["mean_rel_diff"] = round(
                sim[policy]["mean_completion_rounds"] / real - 1, 4
            )
        sweep = {}
        if tail_variants and "dwise" in runs:
            # the same requests and arrivals in the simulator, at more settings than served
            grid = [round(0.05 * i, 2) for i in range(2, 15)]
            # the projected cap is a completion target: finer where fcfs-mixed's p99 lies
            pgrid = sorted({*grid, *(round(0.025 * i, 3) for i in range(6, 19))})
            labels = [f"dwise@cap{f:g}" for f in grid]
            labels += [f"{pol}@pcap{f:g}" for pol in ("dwise", "oracle") for f in pgrid]
            slacks = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5)
            labels += [f"dwise@{rule}{c:g}" for rule in ("slack", "pslack") for c in slacks]
            grid_settings = {
                label: variant_settings(label, runs["fcfs-mixed"]["rounds"])[1] for label in labels
            }
            sweep = simulate_regime(
                tracks, costs, reqs, arrive, args.slots, args.k, kv_pool, labels, grid_settings
            )
            for label, setting in grid_settings.items():
                sweep[label].update(setting)
        doc["regimes"][regime] = {
            "arrival": "burst" if rate is None else f"poisson: {rate:.5f} requests/round",
            "rate_per_round": rate,
            "runs": runs,
            "simulator": sim,
        }
        if sweep:
            doc["regimes"][regime]["simulator_cap_sweep"] = sweep
        if rate is None:
            work = [t["prompt_tokens"] // BLOCK_SIZE + t["forwards"] for t in tracks.values()]
            best = spt_mean_completion(work, args.slots)
            doc["regimes"][regime]["optimum"] = {
                "mean_completion_rounds": round(best, 2),
                "gain_over_fcfs_mixed": round(
                    runs["fcfs-mixed"]["mean_completion_rounds"] / best, 3
                ),
                "why": "every request arrives at round 0 and runs at most one block a round on "
                "one of B rows: shortest-work-first is optimal for the mean completion then "
                "(P|pmtn|sum C_j; preemption does not help), so no policy beats this mean",
            }
        write_json(out_path, doc)  # after every regime: a long run loses little
    doc["stock_capacity_requests_per_round"] = capacity
    doc["fcfs_mixed_capacity_requests_per_round"] = capacity_mixed
    write_json(out_path, doc)
    print_table(doc)
    print_sweep(doc)
    if all(p in served for p in RUNGS):
        print(f"wrote {out_path} and {plot(doc, Path(args.plot))}")
    else:
        print(f"wrote {out_path} (no ladder plot: not every rung was served)")
    if tail_variants:
        print(f"wrote {plot_tails(doc, Path(args.tails_plot))}")
    return 0


RUNGS = ("fcfs-mixed", "dwise-r0", "dwise-admission", "dwise", "oracle")


def mix_label(doc: dict[str, Any]) -> str:
    """ "split-mix " for a run of the eval split's own mix, "" for the stratified ladder."""
    return "split-mix " if doc.get("mix_kind") == "split" else ""


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Gain in mean completion over fcfs-mixed, per rung, one line per arrival regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for regime in [r for r in REGIMES if r in doc["regimes"]]:
        r = doc["regimes"][regime]
        base = r["runs"]["fcfs-mixed"]["mean_completion_rounds"]
        gains = [base / r["runs"][p]["mean_completion_rounds"] for p in RUNGS]
        line = ax.plot(RUNGS, gains, marker="o", label=f"{regime} ({r['arrival']})")[0]
        dws = r["runs"].get(f"dwise@{DWS_RULE}")
        if dws is not None:  # dwise with the lightgbm+dws admission estimate
            ax.scatter(
                ["dwise"],
                [base / dws["mean_completion_rounds"]],
                marker="*",
                s=90,
                color=line.get_color(),
                zorder=5,
            )
    if any(f"dwise@{DWS_RULE}" in r["runs"] for r in doc["regimes"].values()):
        ax.scatter([], [], marker="*", s=90, color="grey", label="dwise, lightgbm+dws admission")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_ylabel("mean completion, gain over fcfs-mixed")
    ax.set_title(
        f"DWISE's ladder in SGLang {doc['sglang_version']}'s real loop "
        f"(tiny-bd, {doc['requests']} {mix_label(doc)}requests, B = {doc['slots']}, "
        f"k = {doc['k']})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: the rules of the tails plot: the grid's label prefix, legend, marker
TAIL_RULES = (
    ("dwise@cap", "cap, age clock", "o"),
    ("dwise@pcap", "cap, projected clock", "v"),
    ("dwise@slack", "slack, age clock", "D"),
    ("dwise@pslack", "slack, projected clock", "P"),
    ("oracle@pcap", "oracle, projected cap", "x"),
)


def _trades(regime: dict[str, Any]) -> bool:
    """A regime with an anti-starvation grid where dwise's mean differs from fcfs-mixed's (below
    capacity no queue forms, every rule serves as fcfs-mixed does and there is nothing to trade)."""
    if "simulator_cap_sweep" not in regime:
        return False
    sim = regime["simulator"]
    g0 = sim["fcfs-mixed"]["mean_completion_rounds"] / sim["dwise"]["mean_completion_rounds"]
    return abs(g0 - 1) >= 1e-3


def plot_tails(doc: dict[str, Any], path: Path) -> Path:
    """Gain kept against the p99 ratio to fcfs-mixed, per anti-starvation rule: the
    simulator's grid as lines, the served runs as filled markers; one panel per regime."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = [r for r in REGIMES if _trades(doc["regimes"].get(r, {}))]
    fig, axes = plt.subplots(1, len(regimes), figsize=(5.2 * len(regimes), 4.4), squeeze=False)
    for ax, regime in zip(axes[0], regimes):
        r = doc["regimes"][regime]
        base = r["simulator"]["fcfs-mixed"]
        g0 = base["mean_completion_rounds"] / r["simulator"]["dwise"]["mean_completion_rounds"]

        def point(v: dict[str, Any], base: dict[str, Any] = base, g0: float = g0) -> tuple:
            g = base["mean_completion_rounds"] / v["mean_completion_rounds"]
            p99 = v["p99_completion_rounds"] / base["p99_completion_rounds"]
            return p99, (g - 1) / (g0 - 1)

        variants = {
            k: v
            for k, v in r["runs"].items()
            if ("@" in k and not k.endswith(f"@{DWS_RULE}")) or k == "dwise"
        }
        xs = [point(v)[0] for v in [*r["simulator_cap_sweep"].values(), *variants.values()]]
        lo, hi = min(0.95, min(xs)) - 0.03, max(1.05, max(xs)) + 0.03
        ax.fill_between([lo, 1.0], 0.9, 1.3, color="green", alpha=0.12, label="goal")
        ax.set_xlim(lo, hi)
        for prefix, label, marker in TAIL_RULES:
            pts = [
                point(v)
                for k, v in r["simulator_cap_sweep"].items()
                if k.startswith(prefix) and k[len(prefix)].isdigit()
            ]
            if pts:
                ax.scatter(*zip(*pts), marker=marker, s=18, label=f"{label} (simulator)")
        served = r["runs"]
        base_real = served["fcfs-mixed"]
        g0_real = base_real["mean_completion_rounds"] / served["dwise"]["mean_completion_rounds"]
        real = [point(v, base_real, g0_real) for v in variants.values()]
        ax.scatter(*zip(*real), s=40, color="black", zorder=5, label="served in SGLang's loop")
        ax.axvline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_ylim(-0.3, 1.25)
        ax.set_xlabel("p99 completion / fcfs-mixed's p99")
        ax.set_ylabel("share of dwise's mean gain kept")
        ax.set_title(f"{regime} ({r['arrival']})", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    fig.suptitle(
        f"Anti-starvation rules in SGLang {doc['sglang_version']}'s loop (tiny-bd, "
        f"{doc['requests']} requests, B = {doc['slots']}, k = {doc['k']})",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(doc: dict[str, Any]) -> None:
    print(
        f"\n{'regime':18s}{'policy':17s}{'mean':>9s}{'p99':>9s}{'max':>7s}{'vs fcfs-mixed':>15s}"
        f"{'sim mean':>10s}{'diff':>8s}"
    )
    for regime in [r for r in REGIMES if r in doc["regimes"]]:
        r = doc["regimes"][regime]
        base = r["runs"]["fcfs-mixed"]["mean_completion_rounds"]
        for policy in r["runs"]:
            run = r["runs"][policy]
            sim = r["simulator"][policy]
            print(
                f"{regime:18s}{policy:17s}{run['mean_completion_rounds']:>9.1f}"
                f"{run['p99_completion_rounds']:>9.1f}{run['max_completion_rounds']:>7d}"
                f"{base / run['mean_completion_rounds']:>14.2f}x"
                f"{sim['mean_completion_rounds']:>10.1f}{sim['mean_rel_diff']:>8.1%}"
            )


def print_sweep(doc: dict[str, Any]) -> None:
    """The simulator's anti-starvation grid per regime, against the tail goal: the share of
    dwise's mean gain over fcfs-mixed kept, (G - 1) / (G0 - 1), and the p99 and max ratios."""
    for regime in [r for r in REGIMES if "simulator_cap_sweep" in doc["regimes"].get(r, {})]:
        r = doc["regimes"][regime]
        base = r["simulator"]["fcfs-mixed"]
        g0 = base["mean_completion_rounds"] / r["simulator"]["dwise"]["mean_completion_rounds"]
        print(f"\n{regime}: the simulator's grid (gain kept, p99 and max / fcfs-mixed's)")
        if not _trades(r):
            print("  no queue forms: every rule serves as fcfs-mixed does, nothing to trade")
            continue
        for label, v in r["simulator_cap_sweep"].items():
            g = base["mean_completion_rounds"] / v["mean_completion_rounds"]
            kept = (g - 1) / (g0 - 1)
            p99 = v["p99_completion_rounds"] / base["p99_completion_rounds"]
            worst = v["max_completion_rounds"] / base["max_completion_rounds"]
            print(
                f"  {label:18s} mean {v['mean_completion_rounds']:>8.1f} "
                f"kept {kept:>5.2f} p99 {p99:.2f}x max {worst:.2f}x"
            )


if __name__ == "__main__":
    raise SystemExit(main())
