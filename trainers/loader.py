"""Seeded shuffling over chunks of traces, sharded by rank and data-loader worker.

A random permutation of all requests needs every request in memory (or random access to each
row). Instead each epoch permutes *chunks* of contiguous rows, deals them out to the shards
(one shard per process and per data-loader worker), groups each shard's chunks into windows of
``window_chunks`` chunks, and shuffles rows within a window. A shard therefore holds one window
at a time, and a set that fits in one window is shuffled exactly as a full permutation would.

Under DDP every process must take the same number of optimizer steps per epoch, or the
gradient all-reduce waits forever; :meth:`ShufflePlan.quotas` trims each shard's batch count so
all processes agree, dropping at most about one batch per shard per epoch (a different one each
epoch). The plan needs only the row count and the fold of each row, never the rows themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from .dataset import TraceArrays
from .streaming import RowSource, concat_arrays


@dataclass(frozen=True)
class ShufflePlan:
    """Which rows go into which batch, for every epoch, process and worker.

    ``keep`` marks the rows this model trains on (a cross-fitted member skips its fold);
    ``batch_size`` is per process (a global batch of ``B`` over ``W`` processes is ``B // W``).
    """

    n: int
    chunk_rows: int
    window_chunks: int
    batch_size: int
    seed: int
    keep: np.ndarray | None = None

    @classmethod
    def for_shards(
        cls,
        n: int,
        shards: int,
        *,
        chunk_rows: int,
        window_chunks: int,
        batch_size: int,
        seed: int,
        keep: np.ndarray | None = None,
    ) -> ShufflePlan:
        """A plan whose chunks are small enough that every shard gets about four of them."""
        rows = max(16, min(chunk_rows, math.ceil(n / (4 * shards))))
        return cls(n, rows, window_chunks, batch_size, seed, keep)

    @property
    def n_chunks(self) -> int:
        return math.ceil(self.n / self.chunk_rows)

    def shard_windows(self, epoch: int, shard: int, shards: int) -> list[np.ndarray]:
        """Chunk ids of each window of ``shard``, in reading order."""
        order = np.random.default_rng([self.seed, epoch]).permutation(self.n_chunks)
        mine = order[shard::shards]
        return [mine[i : i + self.window_chunks] for i in range(0, len(mine), self.window_chunks)]

    def window_rows(self, chunk_ids: np.ndarray) -> np.ndarray:
        """Global row ids of a window, chunks concatenated in order."""
        c = self.chunk_rows
        return np.concatenate([np.arange(i * c, min((i + 1) * c, self.n)) for i in chunk_ids])

    def window_batches(
        self, chunk_ids: np.ndarray, epoch: int, shard: int, window: int
    ) -> list[np.ndarray]:
        """Positions (into the window's concatenated rows) of each batch of the window."""
        rows = self.window_rows(chunk_ids)
        pos = np.arange(len(rows)) if self.keep is None else np.flatnonzero(self.keep[rows])
        pos = pos[np.random.default_rng([self.seed, epoch, shard, window]).permutation(len(pos))]
        return [pos[i : i + self.batch_size] for i in range(0, len(pos), self.batch_size)]

    def batch_counts(self, epoch: int, shards: int) -> np.ndarray:
        counts = np.zeros(shards, dtype=np.int64)
        for s in range(shards):
            for chunk_ids in self.shard_windows(epoch, s, shards):
                rows = self.window_rows(chunk_ids)
                kept = len(rows) if self.keep is None else int(self.keep[rows].sum())
                counts[s] += math.ceil(kept / self.batch_size)
        return counts

    def quotas(self, epoch: int, world: int, workers: int) -> np.ndarray:
        """Batches each shard yields this epoch; every process's shards sum to the same count."""
        q = self.batch_counts(epoch, world * workers).reshape(world, workers)
        steps = int(q.sum(axis=1).min())
        for r in range(world):
            excess = int(q[r].sum()) - steps
            while excess > 0:  # take from the worker with most batches (first on ties)
                q[r, int(np.argmax(q[r]))] -= 1
                excess -= 1
        return q.reshape(-1)


Inputs = Callable[[TraceArrays], np.ndarray]


class TraceBatches(IterableDataset):
    """The batches ``(x, remaining, censored)`` of one process for one epoch.

    ``inputs`` turns a window's rows into model inputs (normalization); the window is read
    from ``source`` when the shard reaches it and dropped before the next one is read.
    """

    def __init__(
        self,
        source: RowSource,
        plan: ShufflePlan,
        inputs: Inputs,
        *,
        epoch: int,
        rank: int = 0,
        world: int = 1,
        workers: int = 0,
        censor_hit_budget: bool = True,
    ) -> None:
        super().__init__()
        self.source, self.plan, self.inputs, self.epoch = source, plan, inputs, epoch
        self.rank, self.world, self.workers = rank, world, max(1, workers)
        self.censor_hit_budget = censor_hit_budget
        self.quota = plan.quotas(epoch, world, self.workers)

    def __len__(self) -> int:
        return int(self.quota[self.rank * self.workers : (self.rank + 1) * self.workers].sum())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        shard = self.rank * self.workers + (info.id if info is not None else 0)
        shards = self.world * self.workers
        left = int(self.quota[shard])
        for w, chunk_ids in enumerate(self.plan.shard_windows(self.epoch, shard, shards)):
            if left <= 0:
                return
            c = self.plan.chunk_rows
            window = concat_arrays(
                [self.source.read(int(i) * c, (int(i) + 1) * c) for i in chunk_ids]
            )
            x = self.inputs(window)
            y = window.remaining.astype(np.int64)
            cens = window.hit_budget if self.censor_hit_budget else np.zeros(window.n, dtype=bool)
            for idx in self.plan.window_batches(chunk_ids, self.epoch, shard, w):
                if left <= 0:
                    return
                left -= 1
                yield (
                    torch.from_numpy(x[idx]),
                    torch.from_numpy(y[idx]),
                    torch.from_numpy(cens[idx]),
                )
