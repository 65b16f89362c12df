"""Rounds per block under LowConfidence and JointThreshold, on the same prompts, two models.

Traces the same generated prompts (math / mcq / synthetic, offline) through
``trace_workload`` on the shipped tiny-bd reference model and on a tiny random DiffusionGemma
(the test suite's: 2 layers, hidden 32, canvas 8, tiny-bd's byte tokenizer), once per decoder
at SGLang 0.5.23's defaults: LowConfidence τ 0.95; JointThreshold M2T 0.5, edit 0.0, 16
post-edit steps. DiffusionGemma is also traced with its own entropy-bound sampler for
reference. Reads the traces back (so ``S`` and the validation are exercised) and reports, per
model and decoder: ``S``, rounds per block (mean, median, p90, max), the share of blocks that
took more rounds than the block size, and total denoising rounds.

    .venv/bin/python benchmarks/decoders.py [--n 24] [--max-new-tokens 64]

Prints a table and writes benchmarks/results/decoders.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dwise_predict.atomic import write_json
from dwise_predict.tables import format_table
from dwise_predict.traces import read_trace_fingerprint, read_traces

RESULTS = Path(__file__).parent / "results" / "decoders.json"
DECODERS = ("low_confidence", "joint_threshold")


def prompts(n: int, seed: int) -> list[dict[str, str]]:
    """Generated math / mcq / synthetic prompts (offline, varied lengths) as bare records."""
    from dwise_predict.tracing.workload.generators import generate

    cats = ("math", "mcq", "synthetic")
    out: list[dict[str, str]] = []
    for i, cat in enumerate(cats):
        k = n // len(cats) + (1 if i < n % len(cats) else 0)
        out += [
            {"id": r.id, "category": cat, "source": r.source, "prompt": r.prompt}
            for r in generate(cat, k, seed)
        ]
    return out


def tiny_diffusion_gemma(folder: Path) -> Path:
    """The test suite's tiny random DiffusionGemma, built offline."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from _tracing_helpers import make_diffusion_gemma

    return make_diffusion_gemma(folder, canvas_length=8, max_denoising_steps=6)


def summarize(out: Path, wall_s: float) -> dict[str, Any]:
    table = read_traces(out)
    fp = read_trace_fingerprint(out)
    rounds = np.concatenate(
        [np.asarray(r, dtype=np.int64) for r in table.column("rounds_per_block").to_pylist()]
    )
    return {
        "decoding": fp.decoding,
        "threshold": fp.threshold,
        "block_size": fp.block_size,
        "max_steps_per_block": fp.max_steps_per_block,
        "requests": table.num_rows,
        "blocks": int(rounds.size),
        "rounds_per_block_mean": float(rounds.mean()),
        "rounds_per_block_median": float(np.median(rounds)),
        "rounds_per_block_p90": float(np.percentile(rounds, 90)),
        "rounds_per_block_max": int(rounds.max()),
        "blocks_over_block_size": float((rounds > fp.block_size).mean()),
        "total_rounds": int(rounds.sum()),
        "wall_s": wall_s,
    }


def trace(
    adapter: Any, records: list[dict[str, str]], decoding: str | None, budget: int, tmp: Path
) -> dict[str, Any]:
    from dwise_predict.tracing.runner import trace_workload

    out = tmp / f"{adapter.info.model_id.replace(':', '_')}-{decoding or 'own'}"
    t0 = time.perf_counter()
    trace_workload(adapter, records, out, max_new_tokens=budget, decoding=decoding, batch_size=8)
    return summarize(out, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=24, help="prompts (same ones for every model/decoder)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: the 2 shared cores here)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from dwise_predict.tracing.adapters import load_adapter

    records = prompts(args.n, 0)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="decoders-") as d:
        tmp = Path(d)
        dg = tiny_diffusion_gemma(tmp / "dg")
        models = [
            ("tiny-bd (shipped weights)", load_adapter("tiny-bd")),
            ("tiny random DiffusionGemma", load_adapter(str(dg))),
        ]
        for label, adapter in models:
            runs: list[str | None] = list(DECODERS)
            if getattr(adapter, "native_loop", False):
                runs.append(None)
            for decoding in runs:
                results.append(
                    {"model": label, **trace(adapter, records, decoding, args.max_new_tokens, tmp)}
                )
    rows = [
        [
            r["model"],
            r["decoding"],
            f"{r['threshold']:g}",
            r["block_size"],
            r["max_steps_per_block"],
            r["blocks"],
            f"{r['rounds_per_block_mean']:.2f}",
            f"{r['rounds_per_block_median']:g}",
            f"{r['rounds_per_block_p90']:g}",
            r["rounds_per_block_max"],
            f"{100 * r['blocks_over_block_size']:.1f}%",
            r["total_rounds"],
            f"{r['wall_s']:.1f}",
        ]
        for r in results
    ]
    print(
        f"{len(records)} prompts (math/mcq/synthetic, seed 0), budget {args.max_new_tokens} "
        f"tokens, {args.threads} thread(s)"
    )
    print(
        format_table(
            [
                "model",
                "decoding",
                "threshold",
                "block",
                "S",
                "blocks",
                "mean",
                "median",
                "p90",
                "max",
                "> block",
                "rounds",
                "wall s",
            ],
            rows,
        )
    )
    payload = {
        "benchmark": "decoders",
        "prompts": len(records),
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
