"""Validating a million-request trace set: the column-wise check against a per-row loop.

Builds an in-memory trace table of ``--rows`` requests (1 to 8 output blocks each, rounds per
block drawn in 1..S with S = 49: block 32 under JointThreshold), then times
``dwise_predict.traces.validate_table`` and, as the peer, the checks the reader made before,
in Python: a ``set`` of the ids, then a loop over requests (``to_pylist`` of the three round
columns, ``sum``/``min``/``max`` per request).
Median of ``--reps`` runs each.

    .venv/bin/python benchmarks/trace_validation.py [--rows 1000000] [--reps 3]

Prints a table and writes benchmarks/results/trace_validation.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from dwise_predict.atomic import write_json
from dwise_predict.tables import format_table
from dwise_predict.traces import validate_table

RESULTS = Path(__file__).parent / "results" / "trace_validation.json"
BLOCK, S = 32, 49


def table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    blocks = rng.integers(1, 9, size=rows)
    flat = rng.integers(1, S + 1, size=int(blocks.sum())).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int32)
    rpb = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))
    total = np.add.reduceat(flat.astype(np.int64), offsets[:-1])
    return pa.table(
        {
            "request_id": pa.array([f"r{i}" for i in range(rows)]),
            "block_size": pa.array(np.full(rows, BLOCK, dtype=np.int32)),
            "max_steps_per_block": pa.array(np.full(rows, S, dtype=np.int32)),
            "rounds_per_block": rpb,
            "total_rounds": pa.array(total.astype(np.int32)),
        }
    )


def row_loop(t: pa.Table) -> None:
    """The peer: one Python iteration per request."""
    ids = t.column("request_id").to_pylist()
    if len(set(ids)) != len(ids):
        raise ValueError("repeated ids")
    rpb = t.column("rounds_per_block").to_pylist()
    tot = t.column("total_rounds").to_pylist()
    lim = t.column("max_steps_per_block").to_pylist()
    for i, (r, n, b) in enumerate(zip(rpb, tot, lim, strict=True)):
        if not r or sum(r) != n or min(r) < 1 or max(r) > b:
            raise ValueError(f"request #{i}")


def timed(fn, t: pa.Table, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(t)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    t = table(args.rows)
    blocks = len(t.column("rounds_per_block").combine_chunks().flatten())
    ours = timed(lambda x: validate_table(x, "bench"), t, args.reps)
    peer = timed(row_loop, t, args.reps)
    print(f"{args.rows:,} requests, {blocks:,} blocks, median of {args.reps}")
    rows = [
        ["validate_table (column-wise)", f"{ours:.3f}", f"{peer / ours:.1f}x faster"],
        ["previous checks in Python (peer)", f"{peer:.3f}", "1.0x"],
    ]
    print(format_table(["check", "seconds", "vs loop"], rows))
    payload = {
        "benchmark": "trace_validation",
        "rows": args.rows,
        "blocks": blocks,
        "reps": args.reps,
        "validate_table_s": ours,
        "row_loop_s": peer,
        "speedup": peer / ours,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "cpu_count": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, payload)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
