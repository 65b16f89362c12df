"""Trace rows in bounded pieces: one reader for traces in memory and traces larger than memory.

A trace set of a million requests holds 8-16 GB of first-round hidden states, more than a
trainer should load at once. Training and evaluation therefore see the traces through a
:class:`RowSource`: ``n`` rows addressed by global index, read a *chunk* of contiguous rows at a
time. :class:`ParquetSource` reads the shard files with a pyarrow dataset (any pyarrow
filesystem: local, S3, GCS, HDFS), one row group at a time, projected to the columns the
predictors need; :class:`ArraySource` serves arrays already in memory. Both yield the same
:class:`TraceArrays` per chunk, so the two paths compute the same numbers.

What scales with the number of traces is kept to a few bytes per request (remaining rounds,
censoring flag, category code, fold: :class:`TraceStats`); what scales with the hidden size
never exceeds one shuffle window (``window_chunks x chunk_rows`` rows) per data-loader worker,
plus its prefetched batches.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from dwise_predict.errors import TraceError, TrainingError
from dwise_predict.features import FEATURE_NAMES, LEXICAL_FEATURES
from dwise_predict.traces import (
    META_FINGERPRINT,
    check_schema,
    derived_helpers,
    migrate_table,
    trace_files,
    validate_table,
)

from .dataset import TraceArrays, trace_arrays

#: the columns :func:`trace_arrays` reads: everything the predictors and the metrics need
#: (the prompt's lexical counts, derived from its text in traces older than schema v3; never
#: the text itself)
ARRAY_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            "request_id",
            "category",
            *FEATURE_NAMES,
            *LEXICAL_FEATURES,
            "total_rounds",
            "prompt_tokens",
            "output_budget",
            "hit_budget",
            "output_tokens",
            "first_round_hidden",
        )
    )
)
#: also read by the one checking pass over the traces (rounds must add up per request)
CHECK_COLUMNS: tuple[str, ...] = (
    *ARRAY_COLUMNS,
    "rounds_per_block",
    "block_size",
    "max_steps_per_block",
)


class RowSource(Protocol):
    """``n`` trace rows, read ``[start, stop)`` at a time."""

    @property
    def n(self) -> int: ...

    def read(self, start: int, stop: int, *, check: bool = False) -> TraceArrays: ...


class ArraySource:
    """Rows already in memory (the path for traces that fit, and for tables built in code)."""

    def __init__(self, arrays: TraceArrays) -> None:
        self.arrays = arrays

    @property
    def n(self) -> int:
        return self.arrays.n

    def read(self, start: int, stop: int, *, check: bool = False) -> TraceArrays:
        return self.arrays.subset(np.arange(start, min(stop, self.n)))


@dataclass(frozen=True)
class _RowGroup:
    fragment: Any  # pyarrow.dataset.ParquetFileFragment of one row group
    start: int
    rows: int


class ParquetSource:
    """Trace shards read as a pyarrow dataset, row group by row group, with column projection.

    ``path`` is a trace file, a folder of shards, a list of files, or a URI that pyarrow
    understands (``s3://bucket/traces/``); ``filesystem`` is any ``pyarrow.fs`` filesystem.
    Files are taken in sorted path order, the order :func:`read_traces` uses, so row ``i`` is
    the same request in both. Each file's schema version and fingerprint are checked from its
    footer; values are checked chunk by chunk (``read(..., check=True)``).
    """

    def __init__(self, path: str | Path | Sequence[str | Path], *, filesystem: Any = None) -> None:
        import pyarrow.dataset as ds

        self.path = path
        paths: Any
        if filesystem is None and isinstance(path, (str, Path)) and "://" not in str(path):
            paths = [str(p) for p in trace_files(path)]
        elif isinstance(path, (list, tuple)):
            paths = sorted(str(p) for p in path)
        else:
            paths = str(path)
        try:
            dataset = ds.dataset(paths, format="parquet", filesystem=filesystem)
        except (OSError, pa.ArrowInvalid) as e:
            raise TraceError(
                f"cannot open the traces at {path}: {e}; pass a trace file, a "
                "folder of shards or a URI pyarrow reads (s3://, gs://, hdfs://)"
            ) from e
        fragments = sorted(dataset.get_fragments(), key=lambda f: f.path)
        if not fragments:
            raise TraceError(f"no trace files at {path}; run `dwise-predict trace` first")
        self.fingerprint: bytes | None = None
        self.metadata: dict[bytes, bytes] = {}
        groups: list[_RowGroup] = []
        start = 0
        for frag in fragments:
            schema = frag.physical_schema
            check_schema(schema, Path(frag.path))
            fp = (schema.metadata or {}).get(META_FINGERPRINT)
            if not self.metadata:
                self.fingerprint, self.metadata = fp, dict(schema.metadata or {})
            elif fp != self.fingerprint:
                raise TraceError(
                    f"trace shards at {path} come from different models or decoding "
                    f"settings ({fragments[0].path} vs {frag.path}); keep one model's "
                    "traces per folder"
                )
            frag.ensure_complete_metadata()
            for rg in frag.split_by_row_group():
                rows = rg.row_groups[0].num_rows
                if rows:
                    groups.append(_RowGroup(rg, start, rows))
                    start += rows
        self._groups = groups
        self._starts = np.array([g.start for g in groups], dtype=np.int64)
        self._n = start
        on_disk = fragments[0].physical_schema.names
        #: the columns read: those on disk, and those an older schema derives from them
        self.columns = [c for c in CHECK_COLUMNS if c in on_disk or derived_helpers([c], on_disk)]
        if self._n == 0:
            raise TrainingError(
                f"the traces at {path} hold no requests; trace some with `dwise-predict trace`"
            )

    @property
    def n(self) -> int:
        return self._n

    def read_table(self, start: int, stop: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows ``[start, stop)`` as an Arrow table (only the row groups they touch are read)."""
        stop = min(stop, self._n)
        cols = list(columns) if columns is not None else self.columns
        first = int(np.searchsorted(self._starts, start, side="right")) - 1
        parts = []
        for g in self._groups[first:]:
            if g.start >= stop:
                break
            table = _read_fragment(g.fragment, cols)
            lo, hi = max(start, g.start), min(stop, g.start + g.rows)
            parts.append(table.slice(lo - g.start, hi - lo))
        table = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
        return table.replace_schema_metadata(self.metadata)

    def read(self, start: int, stop: int, *, check: bool = False) -> TraceArrays:
        table = self.read_table(start, stop)
        if check:
            validate_table(table, f"traces at {self.path} (rows {start}-{stop})")
        return trace_arrays(table, need_hidden="first_round_hidden" in table.column_names)

    def read_columns(self, columns: Sequence[str]) -> pa.Table:
        """Whole columns of every row (the small ones: admission features, rounds, category)."""
        names = self.head().column_names
        cols = [
            c for c in columns if c in self.columns or c in names or derived_helpers([c], names)
        ]
        table = pa.concat_tables([_read_fragment(g.fragment, cols) for g in self._groups])
        return table.replace_schema_metadata(self.metadata)

    def head(self, rows: int = 1) -> pa.Table:
        """The first ``rows`` rows with every column (fingerprint, featurizer check)."""
        first = self._groups[0].fragment.to_table().slice(0, rows)
        return first.replace_schema_metadata(self.metadata)

    def fingerprint_json(self) -> dict[str, Any] | None:
        return None if self.fingerprint is None else json.loads(self.fingerprint)


def _read_fragment(fragment: Any, columns: Sequence[str]) -> pa.Table:
    """One shard's columns, migrated to the current trace schema (a v1 shard has no S column:
    it is derived from ``block_size``, which is then read too)."""
    names = fragment.physical_schema.names
    on_disk = [c for c in columns if c in names] + derived_helpers(columns, names)
    table = migrate_table(fragment.to_table(columns=on_disk, use_threads=False))
    return table.select([c for c in columns if c in table.column_names])


def chunks(n: int, chunk_rows: int) -> Iterator[tuple[int, int]]:
    """``[start, stop)`` of each chunk of ``chunk_rows`` rows, in order."""
    for start in range(0, n, chunk_rows):
        yield start, min(start + chunk_rows, n)


def concat_arrays(parts: Sequence[TraceArrays]) -> TraceArrays:
    """One :class:`TraceArrays` of several chunks, in order."""
    if len(parts) == 1:
        return parts[0]
    hidden = (
        None
        if any(p.hidden is None for p in parts)
        else np.concatenate([p.hidden for p in parts if p.hidden is not None])
    )
    return TraceArrays(
        request_id=np.concatenate([p.request_id for p in parts]),
        category=np.concatenate([p.category for p in parts]),
        features=np.concatenate([p.features for p in parts]),
        total_rounds=np.concatenate([p.total_rounds for p in parts]),
        prompt_tokens=np.concatenate([p.prompt_tokens for p in parts]),
        output_budget=np.concatenate([p.output_budget for p in parts]),
        hit_budget=np.concatenate([p.hit_budget for p in parts]),
        hidden=hidden,
        output_tokens=None
        if any(p.output_tokens is None for p in parts)
        else np.concatenate([p.output_tokens for p in parts if p.output_tokens is not None]),
        lexical=None
        if any(p.lexical is None for p in parts)
        else np.concatenate([p.lexical for p in parts if p.lexical is not None]),
    )


@dataclass(frozen=True)
class TraceStats:
    """What one pass over the traces learns: input normalization, K, and per-request small columns.

    The hidden-state mean and variance are merged chunk by chunk in float64 (Chan et al.'s
    pairwise update), so a set read in pieces gets the same statistics as one read whole by the
    same chunking. ``category`` holds codes into ``categories`` (sorted names), so folds and
    per-category metrics never need the strings of every request at once.
    """

    n: int
    hidden_size: int
    hidden_mean: np.ndarray  # (H,) float32
    hidden_std: np.ndarray  # (H,) float32
    prompt_tokens_scale: float
    output_budget_scale: float
    remaining: np.ndarray  # (n,) int32
    hit_budget: np.ndarray  # (n,) bool
    category: np.ndarray  # (n,) int16 codes into ``categories``
    categories: tuple[str, ...]

    @property
    def K(self) -> int:  # noqa: N802 - the hazard horizon's name in the docs
        return int(self.remaining.max())

    def category_names(self) -> np.ndarray:
        return np.asarray(self.categories, dtype=object)[self.category]


def scan_stats(
    source: RowSource, chunk_rows: int = 1024, *, check: bool = True, progress: bool = False
) -> TraceStats:
    """One pass over ``source``: normalization, small per-request columns, value checks."""
    from tqdm.auto import tqdm

    count = 0
    mean: np.ndarray | None = None
    m2: np.ndarray | None = None
    pt_max, ob_max = 1.0, 1.0
    remaining, hit, codes = [], [], []
    names: dict[str, int] = {}
    bar = tqdm(total=source.n, unit="trace", desc="scanning traces", disable=not progress)
    for start, stop in chunks(source.n, chunk_rows):
        part = source.read(start, stop, check=check)
        if part.hidden is None:
            raise TraceError(
                "the traces have no first_round_hidden; re-trace with hidden-state "
                "capture on to train or evaluate the refinement predictor"
            )
        if np.any(part.total_rounds < 1):
            raise TrainingError(
                "total_rounds must be >= 1 for every request; the traces are corrupt"
            )
        h = part.hidden.astype(np.float64)
        m = len(h)
        c_mean = h.mean(axis=0)
        c_m2 = ((h - c_mean) ** 2).sum(axis=0)
        if mean is None or m2 is None:
            mean, m2 = c_mean, c_m2
        else:
            if h.shape[1] != len(mean):
                raise TraceError(
                    f"first_round_hidden has mixed sizes ({len(mean)} and "
                    f"{h.shape[1]}); traces mix models"
                )
            delta = c_mean - mean
            total = count + m
            mean = mean + delta * (m / total)
            m2 = m2 + c_m2 + delta**2 * (count * m / total)
        count += m
        pt_max = max(pt_max, float(part.prompt_tokens.max()))
        ob_max = max(ob_max, float(part.output_budget.max()))
        remaining.append(part.remaining.astype(np.int32))
        hit.append(part.hit_budget)
        codes.append(
            np.array([names.setdefault(str(c), len(names)) for c in part.category], dtype=np.int16)
        )
        bar.update(m)
    bar.close()
    if mean is None or m2 is None:
        raise TrainingError("the traces hold no requests; trace some with `dwise-predict trace`")
    # codes in sorted-name order, so folds stratified by code equal folds stratified by name
    ordered = tuple(sorted(names))
    lut = np.array([ordered.index(k) for k in names], dtype=np.int16)
    std = np.maximum(np.sqrt(m2 / count), 1e-6)
    return TraceStats(
        n=count,
        hidden_size=len(mean),
        hidden_mean=mean.astype(np.float32),
        hidden_std=std.astype(np.float32),
        prompt_tokens_scale=pt_max,
        output_budget_scale=ob_max,
        remaining=np.concatenate(remaining),
        hit_budget=np.concatenate(hit),
        category=lut[np.concatenate(codes)],
        categories=ordered,
    )
