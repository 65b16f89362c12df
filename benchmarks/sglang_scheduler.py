"""Stock SGLang vs the dwise plugin, inside SGLang 0.5.23's real dLLM scheduler, on CPU.

A burst of eval-split requests (stratified over categories, long contexts included) is served
twice through SGLang's real Scheduler, Req, DllmManager, PrefillAdder, ScheduleBatch,
ReqToTokenPool, KV allocator, LowConfidence and HookRegistry, with a model runner whose logits
are tiny-bd's, computed on CPU from each request's full token context:

* ``sglang-fcfs``: stock (``--max-running-requests B``: B residents, B blocks a round,
  prefill-first);
* ``dwise-plugin``: the plugin loaded by ``load_plugins()`` from its entry point, with
  ``--max-running-requests k*B`` and the shipped tiny-bd bundle;
* ``observe``: the plugin in observe mode, with no bundle: SGLang's own rounds, serving traces
  written (checked: a trace per request, outputs and rounds equal to stock's).

The serving runs are saved next to the output (``FILE.runs.json``): the per-run figures and,
per request, what the simulator needs to replay it (prompt tokens, rounds per block, the
admission and refined estimates the plugin computed) and what each real run did with it
(forwards, first-block and completion rounds). Then the project's simulator replays the same
requests with the same B and k, and the two are printed side by side. Finally the plugin's own
per-round cost is measured at 1,024 residents + 3,072 waiting, alternating with the core
runtime's own cost in the same state (``benchmarks/scheduler.py``), so the ratio of the two is a
same-run figure.

    .venv-sglang/bin/python benchmarks/sglang_scheduler.py --requests 64 --slots 16 \
        --out benchmarks/results/sglang_scheduler.json

``--ladder`` runs DWISE's component ladder in three arrival regimes instead
(``benchmarks/sglang_ladder.py``).

Serving 64 requests takes about 25 minutes on a CPU. ``--from-runs FILE.runs.json`` recomputes
the simulator cross-check and the overhead from a saved runs file without serving again.

Needs ``make test-sglang``'s environment. Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from array import array
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

BLOCK_SIZE = 32
#: the CPU harness that drives SGLang's real scheduler classes is test equipment (tests/)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang_plugin"))
RUNS = ("sglang-fcfs", "dwise-plugin")


def _summary(res: Any, n: int, plugin_state: Any = None) -> dict[str, Any]:
    comp = list(res.completion_round.values())
    ttft = list(res.first_block_round.values())
    return {
        "rounds": res.rounds,
        "prefill_only_round_frac": round(res.prefill_only_rounds / max(1, res.rounds), 4),
        "filled_slots_per_round": round(res.filled_slots / max(1, res.rounds), 3),
        "mean_completion_rounds": round(statistics.mean(comp), 2) if comp else None,
        "mean_ttft_rounds": round(statistics.mean(ttft), 2) if ttft else None,
        "finished": len(comp),
        "requests": n,
        "kv_free_after": res.kv_free_after,
        "kv_free_before": res.kv_free_before,
        "req_slots_free_after": res.req_slots_free_after,
        "req_slots_free_before": res.req_slots_free_before,
        "kv_balanced_every_round": res.kv_balanced_every_round,
        "max_residents": res.max_residents,
        "refinements": None if plugin_state is None else plugin_state.stats.refinements,
        "plugin_us_per_round": (
            None if plugin_state is None else round(plugin_state.plugin_us_per_round, 1)
        ),
        "wall_s": round(res.wall_seconds, 1),
    }


def _per_request(res: Any) -> dict[str, dict[str, int]]:
    """What one real run did with each request (rounds are 1-based: round 1 is the first)."""
    return {
        rid: {
            "forwards": res.forwards.get(rid, 0),
            "prompt_forwards": res.prompt_forwards.get(rid, 0),
            "first_block_round": res.first_block_round.get(rid),
            "completion_round": done,
        }
        for rid, done in sorted(res.completion_round.items())
    }


def track_json(tr: Any) -> dict[str, Any]:
    """A plugin RequestTrack as JSON: what the simulator needs to replay the request."""
    return {
        "prompt_tokens": int(tr.prompt_tokens),
        "output_budget": int(tr.output_budget),
        "rounds_per_block": [int(r) for r in tr.rounds_per_block],
        "admission": float(tr.admission),
        "refined": None if tr.refined is None else float(tr.refined),
        "forwards": int(tr.forwards),
        "cost_ms": None if tr.cost_ms is None else float(tr.cost_ms),
    }


def serve_both(requests: int, slots: int, k: int, max_new_tokens: int) -> dict[str, Any]:
    """Serve the burst twice (stock, then the plugin); returns the runs document."""
    from harness import install_torchvision_shim

    install_torchvision_shim()
    import importlib.metadata

    from harness import (
        TinyBDRunner,
        environ,
        eval_requests,
        plugin_env,
        remove_hooks,
        serve,
    )
    from sglang.srt.plugins import load_plugins

    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    B, K = slots, k
    runner = TinyBDRunner(block_size=BLOCK_SIZE)
    reqs = eval_requests(requests, runner, max_new_tokens=max_new_tokens)
    mix = {c: sum(r.category == c for r in reqs) for c in sorted({r.category for r in reqs})}
    print(f"{len(reqs)} eval-split requests, stratified: {mix}", flush=True)

    remove_hooks()
    with environ({"DWISE_SGLANG_BUNDLE": None}):
        load_plugins()
        stock, _ = serve(reqs, max_running_requests=B, runner=runner)
    remove_hooks()
    print(f"stock: {stock.rounds} rounds in {stock.wall_seconds:.0f} s", flush=True)

    def keep(sch: Any) -> None:
        config = load_config()
        if config is None:
            raise RuntimeError("DWISE_SGLANG_BUNDLE is not set: the plugin would not run")
        attach(sch, config).keep_finished = True

    with environ({**plugin_env("tiny-bd", slots=B, k=K), "SGLANG_PLUGINS": "dwise"}):
        load_plugins()
        dw, s = serve(reqs, max_running_requests=B * K, runner=runner, on_scheduler=keep)
    remove_hooks()
    state = s.dwise_serving
    print(f"plugin: {dw.rounds} rounds in {dw.wall_seconds:.0f} s", flush=True)
    observe = observe_run(reqs, B, runner, stock)
    print(f"observe: {observe['rounds']} rounds, {observe['traces_written']} traces", flush=True)
    return {
        "sglang_version": importlib.metadata.version("sglang"),
        "requests": len(reqs),
        "slots": B,
        "k": K,
        "block_size": BLOCK_SIZE,
        "max_new_tokens": max_new_tokens,
        "mix": mix,
        "arrivals": "burst",
        "arrival_order": [r.rid for r in reqs],
        "categories": {str(r.rid): r.category for r in reqs},
        "runs": {
            "sglang-fcfs": _summary(stock, len(reqs)),
            "dwise-plugin": _summary(dw, len(reqs), state),
            "observe": observe,
        },
        "outputs_equal": stock.output_ids == dw.output_ids,
        "plugin_stats": {
            "phase_mismatches": state.stats.phase_mismatches,
            "refused_by_adder": state.stats.refused_by_adder,
            "kv_clamped": state.stats.kv_clamped,
        },
        "monitor": state.monitor.snapshot(),
        "per_request": {"sglang-fcfs": _per_request(stock), "dwise-plugin": _per_request(dw)},
        "tracks": {str(rid): track_json(tr) for rid, tr in sorted(state.finished)},
    }


def observe_run(reqs: list[Any], slots: int, runner: Any, stock: Any) -> dict[str, Any]:
    """Serve the burst in observe mode (no bundle: SGLang's own rounds, serving traces written)
    and compare with the stock run: same outputs, same rounds, a trace per request."""
    import tempfile

    from harness import environ, remove_hooks, serve
    from sglang.srt.plugins import load_plugins

    from dwise_predict import read_traces
    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    def on(sch: Any) -> None:
        config = load_config()
        if config is None or config.policy != "observe":
            raise RuntimeError("DWISE_SGLANG_POLICY=observe is not set: the plugin would not run")
        attach(sch, config)

    with tempfile.TemporaryDirectory() as tmp:
        env = {
            "DWISE_SGLANG_BUNDLE": None,
            "DWISE_SGLANG_POLICY": "observe",
            "DWISE_SGLANG_TRACE_DIR": tmp,
            "SGLANG_PLUGINS": "dwise",
        }
        with environ(env):
            remove_hooks()
            load_plugins()
            res, s = serve(reqs, max_running_requests=slots, runner=runner, on_scheduler=on)
        remove_hooks()
        traces = read_traces(Path(tmp) / "dp0").to_pylist()  # serve() waits for the writer
    out = _summary(res, len(reqs), s.dwise_serving)
    out.update(
        bundle=None,
        traces_written=len(traces),
        traces_with_hidden=sum(t["first_round_hidden"] is not None for t in traces),
        outputs_equal=res.output_ids == stock.output_ids,
        completion_rounds_equal_stock=res.completion_round == stock.completion_round,
    )
    return out


def replay_requests(tracks: dict[str, Any], order: list[str], block_size: int) -> list[Any]:
    """The served requests as the simulator replays them, in arrival order, in SGLang's round
    accounting.

    SGLang prefills floor(L / block) prompt blocks (the prompt's tail shares the first output
    block) and charges a block of r denoising steps r + 1 forwards (the block is resolved by a
    forward that sees no mask); the plugin's tracks hold r per block (the trace convention the
    estimates are in), so one forward per block is added back here. The estimates stay as the
    plugin computed them.
    """
    from dwise_predict.runtime import SimRequest

    return [
        SimRequest(
            rid,
            tr["prompt_tokens"] // block_size,
            tr["prompt_tokens"],
            tuple(r + 1 for r in tr["rounds_per_block"]),
            tr["output_budget"],
            block_size,
            admission_estimate=tr["admission"],
            refined_estimate=tr["refined"],
        )
        for rid, tr in ((rid, tracks[rid]) for rid in order)
    ]


def simulate_same(doc: dict[str, Any]) -> dict[str, Any]:
    """Replay the served requests in the simulator with the same B and k; compare per run.

    One round costs 1 ms in the replay, so times in ms are round counts (1-based, as the real
    loop counts them). ``work_equal`` counts the requests whose replayed work (prompt blocks +
    forwards of their output blocks) equals the forwards the real run gave them: the replay's
    input is exact when it equals ``requests``.
    """
    from dwise_predict.runtime import DWISE, FCFS, Arrivals, RoundTimeModel, Workload, simulate

    reqs = replay_requests(doc["tracks"], doc["arrival_order"], doc["block_size"])
    wl = Workload.from_requests(reqs)
    # the burst in SGLang's arrival order: FCFS serves in it, DWISE breaks ties by it (the
    # simulator's "burst" would draw a seeded permutation instead)
    burst = Arrivals(np.arange(wl.n, dtype=np.int64), np.zeros(wl.n))
    work = {r.request_id: r.prompt_blocks + sum(r.rounds_per_block) for r in reqs}
    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)
    out: dict[str, Any] = {}
    policies: tuple[tuple[str, Any], ...] = (("sglang-fcfs", FCFS()), ("dwise-plugin", DWISE()))
    for name, pol in policies:
        run = simulate(
            wl,
            pol,
            arrivals=burst,
            slots=doc["slots"],
            k=doc["k"],
            round_time=rt,
            kv_pool_tokens=int(doc["runs"]["dwise-plugin"]["kv_free_before"]),  # SGLang's pool
        )
        real = doc["runs"][name]
        per = doc["per_request"][name]
        sim = {
            "rounds": int(run.round_ms.size),
            "mean_completion_rounds": round(float(np.mean(run.finish_time)) * 1000.0, 2),
            "mean_ttft_rounds": round(float(np.mean(run.first_block_time)) * 1000.0, 2),
            "prefill_only_round_frac": round(
                float(np.mean(run.round_prompt == run.round_filled)), 4
            ),
            "filled_slots_per_round": round(float(np.mean(run.round_filled)), 3),
        }
        for key in ("rounds", "mean_completion_rounds"):
            sim[f"{key}_rel_diff"] = round(sim[key] / real[key] - 1.0, 4)
        sim["within_10pct"] = all(
            abs(sim[f"{k}_rel_diff"]) <= 0.10 for k in ("rounds", "mean_completion_rounds")
        )
        sim["work_equal"] = sum(per[rid]["forwards"] == w for rid, w in work.items() if rid in per)
        out[name] = sim
    return out


def overhead_next_to_core(reps: int = 5, rounds: int = 300) -> tuple[dict[str, Any], dict]:
    """The plugin's per-round cost next to the core runtime's, medians of ``reps`` runs.

    ``plugin_over_core`` divides the plugin's whole per-round time by the core runtime's own
    part of it (``plan_round``, ``update``, ``add_request``, ``cancel``), timed inside the same
    rounds: the same requests in the same state, so the ratio is what the plugin adds to the
    scheduling decision itself. ``benchmarks/scheduler.py``'s "churn" state (the same 1,024 +
    3,072, B = 128, but with arrivals that rarely rank high, and ``add_request`` untimed) is
    measured alternately for reference. The steady state (B = 128 of 1,024 residents, nothing
    arriving or finishing) is timed too.
    """
    sys.path.insert(0, str(Path(__file__).parent))
    from scheduler import bench_runtime  # benchmarks/scheduler.py

    churn, bench, steady = [], [], []
    for _ in range(reps):
        churn.append(overhead(rounds=rounds))
        bench.append(bench_runtime(rounds, churn=True))
        steady.append(overhead(rounds=rounds, waiting=0, churn=0))
    ov = dict(churn[0])

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(p[key] for p in runs), 1)

    for key in ("plugin_us_per_round_median", "plugin_us_per_round_p90"):
        ov[key] = med(churn, key)
    ov["core_us_per_round_median"] = med(churn, "core_us_per_round_median")
    ov["plugin_over_core"] = round(
        statistics.median(
            p["plugin_us_per_round_median"] / p["core_us_per_round_median"] for p in churn
        ),
        2,
    )
    ov["steady_us_per_round"] = med(steady, "plugin_us_per_round_median")
    ov["steady_core_us_per_round"] = med(steady, "core_us_per_round_median")
    ov["steady_state"] = steady[0]["state"]
    ov["reps"] = reps
    bench_us = statistics.median(bench)
    return ov, {
        "source": "benchmarks/scheduler.py bench_runtime(churn=True), in this run",
        "reps": reps,
        "dwise_runtime_churn_us": round(bench_us, 1),
        "plugin_over_bench_churn": round(ov["plugin_us_per_round_median"] / bench_us, 2),
    }


class _FakeReq:
    """The Req surface the plugin reads: rid, ids, budget, phase, finished, output."""

    def __init__(self, i: int, rng: np.random.Generator, block_size: int, ids: list[int]) -> None:
        self.rid = f"r{i}"
        self.origin_input_ids = array("q", ids)  # SGLang 0.5.23's Req keeps an array("q")
        self.sampling_params = SimpleNamespace(max_new_tokens=256)
        self.output_ids: list[int] = []
        self.prompt_left = len(self.origin_input_ids) // block_size  # SGLang's floor accounting
        self.finished_reason: Any = None

    def finished(self) -> bool:
        return self.finished_reason is not None

    def is_dllm_prefill(self) -> bool:
        return self.prompt_left > 0


class _FakeScheduler:
    """SGLang's side of ``compose_round``: the waiting queue, the resident set, the adder."""

    def __init__(self) -> None:
        self.waiting_queue: list[Any] = []
        self.dllm_manager = SimpleNamespace(waiting_queue=[])
        self.dllm_manager.add_waiting_reqs = self.dllm_manager.waiting_queue.extend

    def _process_batch_by_phase(
        self, adder: Any, reqs: list[Any], *args: Any, **kwargs: Any
    ) -> None:
        adder.can_run_list.extend(reqs)


class _ScriptedAdmission:
    """Set-up only: a bundle whose admission estimates are given, so waves outrank residents."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def predict_admission_features(self, X: np.ndarray) -> np.ndarray:
        out, self.values = self.values[: len(X)], self.values[len(X) :]
        return np.asarray(out, dtype=np.float64)

    def predict_admission_one(self, x: Any) -> float:
        return float(self.predict_admission_features(np.asarray([x]))[0])

    def admission_row(self, text: str, prompt_tokens: int) -> tuple[float, ...]:
        return (float(prompt_tokens),)


def overhead(
    residents: int = 1024,
    waiting: int = 3072,
    slots: int = 128,
    rounds: int = 300,
    warmup: int = 20,
    seed: int = 0,
    churn: int = 2,
) -> dict[str, Any]:
    """The plugin's own per-round cost at ``residents`` residents + ``waiting`` waiting.

    What is timed is everything the plugin adds to one SGLang round: ``observe_result`` (in
    ``process_batch_result_dllm``), ``fold_previous`` (the core's ``update`` plus the per-request
    bookkeeping and the monitor), and ``compose_round`` (arrivals with their admission estimate
    from the real tiny-bd bundle, prompts decoded by its tokenizer, the core's ``plan_round``,
    the move of admitted requests into the resident set), i.e. ``DwiseServing.stats.plan_seconds``.
    SGLang's own ``_process_batch_by_phase`` (the PrefillAdder) and the forward are not the
    plugin's and are stubbed. With ``churn`` = 2 the state mirrors ``benchmarks/scheduler.py``'s
    "churn" state: 2 requests finish and 2 arrive every round, so the admission path ranks
    waiting ∪ resident each round; ``churn`` = 0 (and ``waiting`` = 0) is the steady state.
    The core runtime's own calls are timed inside the same rounds (``core_us_per_round``).

    Reaching ``residents`` residents needs a set-up: DWISE admits a waiting request only when it
    ranks in the top B of waiting ∪ resident, and residents' keys only fall as they run, so a
    burst with no finishes never grows the resident set past the first B. As in
    ``benchmarks/scheduler.py``, the residents arrive in k waves of B, each wave given estimates
    that outrank the residents before it; the waiting requests and every later arrival get the
    bundle's real estimates.
    """
    from dwise_predict import load_bundle
    from dwise_predict.sglang.config import PluginConfig
    from dwise_predict.sglang.serving import DwiseServing

    bs, k = 32, residents // slots
    if k * slots != residents:
        raise ValueError(f"residents={residents} must be a multiple of slots={slots}")
    bundle = load_bundle("tiny-bd")
    cfg = PluginConfig(bundle="tiny-bd", slots=slots, k=k)
    st = DwiseServing(
        cfg, bundle, block_size=bs, kv_pool_tokens=1 << 24, req_slots=residents, refine=False
    )
    featurizer = bundle.admission.featurizer
    st.set_tokenizer(featurizer.tokenizer)
    sched = _FakeScheduler()
    rng = np.random.default_rng(seed)
    # templated prompts of 40-400 tokens (tiny-bd's byte-level tokenizer spends 5 a word)
    prompts = [
        featurizer.tokenizer.encode(featurizer.render(" ".join(["word"] * n))).ids
        for n in range(7, 80, 3)
    ]
    nid = 0

    def arrive(n: int) -> None:
        nonlocal nid
        for j in range(n):
            ids = prompts[int(rng.integers(len(prompts)))]
            sched.waiting_queue.append(_FakeReq(nid + j, rng, bs, ids))
        nid += n

    core_s = [0.0]  # the core runtime's own seconds inside the plugin's

    def timed(fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                core_s[0] += time.perf_counter() - t0

        return call

    for name in ("plan_round", "update", "add_request", "cancel"):
        setattr(st.core, name, timed(getattr(st.core, name)))

    def round_(finish: int) -> tuple[float, float]:
        """One SGLang round with the plugin's hooks; returns the plugin's and the core's
        seconds (the core's are part of the plugin's)."""
        before, core_before = st.stats.plan_seconds, core_s[0]
        adder = SimpleNamespace(can_run_list=[], rem_dllm_tokens=0)
        st.compose_round(sched, adder, None)
        run = adder.can_run_list
        if st._scoring is not None:  # the forward (untimed): dws-sjf's worker prices arrivals
            st._scoring[2].result()
        acc = [0] * len(run)
        done = 0
        for j, req in enumerate(run):  # the "forward": a prompt block, or a denoising step
            if req.prompt_left:
                req.prompt_left -= 1
            elif done < finish:
                req.finished_reason, acc[j] = "FINISH_MATCHED_TOKEN", 1
                done += 1
        st.observe_result(
            SimpleNamespace(reqs=run),
            SimpleNamespace(accept_length_per_req_cpu=acc, logits_output=None),
        )
        st.fold_previous()
        residents_now = sched.dllm_manager.waiting_queue
        if done:  # SGLang's filter_finished_reqs at the top of the next round
            sched.dllm_manager.waiting_queue[:] = [r for r in residents_now if not r.finished()]
        arrive(done)
        return st.stats.plan_seconds - before, core_s[0] - core_before

    real = st.bundle
    for wave in range(k):  # each wave outranks the residents before it, so all of it is admitted
        st.bundle = _ScriptedAdmission(
            [1000.0 - 100.0 * wave + float(rng.random()) * 10 for _ in range(slots)]
        )
        arrive(slots)
        st.register_arrivals(sched.waiting_queue)  # now, with the scripted estimates
        round_(finish=0)
    st.bundle = real
    arrive(waiting)
    st.register_arrivals(sched.waiting_queue)
    if st.core.n_resident != residents or st.core.n_waiting != waiting:
        raise RuntimeError(
            f"set-up reached {st.core.n_resident} residents and "
            f"{st.core.n_waiting} waiting, not {residents} + {waiting}"
        )
    times: list[float] = []
    core: list[float] = []
    # the fake requests' "actual" rounds are meaningless: keep the monitor's drift warning quiet
    monitor_log = logging.getLogger("dwise_predict.sglang.monitor")
    level, monitor_log.level = monitor_log.level, logging.ERROR
    try:
        both = [round_(finish=churn) for _ in range(warmup + rounds)][warmup:]
        st.drain()
        times, core = [b[0] for b in both], [b[1] for b in both]
    finally:
        monitor_log.setLevel(level)
    return {
        "residents": residents,
        "waiting": waiting,
        "slots": slots,
        "k": k,
        "rounds": rounds,
        "state": (
            f"churn: {churn} finish and {churn} arrive per round"
            if churn
            else f"steady: B = {slots} of {residents} residents, no arrivals or finishes"
        ),
        "plugin_us_per_round_median": round(statistics.median(times) * 1e6, 1),
        "plugin_us_per_round_p90": round(float(np.percentile(times, 90)) * 1e6, 1),
        "core_us_per_round_median": round(statistics.median(core) * 1e6, 1),
    }


def prediction_quality(doc: dict[str, Any]) -> dict[str, Any]:
    """In-loop rank correlation and calibration per category, beside the bundle's offline eval.

    The monitor gives one figure over the whole window; a ranking that only separates
    categories (mcq from chat) reads well there and still mis-orders requests within each.
    Offline figures are the ones ``dwise-predict eval --record`` wrote into the bundle."""
    import dwise_predict
    from dwise_predict.ranking import spearman

    cats = doc.get("categories") or {}
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for rid, t in doc["tracks"].items():
        actual = float(sum(t["rounds_per_block"]))
        if actual <= 0:
            continue
        by = rows.setdefault(cats.get(rid, "unknown"), {"admission": [], "refinement": []})
        by["admission"].append((float(t["admission"]), actual))
        if t["refined"] is not None:
            by["refinement"].append((1.0 + float(t["refined"]), actual))

    def stats(pairs: list[tuple[float, float]]) -> dict[str, Any]:
        if not pairs:
            return {"n": 0, "spearman": None, "median_ratio": None}
        a = np.asarray(pairs, dtype=np.float64)
        rho = spearman(a[:, 0], a[:, 1])
        return {
            "n": len(pairs),
            "spearman": None if rho is None else round(float(rho), 4),
            "median_ratio": round(float(np.median(np.maximum(a[:, 0], 1e-9) / a[:, 1])), 4),
        }

    metrics = dwise_predict.load_bundle("tiny-bd").manifest.get("metrics") or {}
    out: dict[str, Any] = {}
    # the bundle's eval names the calibrated refined estimate "refined"
    for kind, recorded in (("admission", "admission"), ("refinement", "refined")):
        offline = (metrics.get(recorded) or {}).get("per_category") or {}
        out[kind] = {
            cat: {
                "in_loop": stats(v[kind]),
                "offline_spearman": (offline.get(cat) or {}).get("spearman"),
                "offline_median_ratio": (offline.get(cat) or {}).get("median_ratio"),
            }
            for cat, v in sorted(rows.items())
        }
    return out


def served_vs_offline(doc: dict[str, Any], traces: Path) -> dict[str, Any]:
    """Per category, median total rounds of the served requests beside the same requests in
    offline traces (``dwise-predict trace`` or the reference model's report, same model and
    threshold): how faithfully offline traces stand for the server. ``within_15pct`` is the
    bar a server-faithful layout must meet."""
    from dwise_predict.traces import read_trace_fingerprint, read_traces

    table = read_traces(traces, columns=["request_id", "total_rounds"])
    offline = dict(
        zip(table.column("request_id").to_pylist(), table.column("total_rounds").to_pylist())
    )
    cats = doc.get("categories") or {}
    by: dict[str, tuple[list[float], list[float]]] = {}
    for rid, t in doc["tracks"].items():
        if rid in offline:
            served, traced = by.setdefault(cats.get(rid, "unknown"), ([], []))
            served.append(float(sum(t["rounds_per_block"])))
            traced.append(float(offline[rid]))
    out: dict[str, Any] = {
        "traces": str(traces),
        "block_alignment": read_trace_fingerprint(traces).block_alignment,
        "per_category": {},
    }
    for cat, (served, traced) in sorted(by.items()):
        ms, mt = float(np.median(served)), float(np.median(traced))
        out["per_category"][cat] = {
            "n": len(served),
            "served_median_rounds": ms,
            "offline_median_rounds": mt,
            "ratio": round(ms / mt, 4) if mt else None,
            "within_15pct": bool(mt and abs(ms / mt - 1.0) <= 0.15),
        }
    return out


def finish(
    doc: dict[str, Any], path: Path, command: str, offline_traces: Path | None = None
) -> dict[str, Any]:
    """Add the simulator cross-check and the overhead to a runs document; print and write."""
    from dwise_predict.atomic import write_json

    runs = doc["runs"]
    sim = simulate_same(doc)
    print("measuring the plugin's per-round overhead ...", flush=True)
    ov, core_ref = overhead_next_to_core()
    tracks = doc["tracks"]
    out = {
        "sglang_version": doc["sglang_version"],
        "requests": doc["requests"],
        "slots": doc["slots"],
        "k": doc["k"],
        "max_new_tokens": doc["max_new_tokens"],
        "mix": doc["mix"],
        "arrivals": doc["arrivals"],
        "runs": runs,
        "completion_speedup": round(
            runs["sglang-fcfs"]["mean_completion_rounds"]
            / runs["dwise-plugin"]["mean_completion_rounds"],
            3,
        ),
        "outputs_equal": doc["outputs_equal"],
        "max_refinements_per_request": int(
            max((1 if t["refined"] is not None else 0) for t in tracks.values())
        ),
        "plugin_stats": doc["plugin_stats"],
        "simulator": sim,
        "overhead": ov,
        "core_same_run": core_ref,
        "monitor": doc["monitor"],
        "quality_by_category": prediction_quality(doc),
        "served_vs_offline": (
            served_vs_offline(doc, offline_traces) if offline_traces is not None else None
        ),
        "runs_file": str(path.with_suffix(".runs.json")),
        "command": command,
        "recomputed_with": doc.get("recomputed_with"),
    }
    print(f"\n{'':28s}{'sglang-fcfs':>14s}{'dwise-plugin':>14s}")
    for key in (
        "rounds",
        "prefill_only_round_frac",
        "filled_slots_per_round",
        "mean_completion_rounds",
        "mean_ttft_rounds",
        "finished",
        "refinements",
        "plugin_us_per_round",
    ):
        print(f"{key:28s}{runs['sglang-fcfs'][key]!s:>14s}{runs['dwise-plugin'][key]!s:>14s}")
    print(
        f"\nmean completion speedup {out['completion_speedup']}x, outputs equal: "
        f"{out['outputs_equal']}"
    )
    ob = runs.get("observe")
    if ob is not None:
        print(
            f"observe mode (no bundle): {ob['traces_written']}/{ob['requests']} requests traced, "
            f"outputs equal stock's: {ob['outputs_equal']}, rounds equal stock's: "
            f"{ob['completion_rounds_equal_stock']}, {ob['plugin_us_per_round']} us a round"
        )
    mon = doc["monitor"]
    print(
        f"\nestimates in the loop: admission median ratio {mon['admission']['median_ratio']}, "
        f"rho {mon['admission']['spearman']}; refined {mon['refinement']['median_ratio']}, "
        f"rho {mon['refinement']['spearman']}"
    )
    print(f"{'category':14s}{'n':>5s}{'adm rho':>9s}{'offline':>9s}{'ref rho':>9s}{'offline':>9s}")
    q = out["quality_by_category"]
    for cat in q["admission"]:
        a, r = q["admission"][cat], q["refinement"][cat]
        print(
            f"{cat:14s}{a['in_loop']['n']:>5d}{a['in_loop']['spearman']!s:>9s}"
            f"{a['offline_spearman'] and round(a['offline_spearman'], 3)!s:>9s}"
            f"{r['in_loop']['spearman']!s:>9s}"
            f"{r['offline_spearman'] and round(r['offline_spearman'], 3)!s:>9s}"
        )
    sv = out["served_vs_offline"]
    if sv is not None:
        print(
            f"\nmedian rounds, served vs offline ({sv['block_alignment']} layout, {sv['traces']}):"
        )
        for cat, c in sv["per_category"].items():
            print(
                f"{cat:14s}{c['n']:>5d}{c['served_median_rounds']:>9.1f}"
                f"{c['offline_median_rounds']:>9.1f}{c['ratio']!s:>9s}"
                f"{'  ok' if c['within_15pct'] else '  off by > 15%'}"
            )
    print(f"\nsimulator vs SGLang's real loop (B={doc['slots']}, k={doc['k']}):")
    print(
        f"{'':14s}{'real rounds':>12s}{'sim rounds':>11s}{'diff':>8s}"
        f"{'real mean':>11s}{'sim mean':>10s}{'diff':>8s}{'work =':>8s}"
    )
    for name in RUNS:
        r, m = runs[name], sim[name]
        print(
            f"{name:14s}{r['rounds']:>12d}{m['rounds']:>11d}{m['rounds_rel_diff']:>8.1%}"
            f"{r['mean_completion_rounds']:>11.1f}{m['mean_completion_rounds']:>10.1f}"
            f"{m['mean_completion_rounds_rel_diff']:>8.1%}{m['work_equal']:>5d}/{doc['requests']}"
        )
    print(
        f"\nplugin per round at {ov['residents']} residents + {ov['waiting']} waiting, "
        f"B={ov['slots']}, churn: {ov['plugin_us_per_round_median']} us median, of which the "
        f"core runtime {ov['core_us_per_round_median']} us ({ov['plugin_over_core']}x the core); "
        f"benchmarks/scheduler.py's churn state {core_ref['dwise_runtime_churn_us']} us "
        f"({core_ref['plugin_over_bench_churn']}x); steady state (B={ov['slots']} of "
        f"{ov['residents']}, no churn): {ov['steady_us_per_round']} us "
        f"(core {ov['steady_core_us_per_round']} us); medians of {ov['reps']} alternating runs"
    )
    write_json(path, out)
    print(f"wrote {path}")
    return out


def main(argv: list[str] | None = None) -> int:
    args_in = sys.argv[1:] if argv is None else argv
    if "--ladder" in args_in:  # the component ladder: benchmarks/sglang_ladder.py
        sys.path.insert(0, str(Path(__file__).parent))
        from sglang_ladder import main as ladder

        return ladder(args_in)
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results/sglang_scheduler.json")
    ap.add_argument(
        "--from-runs",
        metavar="RUNS_JSON",
        help="recompute the simulator cross-check and the overhead from a saved runs file "
        "(FILE.runs.json of an earlier run) instead of serving again",
    )
    ap.add_argument(
        "--offline-traces",
        type=Path,
        metavar="DIR",
        help="offline traces of the same eval requests (e.g. the reference model report's "
        "tiny-bd-eval/tau0.95): per category, served median rounds beside theirs",
    )
    args = ap.parse_args(argv)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    command = ".venv-sglang/bin/python " + " ".join(
        [sys.argv[0], *(sys.argv[1:] if argv is None else argv)]
    )
    if args.from_runs:
        from harness import install_torchvision_shim

        install_torchvision_shim()  # overhead() imports SGLang's enums
        doc = json.loads(Path(args.from_runs).read_text())
        if "tracks" not in doc:
            raise SystemExit(
                f"{args.from_runs} holds no per-request tracks (written by an older version of "
                "this benchmark): serve again without --from-runs"
            )
        command = doc.get("command", command)
        doc["recomputed_with"] = f"--from-runs {args.from_runs}"
    else:
        from dwise_predict.atomic import write_json

        doc = serve_both(args.requests, args.slots, args.k, args.max_new_tokens)
        doc["command"] = command
        write_json(path.with_suffix(".runs.json"), doc)  # before anything that could fail
    finish(doc, path, command, args.offline_traces)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
