"""DWS predictor throughput on ONE CPU core: INT8 vs FP32 ONNX vs torch FP32, tokenisation included.

What a scheduler pays per arriving request: raw prompt text -> WordPiece tokens (head+tail
truncation) -> encoder + heads -> surface. Every figure is a median of repeated passes over the
same prompts, one request per call (arrival order, no batching), onnxruntime with one intra-op
thread and torch with one thread, in the same run:

* at the DWS paper's median prompt length, 42 tokens (goal: INT8 >= 150 req/s and >= 2x FP32
  ONNX; paper: 84 req/s with MiniLM-L12, 2.32x), with the cost MAE of INT8 vs FP32 on the eval
  split under the bundle's profile (goal: within 1%);
* over the eval prompts at their own lengths, with torch FP32 as the peer (the same encoder
  architecture, all-MiniLM-L6-v2, and heads of the same shape: weight values do not change
  its speed).

    .venv/bin/python benchmarks/dws.py --bundle runs/bundle-dws --traces runs/traces-eval

Prints a table, writes ``benchmarks/results/dws.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def req_per_s(fn, prompts: list[str], repeats: int) -> float:
    """Median over ``repeats`` passes of one-request-per-call throughput."""
    fn(prompts[:4])  # warm-up (session arenas, tokenizer caches)
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for p in prompts:
            fn([p])
        rates.append(len(prompts) / (time.perf_counter() - t))
    return statistics.median(rates)


def prompts_of_length(texts: list[str], tokenizer, n_tokens: int, count: int) -> list[str]:
    """Eval prompts cut to ``n_tokens`` encoder tokens ([CLS] and [SEP] included)."""
    out = []
    for t in texts:
        ids = tokenizer.encode(t, add_special_tokens=False).ids
        if len(ids) >= n_tokens - 2:
            out.append(tokenizer.decode(ids[: n_tokens - 2]))
        if len(out) == count:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default="runs/bundle-dws")
    ap.add_argument("--traces", default="runs/traces-eval")
    ap.add_argument("--requests", type=int, default=200, help="prompts per pass")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/dws.json"))
    args = ap.parse_args()

    from dwise_predict.export.quantize import quantize_int8
    from dwise_predict.trainers.dws import true_costs
    from dwise_predict.trainers.dws_data import dws_arrays

    import dwise_predict
    from dwise_predict.predictors.dws import ONNX_FILE, DWSPredictor
    from dwise_predict.traces import read_traces

    bundle = dwise_predict.load_bundle(args.bundle)
    if bundle.dws is None or bundle.cost_profile is None:
        raise SystemExit(f"{args.bundle} needs a DWS predictor and a cost profile "
                         "(benchmarks/dws_quality.py writes one)")
    cfg = bundle.dws.config
    tok = bundle.dws.tokenizer
    fp32 = DWSPredictor(bundle.path / ONNX_FILE, tok, cfg, threads=1)
    with tempfile.TemporaryDirectory() as tmp:
        q_path = quantize_int8(bundle.path / ONNX_FILE, Path(tmp) / "dws.int8.onnx")
        int8 = DWSPredictor(q_path, tok, cfg, threads=1)
        ev = dws_arrays(read_traces(args.traces), n_blocks=cfg.n_blocks, max_steps=cfg.max_steps)
        texts = ev.prompts
        short = prompts_of_length(texts, tok.tokenizer, 42, args.requests)
        lengths = [len(r) for r in tok.token_ids(short)]
        own = texts[: args.requests]
        own_len = [len(r) for r in tok.token_ids(own)]
        torch_fn = torch_peer(cfg)
        rows = {
            "42 tokens": {"int8": req_per_s(int8.predict_surface, short, args.repeats),
                          "fp32_onnx": req_per_s(fp32.predict_surface, short, args.repeats),
                          "torch_fp32": req_per_s(torch_fn, short, args.repeats)},
            "eval prompts": {"int8": req_per_s(int8.predict_surface, own, args.repeats),
                             "fp32_onnx": req_per_s(fp32.predict_surface, own, args.repeats),
                             "torch_fp32": req_per_s(torch_fn, own, args.repeats)},
        }
        profile = bundle.cost_profile
        true = true_costs(ev, profile)
        m = ev.prompt_blocks
        mae32 = float(np.mean(np.abs(profile.expected_cost(fp32.predict_surface(texts), m) - true)))
        mae8 = float(np.mean(np.abs(profile.expected_cost(int8.predict_surface(texts), m) - true)))
    print(f"DWS predictor, one request per call, 1 thread, tokenisation included "
          f"({platform.machine()}, {os.cpu_count()} cpus, shared)")
    print(f"{'prompts':26s} {'INT8 req/s':>11s} {'FP32 ONNX':>10s} {'torch FP32':>11s} "
          f"{'INT8/FP32':>10s}")
    for name, r in rows.items():
        med = int(np.median(lengths if name == "42 tokens" else own_len))
        print(f"{name + f' (median {med} tok)':26s} {r['int8']:11.1f} {r['fp32_onnx']:10.1f} "
              f"{r['torch_fp32']:11.1f} {r['int8'] / r['fp32_onnx']:9.2f}x")
    rel = (mae8 - mae32) / mae32
    print(f"cost MAE on {ev.n} eval requests: FP32 {mae32:.3f} ms, INT8 {mae8:.3f} ms "
          f"({100 * rel:+.2f}%; paper +0.54%, goal within 1%)")
    out = {"benchmark": "dws", "bundle": str(args.bundle), "requests": args.requests,
           "repeats": args.repeats, "threads": 1, "encoder": cfg.encoder,
           "window": cfg.truncation.window, "req_per_s": rows,
           "median_tokens": {"42 tokens": float(np.median(lengths)),
                             "eval prompts": float(np.median(own_len))},
           "cost_mae_ms": {"fp32": mae32, "int8": mae8, "int8_rel_change": rel},
           "goals": {"int8_req_per_s_at_42": 150, "int8_over_fp32": 2.0, "cost_mae_rel": 0.01},
           "paper": {"int8_req_per_s_minilm_l12": 84, "speedup": 2.32, "cost_mae_rel": 0.0054},
           "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared)"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


def torch_peer(cfg):
    """all-MiniLM-L6-v2 + heads of the bundle's shape in torch, one thread."""
    import torch
    from dwise_predict.trainers.dws import DWSHeads, PooledEncoder, load_encoder

    from dwise_predict.predictors.dws import DWSTokenizer

    torch.set_num_threads(1)
    raw, tok, _ = load_encoder(None)
    enc = PooledEncoder(raw).eval()
    heads = DWSHeads(np.zeros((2, enc.dim), dtype=np.float32), cfg.n_blocks, cfg.max_steps, 256,
                     0.0).eval()
    dtok = DWSTokenizer(tok, cfg)

    @torch.no_grad()
    def run(prompts: list[str]) -> np.ndarray:
        ids, mask = dtok.encode(prompts)
        return heads(enc(torch.as_tensor(ids), torch.as_tensor(mask))).numpy()

    return run


if __name__ == "__main__":
    main()
