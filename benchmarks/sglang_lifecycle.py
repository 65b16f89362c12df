"""A predictor that keeps up with traffic, in SGLang 0.5.23's real loop: drift, flag, refresh,
shadow, promote, while requests keep arriving; and two bad revisions that never serve.

One continuous run through the CPU harness (``tests/sglang_plugin/harness.py``: SGLang's real
scheduler classes, tiny-bd computing the logits), Poisson arrivals over rounds, the plugin
under ``DWISE_SGLANG_POLICY=dwise`` watching ``DWISE_SGLANG_BUNDLE``, a ``current`` symlink
the "operator" side of this script flips to each new revision:

* **bootstrap** (before the run): ``--bootstrap`` chat/math/mcq requests of the tiny-bd
  workload's train split served in observe mode; the live bundle (admission model) is trained
  on their serving traces: the cold start of docs/sglang.md;
* **phase 1**: ``--phase1`` eval-split requests of the same traffic: the live bundle fits;
* **drift**: ``--drift`` more eval-split requests, now with a system prompt asking for
  step-by-step explanations in front of every user prompt (a deployment changes its system
  prompt: the most common change a serving operator makes). tiny-bd's multiple-choice answers
  grow from a letter to a paragraph (median 4 -> 75 denoising rounds at 128 new tokens), so
  the work the live bundle predicts short is now long;
* a revision trained on corrupted targets (it ranks the traffic in reverse: a refresh job gone
  wrong) is published before the first round: it shadows the live bundle in phase 1 and is
  rejected; a revision for another decoding threshold (fingerprint mismatch) is published
  when the drift begins: refused;
* the monitor flags the drift (window ``--monitor-window``); once ``--refresh-after`` drifted
  requests are traced after the flag, ``dwise-predict refresh`` runs as a separate process (a
  cron job, ``--refresh-python``'s environment) on those serving traces, and its candidate is
  published: it shadows ``--shadow-requests`` requests, is promoted, passes probation;
* **offline reference**: a bundle trained offline on the same new-traffic traces, served on
  the requests the promoted bundle ranked ("after"), with the same arrivals;
* **stock**: every request of the run under stock SGLang, the same arrivals: outputs compared
  token for token.

Round host time = a round's wall time minus its model forward (SGLang's own host work plus the
plugin's). "The round during the swap" (``max_round_host_ms_during_swap``) = the rounds in which
the scheduler thread took a revision or swapped bundles; the rounds that overlapped a revision's
load on the watcher thread are reported beside them (``round_host_ms.while_loading``), against
the other rounds of their kind (a round in which a request finishes costs SGLang about twice
one in which none does) and, strictly, against the median of all rounds.

    .venv-sglang/bin/python benchmarks/sglang_lifecycle.py     # about 4 min on 2 cores

Writes ``benchmarks/results/sglang_lifecycle.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "sglang_plugin"))

#: the drift: a system prompt the deployment puts in front of every user prompt
SYSTEM_PROMPT = (
    "<|system|>\nYou are a helpful assistant. Think step by step and explain your reasoning "
    "in detail before you give the final answer.\n"
)
#: the traffic the live bundle is trained for (the workload's three big categories)
CATEGORIES = ("chat", "math", "mcq")


# -- requests ------------------------------------------------------------------------------------
def workload_requests(
    runner: Any, split: str, n: int, max_new_tokens: int, *, skip: int = 0, system: str = ""
) -> list[Any]:
    """``n`` requests of CATEGORIES from the tiny-bd workload's ``split``, round-robin over
    categories (after the first ``skip``), each prompt optionally behind ``system``."""
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig, render_prompt
    from harness import RequestSpec

    dc = DataConfig()
    w = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed)
    tok = runner.tokenizer
    by_cat: dict[str, list[Any]] = {c: [] for c in CATEGORIES}
    for r in getattr(w, split):
        if r.category in by_cat and len(tok.encode(render_prompt(r.prompt)).ids) <= 400:
            by_cat[r.category].append(r)
    picked: list[Any] = []
    i = 0
    while len(picked) < skip + n and any(i < len(v) for v in by_cat.values()):
        picked += [by_cat[c][i] for c in CATEGORIES if i < len(by_cat[c])]
        i += 1
    out = []
    for r in picked[skip : skip + n]:
        text = system + render_prompt(r.prompt)
        rid = f"{r.id}{'-sys' if system else ''}"
        out.append(
            RequestSpec(
                rid,
                text,
                tok.encode(text).ids,
                max_new_tokens,
                r.category,
                f"category:{r.category}",
            )
        )
    if len(out) < n:
        raise SystemExit(f"the {split} split has only {len(out)} such requests; ask for fewer")
    return out


def poisson_rounds(n: int, rate: float, seed: int, start: int = 0) -> list[int]:
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return (start + np.floor(np.cumsum(gaps) - gaps[0])).astype(int).tolist()


# -- serving -------------------------------------------------------------------------------------
class _GcClock:
    """Milliseconds the interpreter spent in garbage collection (gc.callbacks)."""

    def __init__(self) -> None:
        self.ms = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self)

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.ms += 1e3 * (time.perf_counter() - self._t0)


GC = _GcClock()


def timed_runner() -> Any:
    """tiny-bd's runner, memoised (later runs of the same requests are cheap), timing its
    forwards so a round's host time is its wall time minus them."""
    from harness import TinyBDRunner

    class TimedRunner(TinyBDRunner):
        forward_seconds = 0.0
        forward_cpu_seconds = 0.0

        def forward(self, forward_batch: Any, **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return super().forward(forward_batch, **kwargs)
            finally:
                self.forward_seconds += time.perf_counter() - t0
                self.forward_cpu_seconds += time.thread_time() - c0

    return TimedRunner(memo=True)


def plugin_env(bundle: str | Path, **settings: Any) -> dict[str, str | None]:
    from harness import plugin_env as env

    return {**env(str(bundle), **settings), "SGLANG_PLUGINS": None}


@dataclass
class Served:
    """What one served run left: outputs, per-request records, per-round host times."""

    outputs: dict[str, list[int]] = field(default_factory=dict)
    arrival: dict[str, int] = field(default_factory=dict)
    host_ms: list[float] = field(default_factory=list)
    host_cpu_ms: list[float] = field(default_factory=list)
    gc_ms: list[float] = field(default_factory=list)
    plugin_ms: list[float] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)
    plugin_round: list[int] = field(default_factory=list)
    #: whether a request of the round's batch finished: SGLang's host work for such a round
    #: is about twice a round's where none does, so rounds are also compared with their kind
    finishing: list[bool] = field(default_factory=list)
    kv_leaked: int = 0
    rounds: int = 0
    wall_s: float = 0.0
    state: Any = None


def serve_run(
    reqs: list[Any],
    arrive: list[int],
    runner: Any,
    env: dict[str, str | None] | None,
    max_running: int,
    between: Any = None,
) -> Served:
    """Serve ``reqs`` (arriving before round ``arrive[i]``) with the plugin as ``env`` sets it
    (None: stock SGLang); ``between(server, state, out)`` runs before every round."""
    from harness import CpuServer, environ, remove_hooks
    from sglang.srt.plugins import load_plugins

    from dwise_predict.sglang.config import load_config
    from dwise_predict.sglang.plugin import attach

    def on_scheduler(s: Any) -> None:
        config = load_config()
        if config is not None:
            attach(s, config).keep_finished = True

    remove_hooks()
    out = Served()
    order = sorted(range(len(reqs)), key=lambda i: (arrive[i], i))
    with environ(env or {"DWISE_SGLANG_BUNDLE": None, "DWISE_SGLANG_POLICY": None}):
        load_plugins()
        with CpuServer(
            max_running_requests=max_running, runner=runner, on_scheduler=on_scheduler
        ) as server:
            state = getattr(server.scheduler, "dwise_serving", None)
            out.state = state
            nxt = 0
            t_start = time.perf_counter()
            while len(out.outputs) < len(reqs):
                while nxt < len(order) and arrive[order[nxt]] <= server.rounds:
                    spec = reqs[order[nxt]]
                    server.submit(spec)
                    out.arrival[spec.rid] = server.rounds
                    nxt += 1
                if between is not None:
                    between(server, state, out)
                if server.rounds > 200_000:
                    raise RuntimeError("requests left unfinished after 200,000 rounds")
                r_before = state.stats.rounds if state is not None else 0
                p_before = state.stats.plan_seconds if state is not None else 0.0
                f_before, c_before = runner.forward_seconds, runner.forward_cpu_seconds
                g0 = GC.ms
                c0 = time.thread_time()
                t0 = time.perf_counter()
                batch = server.step()
                t1 = time.perf_counter()
                c1 = time.thread_time()
                if batch is None:
                    continue
                out.gc_ms.append(GC.ms - g0)
                out.host_ms.append(1e3 * ((t1 - t0) - (runner.forward_seconds - f_before)))
                out.host_cpu_ms.append(1e3 * ((c1 - c0) - (runner.forward_cpu_seconds - c_before)))
                out.spans.append((t0, t1))
                out.plugin_round.append(r_before)
                out.finishing.append(any(req.finished() for req in batch.reqs))
                if state is not None:
                    out.plugin_ms.append(1e3 * (state.stats.plan_seconds - p_before))
                for req in batch.reqs:
                    if req.finished() and req.rid not in out.outputs:
                        out.outputs[req.rid] = list(req.output_ids)
            server.drain()
            out.wall_s = time.perf_counter() - t_start
            out.rounds = server.rounds
            out.kv_leaked = server.kv_free_before - server.kv_free
            if state is not None and state.lifecycle is not None:
                state.lifecycle.close()
    remove_hooks()
    return out


# -- the figures ---------------------------------------------------------------------------------
def in_loop(state: Any, rids: set[str] | list[str]) -> dict[str, Any]:
    """The admission estimate the plugin ranked each of ``rids`` by, against the rounds it
    took, as the monitor computes them (median predicted/actual, Spearman ρ)."""
    from dwise_predict.bundle.promotion import figures

    want = set(rids)
    pairs = [
        (tr.admission, float(sum(tr.rounds_per_block)))
        for rid, tr in state.finished
        if str(rid) in want and sum(tr.rounds_per_block) > 0
    ]
    p = np.array([a for a, _ in pairs])
    a = np.array([b for _, b in pairs])
    f = figures(p, a)
    return {
        "admission_median_ratio": None if f.median_ratio is None else round(f.median_ratio, 4),
        "admission_rho": None if f.spearman is None else round(f.spearman, 4),
        "requests": f.n,
    }


# -- the operator's side of the continuous run ---------------------------------------------------
@dataclass
class Operator:
    """What runs between rounds beside the server: flags, revisions, the refresh job."""

    work: Path
    link: Path
    live: Path
    drift_ids: set[str]
    refresh_after: int
    python: str
    bad: dict[str, Path]
    flag_round: int | None = None
    flagged_after: int | None = None
    false_alarm_round: int | None = None
    flag_snapshot: dict[str, Any] | None = None
    shards_at_flag: set[str] = field(default_factory=set)
    refresh: subprocess.Popen[bytes] | None = None
    refresh_started: float | None = None
    refresh_seconds: float | None = None
    refresh_exit: int | None = None
    refresh_input: Path | None = None
    published: list[tuple[str, int, float]] = field(default_factory=list)
    drift_seen = False
    _seen_finished = 0

    def __call__(self, server: Any, state: Any, out: Served) -> None:
        now = server.rounds
        if now == 0:  # a revision trained on corrupted targets: shadows, rejected
            self.publish("inverted", self.bad["inverted"], now)
        if not self.drift_seen and any(r in out.arrival for r in self.drift_ids):
            self.drift_seen = True
            self.publish("other-model", self.bad["other-model"], now)
        if state.monitor.finished != self._seen_finished:
            self._seen_finished = state.monitor.finished
            snap = state.monitor.snapshot()
            if "admission" in snap["drifted"] and self.flag_round is None:
                if not self.drift_seen:
                    self.false_alarm_round = self.false_alarm_round or now
                else:
                    self.flag_round = now
                    self.flag_snapshot = snap
                    self.flagged_after = self.finished_drift(state)
                    self.shards_at_flag = set(self.shards(state))
        if (
            self.flag_round is not None
            and self.refresh is None
            and self.finished_drift(state) - (self.flagged_after or 0) >= self.refresh_after
        ):
            self.start_refresh(state)
        if self.refresh is not None and self.refresh_exit is None:
            code = self.refresh.poll()
            if code is not None:
                self.refresh_exit = code
                self.refresh_seconds = time.perf_counter() - (self.refresh_started or 0.0)
                if code == 0:
                    self.publish("refreshed", self.work / "revisions" / "refreshed", now)

    def finished_drift(self, state: Any) -> int:
        return sum(1 for rid, _ in state.finished if str(rid) in self.drift_ids)

    def shards(self, state: Any) -> list[str]:
        folder = Path(state.trace_sink.folder)
        return sorted(p.name for p in folder.glob("*.parquet"))

    def publish(self, name: str, target: Path, round_index: int) -> None:
        from revisions import publish

        publish(self.link, target)
        self.published.append((name, round_index, time.perf_counter()))

    def start_refresh(self, state: Any) -> None:
        """``dwise-predict refresh`` in its own process on the traces written since the flag."""
        folder = Path(state.trace_sink.folder)
        state.trace_sink.drain()  # every row traced so far is in a shard
        new = [n for n in self.shards(state) if n not in self.shards_at_flag]
        self.refresh_input = self.work / "refresh-input"
        self.refresh_input.mkdir(parents=True, exist_ok=True)
        for name in new:
            shutil.copy2(folder / name, self.refresh_input / name)
        cmd = [
            self.python,
            "-m",
            "dwise_predict",
            "refresh",
            "--bundle",
            str(self.live),
            "--serving-traces",
            str(self.refresh_input),
            "--out",
            str(self.work / "revisions" / "refreshed"),
            "--report",
            str(self.work / "refresh-report.json"),
        ]
        self.refresh_started = time.perf_counter()
        log = (self.work / "refresh.log").open("wb")
        self.refresh = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)


# -- main ----------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--bootstrap", type=int, default=128, help="requests the live bundle learns")
    ap.add_argument("--phase1", type=int, default=160, help="requests before the drift")
    ap.add_argument("--drift", type=int, default=640, help="requests after it")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument(
        "--rate",
        type=float,
        default=0.15,
        help="arrivals per round (Poisson); the default keeps the server below capacity after "
        "the drift, so the serving traces are not biased toward what the live bundle ranked first",
    )
    ap.add_argument("--monitor-window", type=int, default=64)
    ap.add_argument("--shadow-requests", type=int, default=64)
    ap.add_argument(
        "--refresh-after",
        type=int,
        default=256,
        help="drifted requests traced after the flag before the refresh job runs",
    )
    ap.add_argument("--watch-seconds", type=float, default=0.2)
    ap.add_argument(
        "--refresh-python",
        default=str(REPO / ".venv" / "bin" / "python"),
        help="the interpreter the refresh job runs in (its own environment, as a cron job's)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=Path("runs/sglang-lifecycle"))
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/sglang_lifecycle.json")
    args = ap.parse_args(argv)

    from harness import install_torchvision_shim

    install_torchvision_shim()
    from dwise_predict.trainers.pipeline import train_bundle
    from revisions import inverted_text, revision

    from dwise_predict import load_bundle
    from dwise_predict.atomic import write_json
    from dwise_predict.sglang.watcher import current_revision

    t_all = time.perf_counter()
    work = args.work.resolve()
    if work.exists():
        shutil.rmtree(work)
    (work / "revisions").mkdir(parents=True)
    runner = timed_runner()
    featurizer = load_bundle("tiny-bd").admission.featurizer
    mnt = args.max_new_tokens
    max_running = args.slots * args.k

    # bootstrap: observe mode's serving traces -> the live bundle (the cold start)
    boot = workload_requests(runner, "train", args.bootstrap, mnt)
    env = {
        "DWISE_SGLANG_POLICY": "observe",
        "DWISE_SGLANG_TRACE_DIR": str(work / "bootstrap-traces"),
        "DWISE_SGLANG_BUNDLE": None,
        "SGLANG_PLUGINS": None,
    }
    t0 = time.perf_counter()
    serve_run(boot, [0] * len(boot), runner, env, args.slots)
    live = train_bundle(
        work / "bootstrap-traces" / "dp0",
        work / "revisions" / "live",
        only="admission",
        seed=args.seed,
        featurizer=featurizer,
        name="tiny-bd-admission",
    )
    bootstrap_s = time.perf_counter() - t0
    bad = {
        "other-model": revision(live, work / "revisions" / "other-model", 1, threshold=0.9),
        "inverted": revision(
            live, work / "revisions" / "inverted", 1, admission_text=inverted_text(live)
        ),
    }
    link = work / "current"
    from revisions import publish

    publish(link, live)

    # the continuous run
    phase1 = workload_requests(runner, "eval", args.phase1, mnt)
    drift = workload_requests(
        runner, "eval", args.drift, mnt, skip=args.phase1, system=SYSTEM_PROMPT
    )
    reqs = phase1 + drift
    arrive = poisson_rounds(len(reqs), args.rate, args.seed)
    drift_ids = {r.rid for r in drift}
    operator = Operator(work, link, live, drift_ids, args.refresh_after, args.refresh_python, bad)
    env = plugin_env(
        link,
        policy="dwise",
        slots=args.slots,
        k=args.k,
        watch_seconds=args.watch_seconds,
        shadow_requests=args.shadow_requests,
        monitor_window=args.monitor_window,
        monitor_every=16,
        trace_dir=work / "serving-traces",
    )
    run = serve_run(reqs, arrive, runner, env, max_running, between=operator)
    state = run.state
    lc = state.lifecycle

    # which revision ranked each request: promotion's round splits stale from after
    events = [
        {
            "event": e.kind,
            "revision": e.revision,
            "round": e.round,
            "finished": e.finished,
            "reason": e.reason,
        }
        for e in lc.events
    ]
    promoted = [e for e in lc.events if e.kind == "promoted"]
    promote_round = promoted[0].round if promoted else None
    # the driver's round index of the plugin's round ``r``
    driver_round = dict(zip(run.plugin_round, range(1, len(run.plugin_round) + 1)))
    by_arrival = sorted(drift, key=lambda r: run.arrival[r.rid])
    backs = [e for e in lc.events if e.kind == "rolled_back"]
    if promote_round is not None:
        cut = driver_round.get(promote_round, promote_round)
        end = driver_round.get(backs[0].round, backs[0].round) if backs else 1 << 62
        stale_ids = [r.rid for r in by_arrival if run.arrival[r.rid] < cut]
        after_ids = [r.rid for r in by_arrival if cut < run.arrival[r.rid] < end]
    else:
        stale_ids, after_ids = [r.rid for r in by_arrival], []
    # a request waiting at promotion took the new estimate: stale keeps only r0-ranked ones
    r0, spec_of = load_bundle(live), {r.rid: r for r in reqs}
    finished = dict(state.finished)
    stale_ids = [rid for rid in stale_ids if _ranked_by(finished, spec_of[rid], r0, state)]

    # the offline reference: trained on the new traffic's traces, served on the after requests
    reference: dict[str, Any] = {"admission_rho": None}
    if after_ids and operator.refresh_input is not None:
        ref_path = train_bundle(
            operator.refresh_input,
            work / "revisions" / "offline-reference",
            only="admission",
            seed=args.seed,
            featurizer=featurizer,
            name="tiny-bd-admission-offline",
        )
        after_reqs = [spec_of[rid] for rid in after_ids]
        first = min(run.arrival[rid] for rid in after_ids)
        ref_run = serve_run(
            after_reqs,
            [run.arrival[rid] - first for rid in after_ids],
            runner,
            plugin_env(ref_path, policy="dwise", slots=args.slots, k=args.k),
            max_running,
        )
        reference = in_loop(ref_run.state, after_ids)

    # stock SGLang on every request, the same arrivals
    stock = serve_run(reqs, arrive, runner, None, args.slots)

    # round host times
    host = np.array(run.host_ms)
    swap_rounds = {i for i, r in enumerate(run.plugin_round) if r in set(lc.swap_rounds)}
    loads = lc.watcher.loads
    load_rounds = {
        i for i, (a, b) in enumerate(run.spans) if any(a < t1 and b > t0 for t0, t1 in loads)
    }
    during = sorted(swap_rounds | load_rounds)
    refresh_rounds: list[int] = []
    if operator.refresh_started is not None and operator.refresh_seconds is not None:
        t_end = operator.refresh_started + operator.refresh_seconds
        refresh_rounds = [
            i for i, (a, b) in enumerate(run.spans) if a < t_end and b > operator.refresh_started
        ]

    served_by = dict(lc.served)
    bad_report = []
    for name, path in bad.items():
        short = current_revision(str(path)).short
        evs = [e for e in events if e["revision"].endswith(short)]
        label = evs[0]["revision"] if evs else None
        bad_report.append(
            {
                "name": name,
                "served_requests": int(served_by.get(label, 0)) if label else 0,
                "events": [e["event"] for e in evs],
                "reason": evs[-1]["reason"] if evs else "never seen by the watcher",
            }
        )

    stale = in_loop(state, stale_ids)
    after = in_loop(state, after_ids)
    doc: dict[str, Any] = {
        "command": "python benchmarks/sglang_lifecycle.py " + " ".join(argv or sys.argv[1:]),
        "sglang_version": _version("sglang"),
        "drift": "a system prompt asking for step-by-step explanations in front of every prompt",
        "requests": {"bootstrap": len(boot), "phase1": len(phase1), "drift": len(drift)},
        "settings": {
            "slots": args.slots,
            "k": args.k,
            "rate_per_round": args.rate,
            "max_new_tokens": mnt,
            "monitor_window": args.monitor_window,
            "shadow_requests": args.shadow_requests,
            "refresh_after": args.refresh_after,
            "watch_seconds": args.watch_seconds,
        },
        "phase1": in_loop(state, [r.rid for r in phase1]),
        "stale": stale,
        "after": after,
        "offline_reference": reference,
        "flagged_after_requests": operator.flagged_after,
        "false_alarm_before_drift": operator.false_alarm_round is not None,
        "monitor_at_flag": operator.flag_snapshot,
        "monitor_at_end": state.monitor.snapshot(),
        "failed_requests": len(reqs) - len(run.outputs),
        "kv_leaked_tokens": int(run.kv_leaked),
        "outputs_equal_stock": run.outputs == stock.outputs,
        "max_round_host_ms_during_swap": round(float(host[sorted(swap_rounds)].max()), 3)
        if swap_rounds
        else None,
        "median_round_host_ms": round(float(np.median(host)), 3),
        "round_host_ms": {
            "swap_rounds": [round(float(host[i]), 3) for i in sorted(swap_rounds)],
            # the rounds a revision's load overlapped (on the watcher thread, throttled)
            "while_loading": {
                "rounds": len(load_rounds),
                "max": round(float(host[sorted(load_rounds)].max()), 3) if load_rounds else None,
                # like for like: against the other rounds of their kind
                "same_kind": same_kind(host, np.array(run.finishing), sorted(load_rounds)),
                # strictly: every round of the swap or a load, against the median of all
                "max_with_swap_rounds_over_median": round(
                    float(host[during].max() / np.median(host)), 3
                )
                if during
                else None,
            },
            "median_while_refresh_job_ran": round(float(np.median(host[refresh_rounds])), 3)
            if refresh_rounds
            else None,
            "p99": round(float(np.percentile(host, 99)), 3),
            # how often an ordinary round passes 2x the median on this (shared) machine, and
            # the max of as many randomly drawn rounds as the swap's: the noise floor
            "share_over_2x_median": round(float(np.mean(host > 2 * np.median(host))), 4),
            "random_rounds_max_median": round(_random_max(host, len(during)), 3)
            if during
            else None,
            "plugin_median_ms": round(float(np.median(run.plugin_ms)), 3),
            "plugin_max_during_swap_ms": round(float(max(run.plugin_ms[i] for i in during)), 3)
            if during
            else None,
        },
        "revision_loads_ms": [round(1e3 * (b - a), 1) for a, b in loads],
        "swap_rounds": [
            {
                "plugin_round": run.plugin_round[i],
                "host_ms": round(float(host[i]), 3),
                "host_cpu_ms": round(float(run.host_cpu_ms[i]), 3),
                "plugin_ms": round(float(run.plugin_ms[i]), 3),
                "gc_ms": round(float(run.gc_ms[i]), 3),
                "a_request_finished": bool(run.finishing[i]),
            }
            for i in sorted(swap_rounds)
        ],
        "round_host_cpu_ms": {
            "median": round(float(np.median(run.host_cpu_ms)), 3),
            "p99": round(float(np.percentile(run.host_cpu_ms, 99)), 3),
            "gc_ms_median": round(float(np.median(run.gc_ms)), 3),
            "max_during_swap": round(float(max(run.host_cpu_ms[i] for i in during)), 3)
            if during
            else None,
        },
        "bad_candidates": bad_report,
        "served_by_revision": served_by,
        "events": events,
        "published": [{"name": n, "round": r} for n, r, _ in operator.published],
        "refresh": {
            "exit_status": operator.refresh_exit,
            "seconds": None
            if operator.refresh_seconds is None
            else round(operator.refresh_seconds, 1),
            "report": _read_json(work / "refresh-report.json"),
        },
        "rounds": run.rounds,
        "wall_s": {
            "bootstrap": round(bootstrap_s, 1),
            "continuous_run": round(run.wall_s, 1),
            "total": round(time.perf_counter() - t_all, 1),
        },
    }
    doc["must_show"] = must_show(doc)
    write_json(args.out, doc)
    print(
        json.dumps(
            {k: doc[k] for k in ("stale", "after", "offline_reference", "must_show")}, indent=1
        )
    )
    return 0


def _ranked_by(finished: dict[Any, Any], spec: Any, bundle: Any, state: Any) -> bool:
    """Whether ``spec`` finished with the estimate ``bundle`` gives it (not re-estimated)."""
    from dwise_predict.sglang.prompt import user_prompt

    tr = finished.get(spec.rid)
    if tr is None:
        return False
    text = user_prompt(spec.input_ids, state.decoder, bundle.admission.featurizer)
    estimate = bundle.predict_admission_prompt(text, len(spec.input_ids))
    return bool(np.isclose(tr.admission, estimate))


def must_show(doc: dict[str, Any]) -> dict[str, Any]:
    stale, after, ref = doc["stale"], doc["after"], doc["offline_reference"]

    def ok(*xs: Any) -> bool:
        return all(x is not None for x in xs)

    sr, sp, ar, ap, rp = (
        stale["admission_median_ratio"],
        stale["admission_rho"],
        after["admission_median_ratio"],
        after["admission_rho"],
        ref["admission_rho"],
    )
    host, med = doc["max_round_host_ms_during_swap"], doc["median_round_host_ms"]
    loading = doc["round_host_ms"]["while_loading"]
    kind = loading["same_kind"]["max_over_kind_median"]
    return {
        "drift_is_real": (ok(sr) and not 0.85 <= sr <= 1.15) or (ok(sp, rp) and sp <= rp - 0.10),
        "recovered": ok(ar, ap, rp) and 0.85 <= ar <= 1.15 and ap >= rp - 0.05,
        "flagged_within_200": ok(doc["flagged_after_requests"])
        and doc["flagged_after_requests"] <= 200,
        "clean": doc["failed_requests"] == 0
        and doc["kv_leaked_tokens"] == 0
        and doc["outputs_equal_stock"],
        "swap_round_within_2x_median": ok(host) and host <= 2 * med,
        "swap_round_over_median": None if host is None else round(host / med, 3),
        # the rounds a load overlapped, each against the median of its kind (see same_kind)
        "rounds_while_loading_within_2x_kind_median": ok(kind) and kind <= 2.0,
        "rounds_while_loading_over_kind_median": kind,
        "strict_rounds_of_swap_or_load_over_median": loading["max_with_swap_rounds_over_median"],
        "bad_candidates_served_nothing": all(
            b["served_requests"] == 0 for b in doc["bad_candidates"]
        ),
    }


def same_kind(host: np.ndarray, finishing: np.ndarray, marked: list[int]) -> dict[str, Any]:
    """Per kind of round (a request finished in it, or none did): the median, p90 and max
    host time of the ``marked`` rounds against the other rounds of that kind, and the largest
    ratio of a marked round to its kind's median."""
    mark = np.zeros(host.size, dtype=bool)
    mark[marked] = True
    out: dict[str, Any] = {}
    worst = 0.0
    for name, kind in (("finishing", True), ("other", False)):
        rest = host[(finishing == kind) & ~mark]
        swap = host[(finishing == kind) & mark]
        if rest.size == 0:
            continue
        med = float(np.median(rest))
        row: dict[str, Any] = {"rounds": int(rest.size), "overlapping": int(swap.size)}
        for q, label in ((50, "median"), (90, "p90")):
            row[label] = round(float(np.percentile(rest, q)), 3)
            if swap.size:
                row[f"{label}_overlapping"] = round(float(np.percentile(swap, q)), 3)
        row["max"] = round(float(rest.max()), 3)
        if swap.size:
            row["max_overlapping"] = round(float(swap.max()), 3)
            worst = max(worst, float(swap.max()) / med)
        out[name] = row
    out["max_over_kind_median"] = round(worst, 3) if marked else None
    return out


def _random_max(host: np.ndarray, k: int, draws: int = 2000, seed: int = 0) -> float:
    """The median, over ``draws`` random sets of ``k`` rounds, of their largest host time."""
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.choice(host.size, size=k, replace=False) for _ in range(draws)])
    return float(np.median(host[picks].max(axis=1)))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def _version(name: str) -> str | None:
    from dwise_predict.engine_names import package_version

    return package_version(name)


if __name__ == "__main__":
    raise SystemExit(main())
