"""Rounds per request in the two block layouts, same prompts, the shipped tiny-bd.

Traces the same category-stratified requests of tiny-bd's eval split through
``trace_workload`` twice, ``--block-alignment response`` (how tiny-bd was trained and every
trace before the flag was made) and ``absolute`` (how SGLang's dLLM loop runs it: floor(L/32)
prompt blocks, the prompt's tail in the first output block), at SGLang's defaults
(LowConfidence τ 0.95, block 32). Reports per category the median denoising rounds in each
layout and their ratio (absolute / response), the median rounds of the first output block,
and how many requests finish at EOS. The layout the offline traces are made in is the layout
the predictors learn, so a large ratio is estimate error a server sees.

    .venv/bin/python benchmarks/block_alignment.py [--n 64] [--max-new-tokens 256]

Prints a table and writes benchmarks/results/block_alignment.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dwise_predict.atomic import write_json
from dwise_predict.tables import format_table
from dwise_predict.traces import read_trace_fingerprint, read_traces

RESULTS = Path(__file__).parent / "results" / "block_alignment.json"
LAYOUTS = ("response", "absolute")


def tiny_bd_workload() -> Any:
    """The default workload tiny-bd's recipe traces (``dwise-predict workload``): its
    ``train`` and ``eval`` splits, each in its own order."""
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig

    dc = DataConfig()
    return build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed)


def stratified(n: int) -> list[dict[str, str]]:
    """``n`` eval-split requests, round-robin over categories (the SGLang benchmark's mix)."""
    records = tiny_bd_workload().eval
    by_cat: dict[str, list[Any]] = {}
    for r in records:
        by_cat.setdefault(r.category, []).append(r)
    cats, picked, i = sorted(by_cat), [], 0
    while len(picked) < n and any(i < len(by_cat[c]) for c in cats):
        picked += [by_cat[c][i] for c in cats if i < len(by_cat[c])]
        i += 1
    return [
        {"id": r.id, "category": r.category, "source": r.source, "prompt": r.prompt}
        for r in picked[:n]
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from dwise_predict.tracing.adapters import load_adapter
    from dwise_predict.tracing.runner import trace_workload

    adapter = load_adapter("tiny-bd")
    records = stratified(args.n)
    tables, walls = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in LAYOUTS:
            t0 = time.perf_counter()
            trace_workload(
                adapter,
                records,
                Path(tmp) / layout,
                batch_size=args.batch_size,
                max_new_tokens=args.max_new_tokens,
                block_alignment=layout,
                flush_interval_s=None,
            )
            walls[layout] = time.perf_counter() - t0
            assert read_trace_fingerprint(Path(tmp) / layout).block_alignment == layout
            tables[layout] = {
                r["request_id"]: r for r in read_traces(Path(tmp) / layout).to_pylist()
            }
    cats = sorted({r["category"] for r in records})
    per_cat: dict[str, dict[str, Any]] = {}
    rows = []
    for cat in [*cats, "all"]:
        ids = [r["id"] for r in records if cat in ("all", r["category"])]
        entry: dict[str, Any] = {"requests": len(ids)}
        for layout in LAYOUTS:
            t = tables[layout]
            entry[layout] = {
                "median_rounds": float(np.median([t[i]["total_rounds"] for i in ids])),
                "median_first_block_rounds": float(
                    np.median([t[i]["rounds_per_block"][0] for i in ids])
                ),
                "eos_share": float(np.mean([t[i]["finished_eos"] for i in ids])),
            }
        ratios = [
            tables["absolute"][i]["total_rounds"] / tables["response"][i]["total_rounds"]
            for i in ids
        ]
        entry["median_ratio_absolute_over_response"] = float(np.median(ratios))
        per_cat[cat] = entry
        rows.append(
            [
                cat,
                len(ids),
                f"{entry['response']['median_rounds']:g}",
                f"{entry['absolute']['median_rounds']:g}",
                f"{entry['median_ratio_absolute_over_response']:.2f}x",
                f"{entry['response']['median_first_block_rounds']:g}",
                f"{entry['absolute']['median_first_block_rounds']:g}",
                f"{entry['response']['eos_share']:.0%} / {entry['absolute']['eos_share']:.0%}",
            ]
        )
    print(
        format_table(
            [
                "category",
                "requests",
                "rounds (response)",
                "rounds (absolute)",
                "median ratio abs/resp",
                "1st block (response)",
                "1st block (absolute)",
                "EOS resp / abs",
            ],
            rows,
        )
    )
    write_json(
        args.out,
        {
            "benchmark": "block_alignment",
            "model": "tiny-bd (shipped weights)",
            "config": {
                "n": args.n,
                "max_new_tokens": args.max_new_tokens,
                "batch_size": args.batch_size,
                "block_size": 32,
                "decoding": "low_confidence",
                "threshold": 0.95,
                "torch_threads": 1,
            },
            "per_category": per_cat,
            "wall_s": walls,
            "machine": {
                "platform": platform.platform(),
                "cpus": os.cpu_count(),
                "load_avg": os.getloadavg(),
            },
            "command": "benchmarks/block_alignment.py "
            f"--n {args.n} --max-new-tokens {args.max_new_tokens}",
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
