"""What the DWS trainer reads from traces: prompts, activity matrices and the surface's shape.

The activity matrix of a request is derived from its rounds per output block (never stored):
``A[b, s] = 1`` iff block ``b`` needed a step ``s``. Surfaces cover ``N`` output blocks (the
output budget over the block size) and ``S`` steps per block: the decoder's maximum steps per
block when the traces' fingerprint records it (``extra["max_steps_per_block"]``: decoders that
re-mask can need more steps than a block has tokens), else the block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.errors import TraceError, TrainingError
from dwise_predict.fingerprint import ABSOLUTE
from dwise_predict.traces import activity_matrix

from .dataset import as_table

#: fingerprint ``extra`` keys that may carry the decoder's maximum steps per block
MAX_STEPS_KEYS = ("max_steps_per_block", "max_steps")


@dataclass(frozen=True)
class DWSArrays:
    """Per-request inputs and targets of the DWS predictor and its scalar baselines."""

    prompts: list[str]
    category: np.ndarray  # (n,) str
    activity: np.ndarray  # (n, N, S) uint8
    rounds_per_block: list[list[int]]
    prompt_blocks: np.ndarray  # (n,) int: m in the cost model
    output_tokens: np.ndarray  # (n,) int
    block_size: int

    @property
    def n(self) -> int:
        return len(self.prompts)

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.activity.shape[1]), int(self.activity.shape[2])

    @property
    def total_steps(self) -> np.ndarray:
        return self.activity.reshape(self.n, -1).sum(axis=1).astype(np.int64)

    @property
    def output_blocks(self) -> np.ndarray:
        return self.activity[:, :, 0].sum(axis=1).astype(np.int64)

    def subset(self, mask: np.ndarray) -> DWSArrays:
        idx = np.flatnonzero(mask)
        return DWSArrays(
            [self.prompts[i] for i in idx],
            self.category[idx],
            self.activity[idx],
            [self.rounds_per_block[i] for i in idx],
            self.prompt_blocks[idx],
            self.output_tokens[idx],
            self.block_size,
        )


def max_steps_from_fingerprint(fingerprint: dict[str, Any] | None, block_size: int) -> int:
    """S: the decoder's maximum steps per block from the fingerprint, else the block size."""
    extra = (fingerprint or {}).get("extra") or {}
    for key in MAX_STEPS_KEYS:
        for where in (extra, fingerprint or {}):
            if where.get(key) is not None:
                return int(where[key])
    return int(block_size)


def budget_blocks(output_budget: int, block_size: int, absolute: bool) -> int:
    """The most output blocks a request with this budget can run: the surface's N.

    In the absolute layout the prompt's ``L mod bs`` tail shares the first output block, so the
    budget can spill into one block more than ``budget / bs`` (up to ``bs - 1`` positions are the
    prompt's). N must cover every request the model can run, not only those in the traces at
    hand, or a later eval or retrain meets a trace the surface cannot hold.
    """
    return math.ceil((output_budget + (block_size - 1 if absolute else 0)) / block_size)


def dws_arrays(
    traces: str | Path | pa.Table, *, n_blocks: int | None = None, max_steps: int | None = None
) -> DWSArrays:
    """Read prompts and activity matrices; ``n_blocks``/``max_steps`` fix the surface's shape
    (evaluation uses the bundle's), else they come from the traces."""
    import json

    from dwise_predict.traces import META_FINGERPRINT

    table = as_table(traces)
    if table.num_rows == 0:
        raise TrainingError("the traces hold no requests; trace some with `dwise-predict trace`")
    prompts = table.column("prompt").to_pylist()
    if any(p is None for p in prompts):
        raise TraceError(
            "some traces have no prompt text (written with prompts redacted); the DWS "
            "predictor reads the prompt: re-trace without redaction"
        )
    sizes = set(table.column("block_size").to_pylist())
    if len(sizes) != 1:
        raise TraceError(f"the traces mix block sizes {sorted(sizes)}; keep one decoder per folder")
    bs = int(sizes.pop())
    raw = (table.schema.metadata or {}).get(META_FINGERPRINT)
    fp = json.loads(raw) if raw is not None else None
    S = int(max_steps) if max_steps is not None else max_steps_from_fingerprint(fp, bs)  # noqa: N806
    rpb = [list(r) for r in table.column("rounds_per_block").to_pylist()]
    budget = table.column("output_budget").to_numpy()
    absolute = (fp or {}).get("block_alignment") == ABSOLUTE
    N = (
        int(n_blocks)
        if n_blocks is not None
        else max(  # noqa: N806
            max(budget_blocks(int(b), bs, absolute) for b in budget),
            max(len(r) for r in rpb),
        )
    )
    if any(len(r) > N for r in rpb):
        raise TraceError(
            f"some traces ran more than the surface's N = {N} output blocks; "
            "train on traces with the same output budget and block alignment"
        )
    worst = max(max(r) for r in rpb)
    if worst > S:
        raise TraceError(
            f"a block needed {worst} steps but the surface has S = {S} per block; "
            "record the decoder's max steps per block in the fingerprint "
            "(extra['max_steps_per_block']) or re-trace"
        )
    act = np.stack([activity_matrix(r, S, N) for r in rpb])
    return DWSArrays(
        prompts=[str(p) for p in prompts],
        category=np.asarray(table.column("category").to_pylist(), dtype=object),
        activity=act,
        rounds_per_block=rpb,
        prompt_blocks=table.column("prompt_blocks").to_numpy().astype(np.int64),
        output_tokens=table.column("output_tokens").to_numpy().astype(np.int64),
        block_size=bs,
    )
