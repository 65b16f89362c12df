"""vLLM's own order vs DWISE's, inside vLLM 0.33.0's real diffusion scheduler, on CPU.

Eval-split requests decoded by tiny-bd (their denoising steps per block and their tokens,
``tests/vllm_plugin/vllm_harness.py``) are served through vLLM's real ``DiffusionScheduler``
(``schedule``, ``update_from_output``, ``update_draft_token_ids``, KV cache manager, request
queues) with a scripted canvas/commit model runner, at ``max_num_seqs`` 8 and 32, in two
arrival regimes:

* ``burst``: every request at iteration 0;
* ``poisson-overload``: Poisson arrivals at 1.5x the rate the server can finish them
  (``max_num_seqs`` / the mean iterations a request takes alone).

Runs: ``fcfs`` (vLLM's default), ``priority-admission`` (``--scheduling-policy priority`` fed
the bundle's admission estimate, rounded, as each request's priority), ``dwise``
(``--scheduler-cls dwise_predict.vllm.DWISEDiffusionScheduler`` with the shipped tiny-bd
bundle, default policy: DWISE with the runtime's tail guard) and ``oracle`` (the same class
ranking by the true iterations left, denoising steps and commits, sent as ``vllm_xargs``), plus
``dwise-uncapped``: the paper's DWISE without a tail rule
(``DWISE_VLLM_POLICY=dwise-uncapped``). Then the
simulator's vLLM round model (``dwise_predict.runtime.vllm_replay``) replays each run from the
same requests and arrivals, and the tail guard's other settings (``guard_grid``, simulator
only: whether any setting of the default's rule reaches fcfs's p99 where the default misses).

    VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=1 .venv-vllm/bin/python \\
        benchmarks/vllm_scheduler.py --requests 256 --out benchmarks/results/vllm_scheduler.json

Decoding the 256 requests with tiny-bd takes about 10 minutes on one core (cached in
``--traces``, committed beside the results, and read only for the weights it was decoded from);
the 20 serving runs take under a minute. Needs
``make test-vllm``'s environment.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: the CPU harness that drives vLLM's real scheduler classes is test equipment (tests/)
sys.path.insert(0, str(ROOT / "tests" / "vllm_plugin"))

RUNS = ("fcfs", "priority-admission", "dwise", "oracle", "dwise-uncapped")
REGIMES = ("burst", "poisson-overload")
OVERLOAD = 1.5


def _summary(completion: dict[str, int], n: int, leaked: int, **more: Any) -> dict[str, Any]:
    vals = np.asarray(list(completion.values()), dtype=np.float64)
    return {
        "mean_completion_iterations": round(float(vals.mean()), 2) if vals.size else None,
        "p99_completion_iterations": (
            round(float(np.percentile(vals, 99)), 2) if vals.size else None
        ),
        "finished": len(completion),
        "requests": n,
        "kv_blocks_leaked": int(leaked),
        **more,
    }


def _estimates(traces: list[Any], bundle: str) -> dict[str, float]:
    """Each request's admission estimate, computed as the DWISE scheduler computes it (the
    bundle's tokenizer decodes the prompt ids, the template frame is removed, words,
    newlines and tokens go to the LightGBM model)."""
    from vllm_harness import CANVAS, make_request

    from dwise_predict import load_bundle
    from dwise_predict.vllm.config import VllmConfig
    from dwise_predict.vllm.state import DwiseVllmState

    b = load_bundle(bundle)
    state = DwiseVllmState(
        VllmConfig(bundle=bundle), b, canvas_length=CANVAS, max_running=8, prompt_chunk=8192
    )
    return {t.rid: float(b.predict_admission_one(state.features(make_request(t)))) for t in traces}


def _arrivals(traces: list[Any], regime: str, seqs: int, seed: int) -> dict[str, int]:
    if regime == "burst":
        return {t.rid: 0 for t in traces}
    # alone, a request takes a prompt step and r_b + 1 steps per block
    alone = statistics.mean(1 + sum(r + 1 for r in t.rounds_per_block) for t in traces)
    rate = OVERLOAD * seqs / alone  # requests per iteration
    rng = random.Random(seed)
    order = rng.sample(traces, len(traces))
    clock, out = 0.0, {}
    for t in order:
        out[t.rid] = int(clock)
        clock += rng.expovariate(rate)
    return out


def serve_run(
    run: str,
    traces: list[Any],
    arrivals: dict[str, int],
    est: dict[str, float],
    *,
    seqs: int,
    model_dir: Path,
    bundle: str,
    num_blocks: int,
    budget: int,
) -> tuple[dict[str, Any], Any]:
    from vllm_harness import DWISE_CLS, dwise_env, make_scheduler, serve

    kw: dict[str, Any] = dict(
        max_num_seqs=seqs, num_blocks=num_blocks, max_num_batched_tokens=budget
    )
    priorities = extras = None
    if run == "fcfs":
        sched = make_scheduler(model_dir, **kw)
    elif run == "priority-admission":
        sched = make_scheduler(model_dir, policy="priority", **kw)
        priorities = {t.rid: int(round(est[t.rid])) for t in traces}
    elif run == "dwise":
        sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(bundle), **kw)
    elif run == "dwise-uncapped":
        env = dwise_env(bundle, policy="dwise-uncapped")
        sched = make_scheduler(model_dir, scheduler_cls=DWISE_CLS, env=env, **kw)
    else:
        sched = make_scheduler(
            model_dir, scheduler_cls=DWISE_CLS, env=dwise_env(bundle, policy="oracle"), **kw
        )
        # the true iterations after the prompt: denoising steps and one commit a block
        extras = {
            t.rid: {"dwise_true_rounds": t.total_rounds + len(t.rounds_per_block)} for t in traces
        }
    res = serve(
        sched,
        traces,
        arrivals=arrivals,
        priorities=priorities,
        extras=extras,
        check_kv_every=64,
    )
    state = getattr(sched, "dwise", None)
    summary = _summary(
        res.completion,
        len(traces),
        res.kv_blocks_leaked,
        iterations=res.iterations,
        preemptions=res.preemptions,
        kv_balanced=res.kv_balanced_every_iteration,
        policy=None if state is None else state.policy.name,
        order_us_per_iteration=(
            None if state is None else round(state.stats.order_us_per_iteration, 1)
        ),
        wall_s=round(res.wall_seconds, 1),
    )
    return summary, res


#: the tail guard's settings the simulator sweeps beside the served runs (``guard_grid``):
#: where the default misses fcfs's p99, whether any setting of the same rule reaches it
GUARD_GRID: dict[str, dict[str, float]] = {
    **{f"scale{v:g}": {"scale": v} for v in (0.7, 0.8, 1.0)},
    **{f"quantile{v:g}": {"quantile": v} for v in (0.99, 0.995)},
    **{f"margin{v:g}": {"margin": v} for v in (8.0, 32.0)},
}


def replay_run(
    run: str,
    traces: list[Any],
    arrivals: dict[str, int],
    est: dict[str, float],
    *,
    seqs: int,
    num_blocks: int,
    budget: int,
    policy: Any = None,
) -> dict[str, Any]:
    from vllm_harness import CANVAS, KV_BLOCK

    from dwise_predict.runtime import make_policy
    from dwise_predict.runtime.vllm_replay import ReplayRequest, replay_vllm

    reqs = [
        ReplayRequest(
            t.rid,
            len(t.prompt_ids),
            tuple(t.rounds_per_block),
            arrivals[t.rid],
            est[t.rid],
            int(round(est[t.rid])),
        )
        for t in traces
    ]
    order: Any = (
        policy
        or {
            "fcfs": "fcfs",
            "priority-admission": "priority",
            "dwise": make_policy("dwise"),
            "oracle": make_policy("oracle"),
            "dwise-uncapped": make_policy("dwise-uncapped"),
        }[run]
    )
    res = replay_vllm(
        reqs,
        order,
        max_num_seqs=seqs,
        canvas=CANVAS,
        max_num_batched_tokens=budget,
        kv_pages=num_blocks,
        page_tokens=KV_BLOCK,
    )
    return _summary(
        res.completion,
        len(traces),
        res.kv_pages_leaked,
        iterations=res.iterations,
        preemptions=res.preemptions,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--seqs", default="8,32", help="max_num_seqs values, comma-separated")
    ap.add_argument("--regimes", default=",".join(REGIMES))
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--bundle", default="tiny-bd")
    ap.add_argument("--num-blocks", type=int, default=16384, help="KV pages of 16 tokens")
    ap.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-prompt-tokens", type=int, default=None, help="short prompts only (smoke runs)"
    )
    ap.add_argument(
        "--traces",
        default=str(ROOT / "benchmarks" / "results" / "vllm_scheduler.traces.json"),
        help="tiny-bd decodes of the requests: read if present, written otherwise",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vllm_scheduler.json"))
    args = ap.parse_args(argv)

    import tempfile

    from vllm_harness import make_model_dir, tiny_bd_traces

    t0 = time.perf_counter()
    traces = tiny_bd_traces(
        args.requests, max_prompt_tokens=args.max_prompt_tokens, cache=args.traces
    )
    print(f"{len(traces)} tiny-bd requests ({time.perf_counter() - t0:.0f} s)", flush=True)
    est = _estimates(traces, args.bundle)
    from dwise_predict.ranking import spearman

    rho = spearman(
        np.asarray([est[t.rid] for t in traces]), np.asarray([t.total_rounds for t in traces])
    )
    model_dir = make_model_dir(Path(tempfile.mkdtemp()) / "tiny-bd-served")
    out: dict[str, Any] = {
        "setup": {
            "vllm": "0.33.0",
            "scheduler_classes": "vLLM's real DiffusionScheduler (fcfs, priority-admission) and "
            "dwise_predict.vllm.DWISEDiffusionScheduler (dwise, oracle, dwise-uncapped); scripted "
            "canvas/commit runner replaying tiny-bd's denoising steps and tokens",
            "requests": len(traces),
            "canvas_length": 32,
            "kv_pages": args.num_blocks,
            "kv_page_tokens": 16,
            "max_num_batched_tokens": args.budget,
            "bundle": args.bundle,
            "admission_spearman_vs_true_rounds": None if rho is None else round(rho, 3),
            "poisson_overload_factor": OVERLOAD,
            "seed": args.seed,
            "completion_iterations": "scheduler iterations from arrival to the one that "
            "finishes the request (idle iterations skipped)",
        },
        "configs": {},
    }
    for seqs in (int(s) for s in args.seqs.split(",")):
        cfg: dict[str, Any] = {"regimes": {}, "simulator": {}}
        out["configs"][f"max_num_seqs={seqs}"] = cfg
        for regime in args.regimes.split(","):
            arrivals = _arrivals(traces, regime, seqs, args.seed)
            cfg["regimes"][regime] = {}
            cfg["simulator"][regime] = {}
            for run in args.runs.split(","):
                served, _ = serve_run(
                    run,
                    traces,
                    arrivals,
                    est,
                    seqs=seqs,
                    model_dir=model_dir,
                    bundle=args.bundle,
                    num_blocks=args.num_blocks,
                    budget=args.budget,
                )
                sim = replay_run(
                    run,
                    traces,
                    arrivals,
                    est,
                    seqs=seqs,
                    num_blocks=args.num_blocks,
                    budget=args.budget,
                )
                m_s, m_r = served["mean_completion_iterations"], sim["mean_completion_iterations"]
                sim["mean_relative_error"] = (
                    round(abs(m_r - m_s) / m_s, 4) if m_s and m_r is not None else None
                )
                cfg["regimes"][regime][run] = served
                cfg["simulator"][regime][run] = sim
                print(
                    f"max_num_seqs={seqs:<3} {regime:<17} {run:<19} mean {m_s:>8} "
                    f"p99 {served['p99_completion_iterations']:>8} finished "
                    f"{served['finished']}/{served['requests']} leaked "
                    f"{served['kv_blocks_leaked']} | sim mean {m_r} "
                    f"({sim['mean_relative_error']:.1%}) [{served['wall_s']} s]",
                    flush=True,
                )
            from dwise_predict.runtime.tails import TailGuard

            cfg.setdefault("guard_grid", {})[regime] = {
                label: replay_run(
                    "dwise",
                    traces,
                    arrivals,
                    est,
                    seqs=seqs,
                    num_blocks=args.num_blocks,
                    budget=args.budget,
                    policy=TailGuard(**settings),
                )
                for label, settings in GUARD_GRID.items()
            }
            runs = cfg["regimes"][regime]
            if "fcfs" in runs and "dwise" in runs:
                f, d = runs["fcfs"], runs["dwise"]
                cfg.setdefault("dwise_vs_fcfs", {})[regime] = {
                    "mean_speedup": round(
                        f["mean_completion_iterations"] / d["mean_completion_iterations"], 3
                    ),
                    "p99_ratio": round(
                        d["p99_completion_iterations"] / f["p99_completion_iterations"], 3
                    ),
                }
    out["setup"]["wall_s"] = round(time.perf_counter() - t0, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
