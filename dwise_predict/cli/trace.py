"""`dwise-predict trace`: trace a dLLM's denoising rounds and first-round hidden states into
Parquet.

Composes :func:`dwise_predict.tracing.adapters.load_adapter` and
:func:`dwise_predict.tracing.runner.trace_workload`. torch/transformers are imported inside
:func:`run` only, so building the CLI parser stays light.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError, WorkloadError
from ..prompts import PromptColumns, PromptRecord, read_prompts, select_shard
from ..tables import format_table
from ._common import progress

log = logging.getLogger(__name__)


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Trace a dLLM's denoising rounds and first-round hidden states into Parquet",
        description="Decode every workload request with a block-diffusion LM and write one Parquet "
        "row per request (rounds per output block, first-round hidden state, prompt features, "
        "model fingerprint).",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="NAME_OR_PATH",
        help="'tiny-bd', a tiny-bd or DiffusionGemma folder, or hf-mask-predict:PATH_OR_HUB_ID",
    )
    p.add_argument(
        "--workload",
        required=True,
        type=Path,
        metavar="FILE",
        help="prompts as JSONL, Parquet or CSV (only a prompt field is required), or a "
        "workload folder with train.jsonl/eval.jsonl (see --split)",
    )
    p.add_argument(
        "--prompt-column",
        default="prompt",
        metavar="NAME",
        help="field holding the prompt: text or a list of role/content turns (default: prompt)",
    )
    p.add_argument(
        "--id-column",
        default="id",
        metavar="NAME",
        help="field holding the request id (default: id; absent: the line number)",
    )
    p.add_argument(
        "--category-column",
        default="category",
        metavar="NAME",
        help="field holding the category (default: category; absent: unknown)",
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="output folder for shard-NNNNN.parquet",
    )
    p.add_argument(
        "--split",
        default="eval",
        choices=("train", "eval"),
        help="which file of a workload folder to trace (default: eval)",
    )
    p.add_argument(
        "--block-size", type=int, default=None, help="block size (default: the model's own)"
    )
    p.add_argument(
        "--block-alignment",
        default=None,
        choices=("absolute", "response"),
        help="block layout: absolute = blocks at absolute positions, the prompt's tail in the "
        "first output block (SGLang's dLLM loop); response = output blocks start at the "
        "prompt's end (default: how the model is served: absolute for tiny-bd and "
        "hf-mask-predict, response for DiffusionGemma)",
    )
    p.add_argument(
        "--decoding",
        default=None,
        choices=("low_confidence", "joint_threshold"),
        help="decoder for mask-predict models (default: low_confidence); "
        "joint_threshold also edits decoded tokens, as SGLang's JointThreshold "
        "(LLaDA2.1's default)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="LowConfidence τ (default 0.95) or JointThreshold's mask-to-token "
        "threshold (default 0.5); DiffusionGemma: its entropy bound",
    )
    p.add_argument(
        "--edit-threshold",
        type=float,
        default=0.0,
        help="joint_threshold: re-write a decoded token when the model prefers another "
        "with probability above this (default: 0.0)",
    )
    p.add_argument(
        "--max-post-edit-steps",
        type=int,
        default=16,
        help="joint_threshold: edit steps allowed once a block has no mask (default: 16)",
    )
    p.add_argument(
        "--max-new-tokens", type=int, default=256, help="output budget in tokens (default: 256)"
    )
    p.add_argument(
        "--batch-size", type=int, default=8, help="requests decoded together (default: 8)"
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for the model (default: torch's "
        "choice); 1 is often fastest on a busy machine",
    )
    p.add_argument(
        "--limit", type=int, default=None, help="trace only the first N requests of the workload"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue a run in --out, skipping traced request ids"
    )
    p.add_argument(
        "--num-shards",
        type=int,
        default=1,
        metavar="N",
        help="split the workload over N tracing jobs by a hash of the request id (default: 1)",
    )
    p.add_argument(
        "--shard-index",
        type=int,
        default=0,
        metavar="I",
        help="the part this job traces, 0..N-1 (default: 0); the N parts are disjoint: give "
        "all N jobs one --out folder and --resume (each writes its own shard files; a rerun "
        "of a failed job continues it) and read the folder as one",
    )
    p.add_argument(
        "--shard-size", type=int, default=1000, help="requests per Parquet shard (default: 1000)"
    )
    p.add_argument(
        "--flush-interval",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="write a shard at least this often while requests finish, so a crash "
        "loses at most this much work (default: 60; 0: only every --shard-size)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="model weights dtype (default: float32)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument(
        "--mask-token-id", type=int, default=None, help="hf-mask-predict: the mask token id"
    )
    p.add_argument(
        "--redact-prompts", action="store_true", help="store only the prompt's sha256, not its text"
    )
    p.set_defaults(func=run)


def workload_file(path: Path, split: str) -> Path:
    """The file a --workload argument stands for: itself, or a workload folder's split."""
    if path.is_dir():
        f = path / f"{split}.jsonl"
        if not f.is_file():
            raise WorkloadError(
                f"workload folder {path} has no {split}.jsonl; build it with "
                f"`dwise-predict workload --out {path}` or pass a prompt file"
            )
        return f
    if not path.exists():
        raise WorkloadError(
            f"workload {path} does not exist; pass a JSONL, Parquet or CSV file "
            "of prompts, or a workload folder"
        )
    return path


def read_records(
    path: Path, split: str = "eval", columns: PromptColumns | None = None
) -> list[PromptRecord]:
    """The prompts a --workload argument stands for (:func:`dwise_predict.prompts.read_prompts`)."""
    return read_prompts(workload_file(path, split), columns)


def run(args: argparse.Namespace) -> int:
    for flag in ("max_new_tokens", "batch_size", "shard_size"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    columns = PromptColumns(
        prompt=args.prompt_column, id=args.id_column, category=args.category_column
    )
    records = select_shard(
        read_records(args.workload, args.split, columns), args.num_shards, args.shard_index
    )

    if args.flush_interval < 0:
        raise ConfigError(f"--flush-interval must be >= 0 seconds, got {args.flush_interval}")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    from dwise_predict.tracing.adapters import load_adapter
    from dwise_predict.tracing.runner import check_output, trace_workload

    check_output(args.out, args.resume)  # fail before the (slow) model load
    options = {"mask_token_id": args.mask_token_id} if args.mask_token_id is not None else {}
    adapter = load_adapter(args.model, dtype=args.dtype, device=args.device, **options)
    n = len(records) if args.limit is None else min(len(records), max(args.limit, 0))
    bar = progress(total=n, desc="trace", unit="req", quiet=args.quiet)
    try:
        summary = trace_workload(
            adapter,
            records,
            args.out,
            batch_size=args.batch_size,
            threshold=args.threshold,
            max_new_tokens=args.max_new_tokens,
            block_size=args.block_size,
            limit=args.limit,
            resume=args.resume,
            seed=args.seed,
            progress=bar,
            shard_size=args.shard_size,
            redact_prompts=args.redact_prompts,
            flush_interval_s=args.flush_interval,
            decoding=args.decoding,
            edit_threshold=args.edit_threshold,
            max_post_edit_steps=args.max_post_edit_steps,
            block_alignment=args.block_alignment,
        )
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM from a job scheduler
        print(
            f"dwise-predict trace: the requests finished before the stop are saved in {args.out};"
            " run the same command with --resume to trace the rest",
            file=sys.stderr,
        )
        raise
    finally:
        bar.close()
    rows = [
        ["model", summary.fingerprint.short()],
        ["requests traced", summary.traced],
        ["requests skipped (already traced)", summary.skipped],
        ["shards written", len(summary.shards)],
        ["denoising rounds", summary.denoising_rounds],
        ["requests/s", f"{summary.requests_per_s:.2f}"],
        ["rounds/s", f"{summary.rounds_per_s:.1f}"],
        ["output", str(args.out)],
    ]
    if not args.quiet:
        print(format_table(["trace", "value"], rows))
    return 0
