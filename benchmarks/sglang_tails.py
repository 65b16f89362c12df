"""Tails under overload in SGLang's real loop: the default ``dwise`` (DWISE with the tail guard of
``dwise_predict/runtime/tails.py``) against mixed-phase FCFS, plain DWISE and the oracle, and the
best schedule perfect knowledge finds under the tail constraint.

Served through the ladder harness (``benchmarks/sglang_ladder.py``: SGLang's real scheduler
loop on CPU, tiny-bd computing the logits): ``--requests`` eval-split requests per mix
(``stratified``: round-robin over categories; ``split``: the split's own mix), B = 16, k = 8,
in the regimes ``burst``, ``poisson-above`` (1.5x stock SGLang's capacity) and
``poisson-overload`` (1.5x fcfs-mixed's), with the rates of the earlier ladders
(``--rates-from``), so the arrivals are the ladders' own. Policies: ``fcfs-mixed``,
``dwise-uncapped`` (the paper's DWISE), ``dwise`` (the default) and ``oracle`` (true remaining
work, from the burst run's record of each request).

Per run: mean, p99 and max completion rounds, ``slo5_share`` (the share of requests done
within 5x their isolated completion: their forwards, the rounds they take served alone),
finished, requests and the KV pool's free tokens before and after.

Per regime, ``best_constrained``: the lowest mean completion found offline with perfect
knowledge (the served requests' true work, arrivals, B, k and KV pool) subject to p99 <=
fcfs-mixed's p99 and max <= 1.5x fcfs-mixed's max, each candidate a schedule the simulator
replays (it replays every served run exactly: ``sglang_ladder.py --check-replays``). The
search: SRPT by true remaining work guarded by per-request deadlines (earliest deadline first
once a request, or a deadline-ordered prefix of requests, could no longer make it), deadlines
first uniform (arrival + C), then improved locally (the few requests the p99 lets go get
deadlines at 1.5x fcfs-mixed's max, C raised while the replay stays feasible, violators' own
deadlines tightened).

Per regime also ``simulator_rules`` (the sweep's other rules, replayed: the guard's settings,
the projected cap and slack, HRRN on predicted work, a slowdown bound) and
``guard_with_true_work`` (the default's rule fed each request's true work: what an online rule
reaches with perfect estimates, against best_constrained's hindsight).

``at_scale``: the simulator at ``--at-scale`` paper-matched synthetic requests
(``burst+poisson:16``, B = 128, k = 8, as ``benchmarks/aging.py``), latencies in seconds;
``at_scale_grid``: every policy and rule of the sweep at ``--grid-at`` (4,096) of them.

    .venv-sglang/bin/python benchmarks/sglang_tails.py            # ~1 h on 2 busy cores
    .venv/bin/python benchmarks/sglang_tails.py --from-json benchmarks/results/sglang_tails.json

Writes ``benchmarks/results/sglang_tails.json`` and ``docs/img/sglang-tails-frontier.png``
(mean against p99 per rule, best_constrained marked).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang_plugin"))
from sglang_ladder import (  # noqa: E402 - benchmarks/sglang_ladder.py: the served ladder
    BLOCK_SIZE,
    arrival_rounds,
    serve_policy,
    sim_workload,
    tracks_of,
)

from dwise_predict.runtime.tails import PREFIX_BASE, URGENT_BASE  # noqa: E402

MIXES = ("stratified", "split")
REGIMES = ("burst", "poisson-above", "poisson-overload")
POLICIES = ("fcfs-mixed", "dwise-uncapped", "dwise", "oracle")
RATES_FROM = {
    "stratified": "benchmarks/results/sglang_ladder.json",
    "split": "benchmarks/results/sglang_ladder_split.json",
}
#: the tail constraint of best_constrained, against fcfs-mixed's run in the same regime
MAX_RATIO = 1.5
SLO_FACTOR = 5.0
BURST_P99_RATIO = 1.03


def figures(lat: np.ndarray, isolated: np.ndarray) -> dict[str, Any]:
    """Mean, p99, max completion and the SLO share, from per-request completion rounds."""
    return {
        "mean_completion_rounds": round(float(lat.mean()), 2),
        "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
        "max_completion_rounds": round(float(lat.max()), 2),
        "slo5_share": round(float(np.mean(lat <= SLO_FACTOR * isolated)), 4),
    }


def ensure_default() -> str:
    """The policy ``dwise`` names here. Until the registry's ``"dwise"`` line names the tail
    guard, register it for this process (the plugin, served in this process, reads the same
    registry) and say so in the JSON."""
    from dwise_predict.runtime.registry import make_policy, register_policy, unregister_policy
    from dwise_predict.runtime.tails import TailGuard

    if isinstance(make_policy("dwise"), TailGuard):
        return "registry"
    unregister_policy("dwise")
    register_policy("dwise", TailGuard, "DWISE with the tail guard (registered by the benchmark)")
    return "registered by benchmarks/sglang_tails.py for this process"


# -- best_constrained: oracle SRPT under per-request deadlines, replayed ----------------------
@dataclasses.dataclass(frozen=True)
class DeadlineOracle:
    """SRPT by true remaining work under per-request deadlines (``deadlines[seq]``, a round,
    by arrival order), promoted as the tail guard promotes (``runtime/tails.py``): a request
    whose own slack is at most ``margin`` rounds runs first, earliest deadline first; then the
    requests of the longest deadline-ordered prefix whose remaining work exceeds the measured
    blocks per round times the rounds to its last deadline, shortest first; then the rest."""

    deadlines: tuple[float, ...]
    margin: float = 0.0
    name: str = "best-constrained"
    batch_former: str = "mixed"
    preemptive: bool = True
    needs: frozenset[str] = frozenset({"true_rounds"})

    def key(self, table: Any, rows: np.ndarray, round_index: int) -> np.ndarray:
        live = np.concatenate((table.resident, table.waiting))
        d_all = np.asarray(self.deadlines)[table.seq[live]]
        rem = table.prompt_blocks[live] + table.r_true[live]
        order = np.argsort(d_all, kind="stable")
        tight = np.flatnonzero(
            np.cumsum(rem[order])
            > max(table.throughput, 1.0) * (d_all[order] - round_index - self.margin)
        )
        promoted = np.full(table.capacity, np.nan)
        if tight.size:
            prefix = order[: tight[-1] + 1]
            promoted[live[prefix]] = PREFIX_BASE + rem[prefix]
        late = d_all - round_index - rem <= self.margin
        promoted[live[late]] = URGENT_BASE + d_all[late]
        p = promoted[rows]
        return np.where(np.isnan(p), table.prompt_blocks[rows] + table.r_true[rows], p)


def replay_latency(wl: Any, policy: Any, arrive: np.ndarray, slots: int, k: int, kv: int) -> Any:
    """Completion rounds of every request (arrival order) in the simulator, 1 ms a round."""
    from dwise_predict.runtime import Arrivals, RoundTimeModel, simulate

    run = simulate(
        wl,
        policy,
        arrivals=Arrivals(np.arange(wl.n, dtype=np.int64), arrive / 1e3),
        slots=slots,
        k=k,
        round_time=RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0),
        kv_pool_tokens=kv,
    )
    return np.round(np.asarray(run.finish_time) * 1e3) - arrive


def best_constrained(
    wl: Any,
    arrive: np.ndarray,
    isolated: np.ndarray,
    slots: int,
    k: int,
    kv: int,
    p99_bound: float,
    max_bound: float,
    budget_s: float = 300.0,
) -> dict[str, Any]:
    """The lowest mean found under p99 <= ``p99_bound`` and max <= ``max_bound`` (module
    docstring); every candidate is a simulator replay, the figures are the best one's."""
    t0 = time.perf_counter()
    n = wl.n
    # np.percentile(99) interpolates between sorted[i] and sorted[i + 1]: the requests above
    # sorted[i + 1] may finish as late as the max bound allows
    free = n - 2 - int(np.floor(0.99 * (n - 1)))
    tried = 0
    best: tuple[float, dict[str, Any], np.ndarray, dict[int, float], float, float] | None = None

    def evaluate(cap: float, margin: float, overrides: dict[int, float]) -> tuple[bool, Any]:
        nonlocal tried, best
        d = arrive + cap
        for i, v in overrides.items():
            d[i] = v
        lat = replay_latency(wl, DeadlineOracle(tuple(d.tolist()), margin), arrive, slots, k, kv)
        tried += 1
        fig = figures(lat, isolated)
        ok = (
            np.percentile(lat, 99) <= p99_bound + 1e-9
            and lat.max() <= max_bound + 1e-9
            and bool(np.isfinite(lat).all())
        )
        if ok and (best is None or fig["mean_completion_rounds"] < best[0]):
            best = (fig["mean_completion_rounds"], fig, lat, dict(overrides), cap, margin)
        return ok, lat

    for frac in (0.8, 0.9, 0.95, 1.0, 1.05, 1.1, 1.2, 1.35):
        for margin in (0.0, 8.0):
            evaluate(frac * p99_bound, margin, {})
    if best is None:
        return {"found": False, "schedules_tried": tried}
    # local improvement around the best uniform deadline
    while time.perf_counter() - t0 < budget_s:
        _, _, lat, overrides, cap, margin = best
        before = best[0]
        late_first = np.argsort(-(lat + 0.001 * isolated))
        relaxed = {int(i): float(arrive[i] + max_bound - 1) for i in late_first[:free]}
        for cap2 in (cap * 1.02, cap * 1.05, cap * 1.1, cap * 1.2):
            for ov in (overrides, {**overrides, **relaxed}):
                ok, lat2 = evaluate(cap2, margin, ov)
                if not ok:  # the requests that missed get a deadline ahead of their miss
                    miss = [i for i in np.flatnonzero(lat2 > p99_bound) if int(i) not in relaxed]
                    tight = {int(i): float(arrive[i] + 2 * p99_bound - lat2[i] - 4) for i in miss}
                    if tight:
                        evaluate(cap2, margin, {**ov, **tight})
            if best[0] < before:
                break
        if best[0] >= before:
            break
    _, fig, _, overrides, cap, margin = best
    return {
        "found": True,
        **fig,
        "uniform_deadline_rounds": round(cap, 1),
        "margin_rounds": margin,
        "requests_with_own_deadline": len(overrides),
        "schedules_tried": tried,
        "search_s": round(time.perf_counter() - t0, 1),
        "constraint": {
            "p99_bound": p99_bound,
            "max_bound": max_bound,
            "met": True,  # only feasible replays are kept
        },
    }


# -- the served runs --------------------------------------------------------------------------
@dataclasses.dataclass
class Mix:
    """One mix being served: its requests, the model runner (whose forwards are memoized, so
    only a mix's first run pays for them), each regime's arrivals and what the runs left."""

    name: str
    runner: Any
    reqs: list[Any]
    entry: dict[str, Any]
    arrivals: dict[str, list[int]]
    oracle_file: Path
    tracks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    kv_pool: dict[str, int] = dataclasses.field(default_factory=dict)


def prepare_mix(args: argparse.Namespace, mix: str, doc: dict[str, Any], out: Path) -> Mix:
    """The mix's requests and each regime's arrivals, with the earlier ladder's rates."""
    from harness import TinyBDRunner, eval_requests

    earlier = json.loads(Path(args.rates_from[mix]).read_text())
    runner = TinyBDRunner(block_size=BLOCK_SIZE, memo=True)
    reqs = eval_requests(args.requests, runner, max_new_tokens=256, stratified=mix == "stratified")
    m = doc["mixes"].setdefault(mix, {"regimes": {}})
    if earlier["requests"] != len(reqs):  # rates are per round: a shorter run of the same load
        m["rates_note"] = (
            f"rates of a {earlier['requests']}-request ladder, here on {len(reqs)} requests"
        )
    m["mix"] = {c: sum(r.category == c for r in reqs) for c in sorted({r.category for r in reqs})}
    m["rates_from"] = args.rates_from[mix]
    arrivals = {}
    for regime in args.regimes.split(","):
        rate = None
        if regime == "poisson-overload":
            rate = 1.5 * earlier["fcfs_mixed_capacity_requests_per_round"]
        elif regime == "poisson-above":
            rate = 1.5 * earlier["stock_capacity_requests_per_round"]
        arrivals[regime] = arrival_rounds(regime, len(reqs), rate, 0)
        entry = m["regimes"].setdefault(regime, {"runs": {}})
        entry["arrival"] = "burst" if rate is None else f"poisson: {rate:.5f} requests/round"
        entry["rate_per_round"] = rate
    return Mix(mix, runner, reqs, m, arrivals, out.with_suffix(f".{mix}.oracle.json"))


def serving_order(wanted: list[str]) -> list[str]:
    """``dwise-uncapped`` first (its burst run records each request's work and estimates, which
    the oracle and the replays read), ``dwise`` last."""
    first = ("dwise-uncapped", "fcfs-mixed")
    order = [p for p in first if p in wanted]
    order += [p for p in POLICIES if p in wanted and p not in ("oracle", "dwise", *first)]
    order += [p for p in wanted if p not in POLICIES]
    return order + [p for p in ("oracle", "dwise") if p in wanted]


def serve_runs(args: argparse.Namespace, mix: Mix, policy: str, out: Path, doc: Any) -> None:
    """Serve ``policy`` in every regime of ``mix``; the figures go into ``doc``."""
    from dwise_predict.atomic import write_json

    reqs = mix.reqs
    for regime, arrive in mix.arrivals.items():
        entry = mix.entry["regimes"][regime]
        t0 = time.perf_counter()
        res, state = serve_policy(
            policy, reqs, arrive, mix.runner, args.slots, args.k, mix.oracle_file
        )
        lat = np.array(
            [res.completion_round[s.rid] - res.arrival_round[s.rid] for s in reqs], float
        )
        isolated = np.array([res.forwards[s.rid] for s in reqs], float)
        run = figures(lat, isolated)
        run.update(
            finished=len(res.completion_round),
            requests=len(reqs),
            kv_free_before=res.kv_free_before,
            kv_free_after=res.kv_free_after,
            rounds=res.rounds,
            wall_s=round(res.wall_seconds, 1),
        )
        entry["runs"][policy] = run
        mix.kv_pool.setdefault(regime, int(res.kv_free_before))
        if state is not None and "estimate" in state.core.policy.needs:
            tracks = mix.tracks.setdefault(regime, tracks_of(state))
            if regime == "burst" and not mix.oracle_file.exists():
                write_json(mix.oracle_file, {r: t["forwards"] for r, t in tracks.items()})
            if args.save_tracks:
                d = Path(args.save_tracks) / mix.name
                d.mkdir(parents=True, exist_ok=True)
                write_json(
                    d / f"{regime}.{policy}.tracks.json",
                    {
                        "order": [s.rid for s in reqs],
                        "categories": [s.category for s in reqs],
                        "arrival_rounds": arrive,
                        "tracks": tracks_of(state),
                    },
                )
        print(
            f"{mix.name:11s}{regime:18s}{policy:16s}mean {run['mean_completion_rounds']:>9} "
            f"p99 {run['p99_completion_rounds']:>9} max {run['max_completion_rounds']:>7} "
            f"slo5 {run['slo5_share']:.3f} finished {run['finished']}/{len(reqs)} "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        write_json(out, doc)


def finish_mix(args: argparse.Namespace, mix: Mix) -> None:
    """Replay each regime and search its best_constrained."""
    reqs = [(s.rid, s.category) for s in mix.reqs]
    for regime, arrive in mix.arrivals.items():
        entry = mix.entry["regimes"][regime]
        if regime in mix.tracks and "fcfs-mixed" in entry["runs"]:
            simulate_regime(entry, mix.tracks[regime], reqs, arrive, args, mix.kv_pool[regime])


def finish_from_tracks(args: argparse.Namespace, doc: dict[str, Any], tracks_dir: Path) -> None:
    """Each regime's replays and best_constrained from the tracks a served run saved
    (``--save-tracks``), without serving again."""
    for mix, m in doc["mixes"].items():
        for regime, entry in m["regimes"].items():
            path = tracks_dir / mix / f"{regime}.dwise-uncapped.tracks.json"
            saved = json.loads(path.read_text())
            reqs = list(zip(saved["order"], saved["categories"]))
            kv = int(entry["runs"]["fcfs-mixed"]["kv_free_before"])
            t0 = time.perf_counter()
            simulate_regime(entry, saved["tracks"], reqs, saved["arrival_rounds"], args, kv)
            print(f"{mix} {regime}: replayed and searched ({time.perf_counter() - t0:.0f} s)")


# -- the other rules of the sweep (simulator only) ---------------------------------------------
@dataclasses.dataclass(frozen=True)
class HRRN:
    """Highest response ratio next on predicted work, the rule SGLang merged upstream: the
    largest (wait + remaining) / remaining runs first (wait = rounds waited, not run)."""

    name: str = "hrrn"
    batch_former: str = "mixed"
    preemptive: bool = True
    needs: frozenset[str] = frozenset({"estimate", "refined"})

    def key(self, table: Any, rows: np.ndarray, round_index: int) -> np.ndarray:
        rem = table.prompt_blocks[rows] + table.r_hat[rows] + 1.0
        wait = round_index - table.arrival_round[rows] - table.attained[rows]
        return np.asarray(-(wait + rem) / rem)


@dataclasses.dataclass(frozen=True)
class SlowdownBound:
    """Plain DWISE that promotes a request (oldest first) once its projected slowdown,
    (rounds since arrival + remaining) / its estimated total, would exceed ``bound``."""

    bound: float = 5.0
    name: str = "slowdown"
    batch_former: str = "mixed"
    preemptive: bool = True
    needs: frozenset[str] = frozenset({"estimate", "refined"})

    def key(self, table: Any, rows: np.ndarray, round_index: int) -> np.ndarray:
        rem = table.prompt_blocks[rows] + table.r_hat[rows]
        total = table.prompt_total[rows] + table.done_rounds[rows] + table.r_hat[rows]
        elapsed = round_index - table.arrival_round[rows]
        late = (elapsed + rem) / np.maximum(total, 1.0) > self.bound
        return np.where(late, URGENT_BASE + table.arrival_round[rows], rem)


#: the other rules of the plot (simulator only): label -> (policy name, settings)
RULES: dict[str, tuple[str, dict[str, Any]]] = {
    **{f"dwise@pcap{f:g}": ("dwise-uncapped", {"pcap": f}) for f in (0.2, 0.25, 0.3, 0.4)},
    **{f"dwise@slack{c:g}": ("dwise-uncapped", {"starvation_slack": c}) for c in (1.0, 1.5)},
    **{f"tails@scale{c:g}": ("tails", {"scale": c}) for c in (0.8, 0.9, 1.1, 1.25)},
    **{f"tails@margin{m:g}": ("tails", {"margin": m}) for m in (8.0, 32.0)},
    **{f"tails@q{q:g}": ("tails", {"quantile": q}) for q in (0.99, 0.995)},
    "hrrn": ("hrrn", {}),
    **{f"slowdown@{b:g}": ("slowdown", {"bound": b}) for b in (3.0, 5.0, 10.0)},
}


#: the plot's marker per rule family (a RULES label without its number)
FAMILY_MARKERS = {
    "dwise@pcap": "v",
    "dwise@slack": "P",
    "tails@scale": "1",
    "tails@margin": "2",
    "tails@q": "3",
    "hrrn": "h",
    "slowdown@": "x",
}


def rule_policy(label: str, fcfs_rounds: int) -> Any:
    """A policy of :data:`RULES` (a projected cap as a fraction of fcfs-mixed's rounds)."""
    from dwise_predict.runtime import make_policy
    from dwise_predict.runtime.tails import TailGuard

    name, settings = RULES[label]
    if name == "tails":
        return TailGuard(**settings, name=label)
    if name == "hrrn":
        return HRRN()
    if name == "slowdown":
        return SlowdownBound(**settings)
    if "pcap" in settings:
        cap = round(settings["pcap"] * fcfs_rounds)
        return make_policy(name, starvation_cap=cap, starvation_clock="projected")
    return make_policy(name, **settings)


def simulate_regime(
    entry: dict[str, Any],
    tracks: dict[str, Any],
    reqs: list[tuple[str, str]],
    arrive: list[int],
    args: argparse.Namespace,
    kv: int,
) -> None:
    """The regime's replays (each served policy, beside its served figures; the other rules
    of the plot) and the best_constrained search, on the served requests' true work
    (``reqs``: (request id, category) in arrival order)."""
    from dwise_predict.runtime import make_policy

    ensure_default()
    wl = sim_workload(tracks, reqs, {})
    a = np.asarray(arrive, dtype=np.float64)
    isolated = (wl.prompt_blocks + wl.total_rounds).astype(np.float64)
    sim = {}
    for policy in entry["runs"]:
        lat = replay_latency(wl, make_policy(policy), a, args.slots, args.k, kv)
        sim[policy] = figures(lat, isolated)
    entry["simulator"] = sim
    rules = {}
    for label in RULES:
        policy = rule_policy(label, int(entry["runs"]["fcfs-mixed"]["rounds"]))
        rules[label] = figures(replay_latency(wl, policy, a, args.slots, args.k, kv), isolated)
    entry["simulator_rules"] = rules
    # the same rule fed each request's true work: what the online guard could reach with
    # perfect estimates (best_constrained also knows the run's final fcfs-mixed p99)
    true_work = wl.total_rounds.astype(np.float64)
    known = dataclasses.replace(wl, admission=true_work, refined=true_work)
    entry["guard_with_true_work"] = figures(
        replay_latency(known, make_policy("dwise"), a, args.slots, args.k, kv), isolated
    )
    fcfs = entry["runs"]["fcfs-mixed"]
    entry["best_constrained"] = best_constrained(
        wl,
        a,
        isolated,
        args.slots,
        args.k,
        kv,
        float(fcfs["p99_completion_rounds"]),
        MAX_RATIO * float(fcfs["max_completion_rounds"]),
        budget_s=args.search_s,
    )
    print(f"  best_constrained: {entry['best_constrained']}", flush=True)


# -- at scale ---------------------------------------------------------------------------------
def at_scale(
    n: int,
    policies: list[str],
    done: dict[str, Any] | None = None,
    rules: bool = False,
) -> dict[str, Any]:
    """The paper-matched synthetic workload in the simulator (seconds; isolated completion =
    the request's rounds alone, each priced by the round-time model with one slot filled).
    ``rules``: also every rule of :data:`RULES` (the sweep's grid; a projected cap is a
    fraction of fcfs-mixed's rounds in the same run)."""
    import dwise_predict.runtime.simulator as simulator
    from dwise_predict.runtime import RoundTimeModel, make_policy, simulate, synthetic_workload

    w = synthetic_workload("paper-llada2.1-mini", n=n, seed=0)
    rt = RoundTimeModel()
    ctx = w.prompt_tokens.astype(np.float64)  # the context a request attends to, at least
    work = (w.prompt_blocks + w.total_rounds).astype(np.float64)
    isolated = work * (rt.overhead_ms + rt.per_slot_ms) / 1e3 + (
        work * rt.per_slot_per_1k_context_ms * ctx / 1e6
    )
    made: list[Any] = []

    class Recording(simulator.Scheduler):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            made.append(self)

    out: dict[str, Any] = dict(done or {})  # runs of an earlier call, kept
    original = simulator.Scheduler
    simulator.Scheduler = Recording
    try:
        ensure_default()
        todo = [(name, lambda name=name: make_policy(name)) for name in policies]
        if rules:
            todo += [
                (label, lambda label=label: rule_policy(label, out["fcfs-mixed"]["rounds"]))
                for label in RULES
            ]
        for name, build in todo:
            t0 = time.perf_counter()
            run = simulate(w, build(), arrivals="burst+poisson:16", slots=128, k=8)
            lat = np.asarray(run.finish_time - run.arrival_time)
            sched = made[-1]
            out[name] = {
                "mean_completion_s": round(float(lat.mean()), 2),
                "p99_completion_s": round(float(np.percentile(lat, 99)), 2),
                "max_completion_s": round(float(lat.max()), 2),
                "slo5_share": round(float(np.mean(lat <= SLO_FACTOR * isolated)), 4),
                "finished": int(np.isfinite(run.finish_time).sum()),
                "requests": n,
                "kv_free_before": int(sched.kv.limit_tokens),
                "kv_free_after": int(sched.kv.limit_tokens - sched.kv.reserved),
                "rounds": int(run.round_ms.size),
                "wall_s": round(time.perf_counter() - t0, 1),
            }
            print(f"at scale {n}: {name} {out[name]}", flush=True)
    finally:
        simulator.Scheduler = original
    if not {"fcfs-mixed", "dwise-uncapped"} <= set(out):
        return {"requests": n, "arrivals": "burst+poisson:16", "slots": 128, "k": 8, "runs": out}
    base, plain = out["fcfs-mixed"]["mean_completion_s"], out["dwise-uncapped"]["mean_completion_s"]
    g0 = base / plain
    for v in out.values():
        g = base / v["mean_completion_s"]
        v["gain_over_fcfs_mixed"] = round(g, 3)
        v["gain_kept"] = round((g - 1) / (g0 - 1), 3)
        v["p99_over_fcfs_mixed"] = round(
            v["p99_completion_s"] / out["fcfs-mixed"]["p99_completion_s"], 4
        )
    return {"requests": n, "arrivals": "burst+poisson:16", "slots": 128, "k": 8, "runs": out}


# -- checks and the plot ----------------------------------------------------------------------
def must_show(doc: dict[str, Any]) -> dict[str, Any]:
    """The issue's bars, each with the measured ratio."""
    out: dict[str, Any] = {}
    for mix, m in doc.get("mixes", {}).items():
        for regime, r in m["regimes"].items():
            runs = r["runs"]
            if not {"fcfs-mixed", "dwise"} <= set(runs):
                continue
            f, d = runs["fcfs-mixed"], runs["dwise"]
            p99_bar = BURST_P99_RATIO if regime == "burst" else 1.0
            checks: dict[str, Any] = {
                "p99_ratio": round(d["p99_completion_rounds"] / f["p99_completion_rounds"], 4),
                "max_ratio": round(d["max_completion_rounds"] / f["max_completion_rounds"], 4),
                "mean_ratio": round(d["mean_completion_rounds"] / f["mean_completion_rounds"], 4),
                "slo5_diff": round(d["slo5_share"] - f["slo5_share"], 4),
            }
            ok = (
                checks["p99_ratio"] <= p99_bar
                and checks["max_ratio"] <= MAX_RATIO
                and checks["mean_ratio"] <= 1.0
                and checks["slo5_diff"] >= 0
            )
            if regime == "burst" and "dwise-uncapped" in runs:
                checks["mean_over_uncapped"] = round(
                    d["mean_completion_rounds"] / runs["dwise-uncapped"]["mean_completion_rounds"],
                    4,
                )
                ok = ok and checks["mean_over_uncapped"] <= 1.05
            bc = r.get("best_constrained", {})
            if regime == "poisson-overload" and bc.get("found"):
                checks["mean_over_best_constrained"] = round(
                    d["mean_completion_rounds"] / bc["mean_completion_rounds"], 4
                )
                ok = ok and checks["mean_over_best_constrained"] <= 1.10
                if "oracle" in runs:
                    checks["best_constrained_over_oracle"] = round(
                        bc["mean_completion_rounds"] / runs["oracle"]["mean_completion_rounds"], 4
                    )
                    ok = ok and checks["best_constrained_over_oracle"] >= 0.9
            checks["all_finished_no_kv_leak"] = all(
                v["finished"] == v["requests"] and v["kv_free_after"] == v["kv_free_before"]
                for v in runs.values()
            )
            checks["met"] = bool(ok and checks["all_finished_no_kv_leak"])
            out[f"{mix} {regime}"] = checks
    for key in ("at_scale", "at_scale_grid"):  # the grid's row: the same bars, for the record
        scale = doc.get(key, {}).get("runs", {})
        if {"fcfs-mixed", "dwise", "dwise-uncapped"} <= set(scale):
            d = scale["dwise"]
            out[key] = {
                "requests": doc[key]["requests"],
                "p99_ratio": d["p99_over_fcfs_mixed"],
                "gain_kept": d["gain_kept"],
                "met": d["p99_over_fcfs_mixed"] <= 1.0 and d["gain_kept"] >= 0.9,
            }
    return out


def plot(doc: dict[str, Any], path: Path) -> Path:
    """Mean against p99 per rule, per mix and regime with a trade-off; best_constrained
    marked, fcfs-mixed's p99 as the vertical line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (mix, regime, r)
        for mix, m in doc["mixes"].items()
        for regime, r in m["regimes"].items()
        if regime != "poisson-above"
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4.0), squeeze=False)
    markers = {"fcfs-mixed": "s", "dwise-uncapped": "o", "dwise": "*", "oracle": "D"}
    for ax, (mix, regime, r) in zip(axes[0], panels):
        families: dict[str, list[tuple[float, float]]] = {}
        for label, v in r.get("simulator_rules", {}).items():
            family = label.rstrip("0123456789.")
            families.setdefault(family, []).append(
                (v["p99_completion_rounds"], v["mean_completion_rounds"])
            )
        for family, pts in families.items():
            ax.scatter(
                *zip(*pts),
                s=12,
                alpha=0.7,
                marker=FAMILY_MARKERS.get(family, "."),
                label=f"{family} (simulator)",
            )
        for policy, v in r["runs"].items():
            ax.scatter(
                v["p99_completion_rounds"],
                v["mean_completion_rounds"],
                s=70 if policy == "dwise" else 40,
                marker=markers.get(policy, "o"),
                label=policy,
                zorder=5,
            )
        bc = r.get("best_constrained", {})
        if bc.get("found"):
            ax.scatter(
                bc["p99_completion_rounds"],
                bc["mean_completion_rounds"],
                marker="X",
                s=80,
                color="red",
                label="best_constrained",
                zorder=6,
            )
        ax.axvline(r["runs"]["fcfs-mixed"]["p99_completion_rounds"], color="grey", ls=":")
        ax.set_xlabel("p99 completion (rounds)")
        ax.set_ylabel("mean completion (rounds)")
        ax.set_title(f"{mix}, {regime}", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=5)
    fig.suptitle(
        "Mean against p99 in SGLang's loop (tiny-bd, 512 requests, B = 16, k = 8)", fontsize=9
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def serve_all(args: argparse.Namespace, doc: dict[str, Any], out: Path, before: Any = None) -> None:
    """Every policy in every mix and regime (policy by policy, ``dwise`` last; ``before(policy)``
    runs before a policy's first run), then each regime's replays and best_constrained."""
    from dwise_predict.atomic import write_json

    mixes = [prepare_mix(args, m, doc, out) for m in args.mixes.split(",") if m]
    for policy in serving_order([p for p in args.policies.split(",") if p]):
        if before is not None:
            before(policy)
        if policy == "dwise":
            doc["dwise_is"] = ensure_default()
        for mix in mixes:
            serve_runs(args, mix, policy, out, doc)
    for mix in mixes:
        finish_mix(args, mix)
        write_json(out, doc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--mixes", default=",".join(MIXES))
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--rates-from-stratified", default=RATES_FROM["stratified"])
    ap.add_argument("--rates-from-split", default=RATES_FROM["split"])
    ap.add_argument("--at-scale", type=int, default=100_000, help="0 skips the simulator rows")
    ap.add_argument(
        "--grid-at", type=int, default=4096, help="requests of the simulator's rule grid (0: none)"
    )
    ap.add_argument("--search-s", type=float, default=300.0, help="best_constrained budget")
    ap.add_argument("--save-tracks", metavar="DIR")
    ap.add_argument("--out", default="benchmarks/results/sglang_tails.json")
    ap.add_argument("--plot", default="docs/img/sglang-tails-frontier.png")
    ap.add_argument("--from-json", metavar="JSON", help="check and plot a finished run's JSON")
    ap.add_argument(
        "--tracks",
        metavar="DIR",
        help="with --from-json: redo each regime's replays and best_constrained from the "
        "tracks a served run saved there (--save-tracks), writing --out",
    )
    args = ap.parse_args(argv)
    args.rates_from = {"stratified": args.rates_from_stratified, "split": args.rates_from_split}
    if args.from_json:
        doc = json.loads(Path(args.from_json).read_text())
        if args.tracks:
            from dwise_predict.atomic import write_json

            finish_from_tracks(args, doc, Path(args.tracks))
            if args.grid_at:
                doc["at_scale_grid"] = at_scale(args.grid_at, list(POLICIES), rules=True)
            doc["must_show"] = must_show(doc)
            write_json(Path(args.out), doc)
            print(f"wrote {args.out}")
        print(json.dumps(must_show(doc), indent=1))
        print(f"wrote {plot(doc, Path(args.plot))}")
        return 0
    from dwise_predict.atomic import write_json

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {"mixes": {}}
    doc["command"] = "python benchmarks/sglang_tails.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    doc.update(requests=args.requests, slots=args.slots, k=args.k)
    if args.mixes:
        from harness import install_torchvision_shim

        install_torchvision_shim()
        import importlib.metadata

        doc["sglang_version"] = importlib.metadata.version("sglang")
        serve_all(args, doc, out)
    if args.grid_at:
        doc["at_scale_grid"] = at_scale(args.grid_at, list(POLICIES), rules=True)
        write_json(out, doc)
    if args.at_scale:
        doc["at_scale"] = at_scale(args.at_scale, ["fcfs-mixed", "dwise-uncapped", "dwise"])
        write_json(out, doc)
    doc["must_show"] = must_show(doc)
    write_json(out, doc)
    print(json.dumps(doc["must_show"], indent=1))
    print(f"wrote {out} and {plot(doc, Path(args.plot))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
