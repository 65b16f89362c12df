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

The INT8 recipes that need calibration (:func:`quantize_dws`) calibrate on the ``--pool-traces``
prompts (training prompts), never on the eval prompts their cost MAE is scored on.

    .venv/bin/python benchmarks/dws.py --bundle runs/bundle-dws --traces runs/traces-eval \
        --pool-traces runs/traces-train

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
    ap.add_argument(
        "--pool-traces",
        action="append",
        default=[],
        help="more traces whose prompts may be cut to 42 tokens (the eval split's alone may "
        "hold too few prompts that long)",
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/dws.json"))
    args = ap.parse_args()

    from dwise_predict.export.onnx_dws import calibration_feeds, int8_keep_fp32, quantize_dws
    from dwise_predict.export.quantize import quantize_int8
    from dwise_predict.trainers.dws import true_costs
    from dwise_predict.trainers.dws_data import dws_arrays

    import dwise_predict
    from dwise_predict.predictors.dws import ONNX_FILE, DWSPredictor
    from dwise_predict.traces import read_traces

    bundle = dwise_predict.load_bundle(args.bundle)
    if bundle.dws is None or bundle.cost_profile is None:
        raise SystemExit(
            f"{args.bundle} needs a DWS predictor and a cost profile "
            "(benchmarks/dws_quality.py writes one)"
        )
    cfg = bundle.dws.config
    tok = bundle.dws.tokenizer
    fp32 = DWSPredictor(bundle.path / ONNX_FILE, tok, cfg, threads=1)
    ev = dws_arrays(read_traces(args.traces), n_blocks=cfg.n_blocks, max_steps=cfg.max_steps)
    texts = ev.prompts
    extra: list[str] = []
    for path in args.pool_traces:
        extra += [p for p in read_traces(path).column("prompt").to_pylist() if p]
    # the recipe calibrates on prompts it is not scored on, as `train` does on its probes
    feeds = calibration_feeds(tok, extra or texts)
    with tempfile.TemporaryDirectory() as tmp:
        src = bundle.path / ONNX_FILE
        variants = {
            # per-tensor on every MatMul/Gemm (train's first recipe)
            "int8": quantize_int8(src, Path(tmp) / "dws.int8.onnx"),
            # per-channel, the FFN down-projections kept whole in FP32 (the second)
            "int8_pc_ffn2_fp32": quantize_int8(
                src, Path(tmp) / "dws.int8pc.onnx", per_channel=True, exclude=int8_keep_fp32(src)
            ),
            # as `train` exports now (quantize_dws): per-channel, outlier channels split off
            "int8_outliers_fp32": quantize_dws(src, Path(tmp) / "dws.int8split.onnx", feeds),
            # what `train --dws-int8-only` ships: the same, embedding tables int8 per row
            "int8_only_bundle": quantize_dws(
                src, Path(tmp) / "dws.int8emb.onnx", feeds, int8_embeddings=True
            ),
        }
        size_mb = {k: v.stat().st_size / 1e6 for k, v in variants.items()}
        size_mb["fp32_onnx"] = src.stat().st_size / 1e6
        preds = {k: DWSPredictor(v, tok, cfg, threads=1) for k, v in variants.items()}
        preds["fp32_onnx"] = fp32
        short = prompts_of_length(texts + extra, tok.tokenizer, 42, args.requests)
        lengths = [len(r) for r in tok.token_ids(short)]
        own = texts[: args.requests]
        own_len = [len(r) for r in tok.token_ids(own)]
        fns = {k: p.predict_surface for k, p in preds.items()}
        fns["torch_fp32"] = torch_peer(cfg)
        rows = {
            name: {k: req_per_s(fn, ps, args.repeats) for k, fn in fns.items()}
            for name, ps in (("42 tokens", short), ("eval prompts", own))
        }
        profile = bundle.cost_profile
        true = true_costs(ev, profile)
        m = ev.prompt_blocks
        surf = {k: p.predict_surface(texts) for k, p in preds.items()}
        mae = {
            k: float(np.mean(np.abs(profile.expected_cost(v, m) - true))) for k, v in surf.items()
        }
        max_err = {k: float(np.abs(v - surf["fp32_onnx"]).max()) for k, v in surf.items()}
    print(
        f"DWS predictor, one request per call, 1 thread, tokenisation included "
        f"({platform.machine()}, {os.cpu_count()} cpus, shared)"
    )
    cols = [*variants, "fp32_onnx", "torch_fp32"]
    print(f"{'prompts':26s} " + " ".join(f"{c:>18s}" for c in cols) + f" {'shipped/FP32':>12s}")
    for name, r in rows.items():
        ps, lens = (short, lengths) if name == "42 tokens" else (own, own_len)
        label = f"{name} ({len(ps)}, median {int(np.median(lens))} tok)"
        print(
            f"{label:26s} "
            + " ".join(f"{r[c]:18.1f}" for c in cols)
            + f" {r['int8_only_bundle'] / r['fp32_onnx']:11.2f}x"
        )
    for name, r in rows.items():
        print(
            f"{name}: speed-up over FP32 ONNX "
            + ", ".join(f"{k} {r[k] / r['fp32_onnx']:.2f}x" for k in variants)
        )
    print("file size MB: " + ", ".join(f"{k} {v:.1f}" for k, v in size_mb.items()))
    rel = {k: (mae[k] - mae["fp32_onnx"]) / mae["fp32_onnx"] for k in variants}
    for k in variants:
        print(
            f"cost MAE on {ev.n} eval requests: FP32 {mae['fp32_onnx']:.3f} ms, {k} "
            f"{mae[k]:.3f} ms ({100 * rel[k]:+.2f}%; paper +0.54%, goal within 1%), surface "
            f"max abs diff vs FP32 {max_err[k]:.3f}"
        )
    out = {
        "benchmark": "dws",
        "bundle": str(args.bundle),
        "requests": args.requests,
        "calibration_prompts": len(feeds),
        "repeats": args.repeats,
        "threads": 1,
        "encoder": cfg.encoder,
        "window": cfg.truncation.window,
        "req_per_s": rows,
        "n_prompts": {"42 tokens": len(short), "eval prompts": len(own)},
        "median_tokens": {
            "42 tokens": float(np.median(lengths)),
            "eval prompts": float(np.median(own_len)),
        },
        "cost_mae_ms": {
            "fp32": mae["fp32_onnx"],
            **{k: mae[k] for k in variants},
            **{f"{k}_rel_change": rel[k] for k in variants},
        },
        "surface_max_abs_diff_vs_fp32": {k: max_err[k] for k in variants},
        "file_size_mb": size_mb,
        "int8_variants": {
            "int8": "per-tensor int8 weights, every MatMul/Gemm (train's first recipe)",
            "int8_pc_ffn2_fp32": "per-channel int8 weights, the 6 FFN "
            "down-projections kept in fp32 (the second recipe)",
            "int8_outliers_fp32": "per-channel int8 weights, activation-outlier channels of each "
            "MatMul input split off into fp32 (quantize_dws, what train exports)",
            "int8_only_bundle": "as int8_outliers_fp32, embedding tables int8, one scale per row "
            "(`train --dws-int8-only`)",
        },
        "goals": {"int8_req_per_s_at_42": 150, "int8_over_fp32": 2.0, "cost_mae_rel": 0.01},
        "paper": {"int8_req_per_s_minilm_l12": 84, "speedup": 2.32, "cost_mae_rel": 0.0054},
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared)",
    }
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
    heads = DWSHeads(
        np.zeros((2, enc.dim), dtype=np.float32), cfg.n_blocks, cfg.max_steps, 256, 0.0
    ).eval()
    dtok = DWSTokenizer(tok, cfg)

    @torch.no_grad()
    def run(prompts: list[str]) -> np.ndarray:
        ids, mask = dtok.encode(prompts)
        return heads(enc(torch.as_tensor(ids), torch.as_tensor(mask))).numpy()

    return run


if __name__ == "__main__":
    main()
