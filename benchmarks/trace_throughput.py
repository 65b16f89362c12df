"""Tracing throughput on the reference model: requests/s and rounds/s at batch 1 and batch 16.

Both batch sizes run in the same process on the same requests, alternating, ``--repeats``
times; the table reports medians. Batch 1 is the peer: continuous batching should multiply
requests/s while each request's trace stays identical (tests/test_tracing_engine.py).

A second table runs the whole tracer (engine + Parquet writer) on ``--writer-n`` requests
with time-based flushing off and on (a shard every ``--flush-interval`` seconds, far more
often than the 60 s default), alternating, to show what the durability costs.

If the shipped tiny-bd weights (zoo/tiny_bd/weights) are not there yet, a randomly
initialised model of the default TinyBDConfig is used and the output says so: a random model
is unsure of every position, so every block takes block_size rounds (the slowest case).

    .venv/bin/python benchmarks/trace_throughput.py [--n 16] [--max-new-tokens 32] [--repeats 3] \
        [--writer-n 64] [--flush-interval 0.25]

Writes benchmarks/results/trace_throughput.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from dwise_predict.tracing.adapters.tiny_bd import TinyBDAdapter, load_tiny_bd
from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode
from dwise_predict.tracing.runner import trace_workload

from dwise_predict.atomic import write_json
from dwise_predict.tables import format_table

RESULTS = Path(__file__).parent / "results" / "trace_throughput.json"


def reference_adapter() -> tuple[TinyBDAdapter, str]:
    from dwise_predict.zoo.tiny_bd.io import WEIGHTS_DIR, save_pretrained

    if (WEIGHTS_DIR / "model.safetensors").exists():
        return load_tiny_bd("tiny-bd"), "tiny-bd (shipped weights)"
    from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
    from dwise_predict.zoo.tiny_bd.model import TinyBDModel

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="tinybd-random-"))
    save_pretrained(TinyBDModel(TinyBDConfig()), tmp / "m")
    return load_tiny_bd(
        tmp / "m"
    ), "tiny-bd RANDOM init, default TinyBDConfig (shipped weights not found)"


def prompts(n: int, seed: int) -> list[str]:
    """Generated math / mcq / synthetic prompts (offline, varied lengths)."""
    from dwise_predict.tracing.workload.generators import generate

    cats = ("math", "mcq", "synthetic")
    out: list[str] = []
    for i, cat in enumerate(cats):
        k = n // len(cats) + (1 if i < n % len(cats) else 0)
        out += [r.prompt for r in generate(cat, k, seed)]
    return out


def run_once(
    adapter: TinyBDAdapter, reqs: list[DecodeRequest], cfg: DecodeConfig, batch: int
) -> dict[str, float]:
    rounds = [0, 0]

    def on_round(n_rows: int, _s: float) -> None:
        rounds[0] += 1
        rounds[1] += n_rows

    t0 = time.perf_counter()
    results = list(decode(adapter, reqs, cfg, batch_size=batch, on_round=on_round))
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "rounds_per_s": rounds[0] / wall,
        "request_rounds_per_s": rounds[1] / wall,
        "denoising_rounds": sum(r.total_rounds for r in results),
        "engine_rounds": rounds[0],
    }


def run_writer(
    adapter: TinyBDAdapter,
    texts: list[str],
    cfg: DecodeConfig,
    batch: int,
    flush_interval_s: float | None,
) -> dict[str, float]:
    """The whole tracer into a fresh folder: engine, rows, and the Parquet writer."""
    records = [
        {"id": f"r{i}", "category": "bench", "source": "bench", "prompt": p}
        for i, p in enumerate(texts)
    ]
    with tempfile.TemporaryDirectory(prefix="trace-bench-") as tmp:
        s = trace_workload(
            adapter,
            records,
            Path(tmp) / "out",
            batch_size=batch,
            threshold=cfg.threshold,
            max_new_tokens=cfg.max_new_tokens,
            block_size=cfg.block_size,
            flush_interval_s=flush_interval_s,
        )
    return {
        "wall_s": s.wall_s,
        "requests_per_s": s.requests_per_s,
        "shards": len(s.shards),
        "write_ms": 1000 * s.write_s,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16, help="requests per run")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--threshold", type=float, default=0.95)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the 2 shared cores here)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--writer-n", type=int, default=64, help="requests per writer run")
    ap.add_argument(
        "--flush-interval",
        type=float,
        default=0.25,
        help="seconds between time-based flushes in the 'on' writer runs",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    adapter, what = reference_adapter()
    reqs = [
        DecodeRequest(f"r{i}", adapter.encode_prompt(p)) for i, p in enumerate(prompts(args.n, 0))
    ]
    cfg = DecodeConfig(
        block_size=adapter.info.native_block_size or 32,
        threshold=args.threshold,
        max_new_tokens=args.max_new_tokens,
    )
    run_once(adapter, reqs[:2], cfg, 2)  # warm-up
    runs: dict[int, list[dict[str, float]]] = {b: [] for b in args.batches}
    for _ in range(args.repeats):
        for b in args.batches:
            runs[b].append(run_once(adapter, reqs, cfg, b))
    med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    base = med[args.batches[0]]["requests_per_s"]
    rows = [
        [
            b,
            f"{m['requests_per_s']:.2f}",
            f"{m['rounds_per_s']:.1f}",
            f"{m['request_rounds_per_s']:.1f}",
            int(m["denoising_rounds"]),
            f"{m['wall_s']:.2f}",
            f"{m['requests_per_s'] / base:.2f}x",
        ]
        for b, m in med.items()
    ]
    print(
        f"model: {what}; {len(reqs)} requests, block {cfg.block_size}, tau {cfg.threshold}, "
        f"budget {cfg.max_new_tokens}, {args.threads} threads, median of {args.repeats}"
    )
    print(
        format_table(
            [
                "batch",
                "req/s",
                "rounds/s",
                "request-rounds/s",
                "denoising rounds",
                "wall s",
                "vs batch 1",
            ],
            rows,
        )
    )

    texts = prompts(args.writer_n, 1)
    wbatch = args.batches[-1]
    flushes = {"off": None, "on": args.flush_interval}
    wruns: dict[str, list[dict[str, float]]] = {k: [] for k in flushes}
    for _ in range(args.repeats):
        for k, interval in flushes.items():
            wruns[k].append(run_writer(adapter, texts, cfg, wbatch, interval))
    wmed = {k: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for k, rs in wruns.items()}
    off = wmed["off"]["requests_per_s"]
    print(
        f"\nwhole tracer (engine + writer), {len(texts)} requests, batch {wbatch}, "
        f"median of {args.repeats}"
    )
    print(
        format_table(
            ["time-based flush", "req/s", "shards written", "writing ms", "wall s", "vs off"],
            [
                [
                    f"{k}" + (f" (every {v} s)" if v else ""),
                    f"{wmed[k]['requests_per_s']:.2f}",
                    int(wmed[k]["shards"]),
                    f"{wmed[k]['write_ms']:.0f}",
                    f"{wmed[k]['wall_s']:.2f}",
                    f"{wmed[k]['requests_per_s'] / off:.3f}x",
                ]
                for k, v in flushes.items()
            ],
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "trace_throughput",
        "model": what,
        "requests": len(reqs),
        "block_size": cfg.block_size,
        "threshold": cfg.threshold,
        "max_new_tokens": cfg.max_new_tokens,
        "repeats": args.repeats,
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
        "median": {str(b): m for b, m in med.items()},
        "runs": {str(b): rs for b, rs in runs.items()},
        "writer": {
            "requests": len(texts),
            "batch": wbatch,
            "flush_interval_s": args.flush_interval,
            "median": wmed,
            "runs": wruns,
        },
        "notes": "rounds/s = batched forward rounds per second (prefill + denoising, commit "
        "forwards folded in); request-rounds/s = request-blocks advanced per second",
    }
    write_json(args.out, payload, sort_keys=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
