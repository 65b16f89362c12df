"""Stock SGLang vs the dwise plugin, inside SGLang 0.5.23's real dLLM scheduler, on CPU.

A burst of eval-split requests (stratified over categories, long contexts included) is served
twice through SGLang's real Scheduler, Req, DllmManager, PrefillAdder, ScheduleBatch,
ReqToTokenPool, KV allocator, LowConfidence and HookRegistry, with a model runner whose logits
are tiny-bd's, computed on CPU from each request's full token context:

* ``sglang-fcfs``: stock (``--max-running-requests B``: B residents, B blocks a round,
  prefill-first);
* ``dwise-plugin``: the plugin loaded by ``load_plugins()`` from its entry point, with
  ``--max-running-requests k*B`` and the shipped tiny-bd bundle.

Then the project's simulator replays the same requests (prompt blocks, rounds per block and
estimates as the plugin observed them) with the same B and k, and the two are printed side by
side. Finally the plugin's own per-round cost is measured at 1,024 residents + 3,072 waiting.

    .venv-sglang/bin/python benchmarks/sglang_scheduler.py --requests 64 --slots 16 \
        --out benchmarks/results/sglang_scheduler.json

Needs ``make test-sglang``'s environment. Prints a table and writes the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


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
        "plugin_us_per_round": (None if plugin_state is None
                                else round(plugin_state.plugin_us_per_round, 1)),
        "wall_s": round(res.wall_seconds, 1),
    }


def simulate_same(tracks: dict[str, Any], slots: int, k: int, block_size: int) -> dict[str, Any]:
    """Replay the served requests in the simulator, counting rounds as SGLang does.

    SGLang charges a block of r denoising steps r + 1 forwards and prefills floor(L / block)
    prompt blocks; the plugin's tracks hold r per block (the trace convention), so one forward
    per block is added back here.
    """
    from dwise_predict.runtime import DWISE, FCFS, RoundTimeModel, SimRequest, Workload, simulate

    reqs = [SimRequest(rid, tr.prompt_tokens // block_size, tr.prompt_tokens,
                       tuple(r + 1 for r in tr.rounds_per_block), tr.output_budget, block_size,
                       admission_estimate=tr.admission,
                       refined_estimate=tr.refined if tr.refined is not None else None)
            for rid, tr in sorted(tracks.items())]
    wl = Workload.from_requests(reqs)
    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)
    out = {}
    for name, pol in (("sglang-fcfs", FCFS()), ("dwise-plugin", DWISE())):
        run = simulate(wl, pol, slots=slots, k=k, round_time=rt, kv_pool_tokens=1 << 22)
        rounds = int(run.round_ms.size)
        out[name] = {"rounds": rounds,
                     "mean_completion_rounds": round(float(np.mean(run.finish_time)) * 1000.0, 2),
                     "prefill_only_round_frac": round(float(np.mean(
                         run.round_prompt == run.round_filled)), 4)}
    return out


def overhead(slots: int, k: int, residents: int = 1024, waiting: int = 3072,
             rounds: int = 50) -> dict[str, Any]:
    """The plugin's per-round cost (fold + arrivals + plan, SGLang's own adder excluded)."""
    from types import SimpleNamespace

    from dwise_predict.sglang.config import PluginConfig
    from dwise_predict.sglang.serving import DwiseServing

    class _Req:
        def __init__(self, i: int, rng: np.random.Generator) -> None:
            self.rid = f"r{i}"
            self.origin_input_text = "word " * int(rng.integers(5, 200))
            self.origin_input_ids = [0] * int(rng.integers(40, 400))
            self.sampling_params = SimpleNamespace(max_new_tokens=256)
            self.output_ids: list[int] = []
            self._done = False
            self._prefill = len(self.origin_input_ids) >= 32

        def finished(self) -> bool:
            return self._done

        def is_dllm_prefill(self) -> bool:
            return self._prefill

    from dwise_predict import load_bundle

    bundle = load_bundle("tiny-bd")
    B = 128
    cfg = PluginConfig(bundle="tiny-bd", slots=B, k=residents // B)
    st = DwiseServing(cfg, bundle, block_size=32, kv_pool_tokens=1 << 24, req_slots=residents,
                      refine=False)
    rng = np.random.default_rng(0)
    reqs = [_Req(i, rng) for i in range(residents + waiting)]
    st.register_arrivals(reqs)
    # make the first `residents` resident: run plans until the cap is reached
    while st.core.n_resident < residents:
        p = st.core.plan_round()
        st.core.update(__import__("dwise_predict.runtime", fromlist=["RoundResult"]).RoundResult(
            p.rows, np.zeros(p.rows.size, bool)))
    times = []
    nid = residents + waiting
    from dwise_predict.runtime import RoundResult

    for _ in range(rounds):
        t0 = time.perf_counter()
        p = st.core.plan_round()
        fin = np.zeros(p.rows.size, bool)
        fin[:2] = ~p.prompt[:2]
        st.core.update(RoundResult(p.rows, fin))
        new = [_Req(nid + j, rng) for j in range(int(fin.sum()))]
        nid += len(new)
        st.register_arrivals(new)
        times.append(time.perf_counter() - t0)
    return {"residents": residents, "waiting": waiting, "slots": B, "k": residents // B,
            "plugin_us_per_round_median": round(statistics.median(times) * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--out", default="benchmarks/results/sglang_scheduler.json")
    args = ap.parse_args(argv)

    from dwise_predict.zoo.tiny_bd.sglang_cpu import install_torchvision_shim

    install_torchvision_shim()
    import importlib.metadata

    from dwise_predict.zoo.tiny_bd.sglang_cpu import (
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

    B, K = args.slots, args.k
    runner = TinyBDRunner()
    reqs = eval_requests(args.requests, runner, max_new_tokens=args.max_new_tokens)
    mix = {c: sum(r.category == c for r in reqs) for c in sorted({r.category for r in reqs})}
    print(f"{len(reqs)} eval-split requests, stratified: {mix}", flush=True)

    remove_hooks()
    with environ({"DWISE_SGLANG_BUNDLE": None}):
        load_plugins()
        stock, _ = serve(reqs, max_running_requests=B, runner=runner)
    remove_hooks()
    print(f"stock: {stock.rounds} rounds in {stock.wall_seconds:.0f} s", flush=True)
    with environ({**plugin_env("tiny-bd", slots=B, k=K), "SGLANG_PLUGINS": "dwise"}):
        load_plugins()
        dw, s = serve(reqs, max_running_requests=B * K, runner=runner,
                      on_scheduler=lambda sch: setattr(attach(sch, load_config()),
                                                       "keep_finished", True))
    remove_hooks()
    state = s.dwise_serving
    print(f"plugin: {dw.rounds} rounds in {dw.wall_seconds:.0f} s", flush=True)

    runs = {"sglang-fcfs": _summary(stock, len(reqs)),
            "dwise-plugin": _summary(dw, len(reqs), state)}
    tracks = dict(state.finished)
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".runs.json").write_text(json.dumps(runs, indent=2) + "\n")  # in case
    sim = simulate_same(tracks, B, K, 32)
    ov = overhead(B, K)
    core_ref = None
    ref_file = Path(__file__).parent / "results" / "scheduler.json"
    if ref_file.exists():
        core_ref = json.loads(ref_file.read_text()).get("runtime")
    out = {
        "sglang_version": importlib.metadata.version("sglang"),
        "requests": len(reqs), "slots": B, "k": K, "max_new_tokens": args.max_new_tokens,
        "mix": mix, "arrivals": "burst",
        "runs": runs,
        "completion_speedup": round(runs["sglang-fcfs"]["mean_completion_rounds"]
                                    / runs["dwise-plugin"]["mean_completion_rounds"], 3),
        "outputs_equal": stock.output_ids == dw.output_ids,
        "max_refinements_per_request": int(max((1 if t.refined is not None else 0)
                                               for t in tracks.values())),
        "simulator": sim,
        "overhead": ov,
        "core_overhead_reference": core_ref,
        "monitor": state.monitor.snapshot(),
        "command": "python " + " ".join([sys.argv[0], *(argv or sys.argv[1:])]),
    }
    print(f"\n{'':28s}{'sglang-fcfs':>14s}{'dwise-plugin':>14s}")
    for key in ("rounds", "prefill_only_round_frac", "filled_slots_per_round",
                "mean_completion_rounds", "mean_ttft_rounds", "finished", "refinements",
                "plugin_us_per_round"):
        print(f"{key:28s}{runs['sglang-fcfs'][key]!s:>14s}{runs['dwise-plugin'][key]!s:>14s}")
    print(f"\nmean completion speedup {out['completion_speedup']}x, outputs equal: "
          f"{out['outputs_equal']}")
    print(f"\nsimulator vs SGLang's real loop (B={B}, k={K}):")
    print(f"{'':16s}{'real rounds':>12s}{'sim rounds':>12s}{'real mean':>12s}{'sim mean':>12s}")
    for name in ("sglang-fcfs", "dwise-plugin"):
        print(f"{name:16s}{runs[name]['rounds']:>12d}{sim[name]['rounds']:>12d}"
              f"{runs[name]['mean_completion_rounds']:>12.1f}{sim[name]['mean_completion_rounds']:>12.1f}")
    print(f"\nplugin overhead at {ov['residents']} residents + {ov['waiting']} waiting: "
          f"{ov['plugin_us_per_round_median']} us/round (core alone: "
          f"{core_ref if core_ref is not None else 'see benchmarks/scheduler.py'})")
    from dwise_predict.atomic import write_json

    write_json(path, out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
