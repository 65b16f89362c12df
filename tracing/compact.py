"""Merge a trace folder's many small shards into few large ones, without a moment of risk.

Time-based flushing and many writers per folder leave many small shards. Readers handle
them, but a folder of thousands of files is slow to list and to open. :func:`compact_traces`
rewrites the shards it finds into shards of ``shard_size`` rows, keeps every request once
(repeated requests are dropped by the readers' rule, :func:`dwise_predict.traces.first_copies`),
and refuses a folder whose shards disagree on the model fingerprint or schema version.

It never risks the data, in three steps:

1. every input's schema and fingerprint is checked before anything is written;
2. the merged shards are written under hidden names (``.compact-*.tmp``), durably: no reader
   or ``*.parquet`` glob sees them, and a crash here leaves the old shards as they were;
3. the merged shards are renamed into place, then the old shards are removed. A crash
   between the two leaves both; they hold the same requests, readers keep one copy, and
   running ``compact`` again finishes the job.

Only the shards listed at the start are touched, so writers may keep adding shards to the
folder meanwhile.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dwise_predict.atomic import TEMP_SUFFIX, commit_files, fsync_dir
from dwise_predict.errors import TraceError
from dwise_predict.trace_writer import (
    existing_shards,
    new_writer_id,
    remove_stale_temps,
    shard_name,
    write_table_atomic,
)
from dwise_predict.traces import META_FINGERPRINT, META_SCHEMA_VERSION, check_schema, first_copies

#: rows per merged shard: large enough that a million-request folder is tens of files
DEFAULT_COMPACT_SHARD_SIZE = 100_000
#: hidden names of merged shards written but not yet put in place
STAGE_PREFIX = ".compact-"


@dataclass
class CompactSummary:
    """What a compaction did."""

    folder: Path
    shards_before: int
    rows_before: int
    rows_after: int
    written: list[Path] = field(default_factory=list)

    @property
    def duplicates_dropped(self) -> int:
        return self.rows_before - self.rows_after


def compact_traces(
    folder: str | Path, *, shard_size: int = DEFAULT_COMPACT_SHARD_SIZE
) -> CompactSummary:
    """Rewrite ``folder``'s shards as shards of ``shard_size`` rows; see the module docstring."""
    if shard_size < 1:
        raise TraceError(f"shard size must be >= 1, got {shard_size}")
    out = Path(folder)
    if not out.is_dir():
        raise TraceError(
            f"{out} is not a folder of trace shards; pass the --out folder of `dwise-predict trace`"
        )
    remove_stale_temps(out)
    shards = existing_shards(out)
    if not shards:
        raise TraceError(f"no trace shards (*.parquet) in {out}; nothing to compact")
    metadata = _common_metadata(shards)
    writer_id = new_writer_id()
    staged: list[Path] = []
    summary = CompactSummary(folder=out, shards_before=len(shards), rows_before=0, rows_after=0)
    try:
        seen: dict[str, str] = {}
        pending: list[pa.Table] = []
        n_pending = 0
        for shard in shards:
            table = pq.read_table(shard)
            summary.rows_before += table.num_rows
            table, _ = first_copies(table, seen, where=str(out))
            pending.append(table)
            n_pending += table.num_rows
            while n_pending >= shard_size:
                merged = pa.concat_tables(pending, promote_options="default")
                staged.append(
                    _stage(merged.slice(0, shard_size), metadata, out, writer_id, len(staged))
                )
                pending, n_pending = [merged.slice(shard_size)], n_pending - shard_size
        if n_pending or not staged:
            merged = pa.concat_tables(pending, promote_options="default")
            staged.append(_stage(merged, metadata, out, writer_id, len(staged)))
        summary.rows_after = len(seen)
        final = [out / shard_name(writer_id, i) for i in range(len(staged))]
        commit_files(zip(staged, final))  # all merged shards in place, or none
    except BaseException:
        for tmp in staged:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise
    fsync_dir(out)  # the merged shards are durable before any old one goes
    for shard in shards:  # the merged shards are in place: the old ones are copies now
        with contextlib.suppress(FileNotFoundError):
            shard.unlink()
    fsync_dir(out)
    summary.written = final
    return summary


def _common_metadata(shards: list[Path]) -> dict[bytes, bytes]:
    """The schema version and fingerprint every shard shares; refuses a folder that mixes."""
    first: dict[bytes, bytes] | None = None
    for shard in shards:
        try:
            schema = pq.read_schema(shard)
        except (OSError, pa.ArrowInvalid) as e:
            raise TraceError(
                f"cannot read {shard}: {e}; move the damaged file out of the folder "
                "and compact again"
            ) from e
        check_schema(schema, shard)
        meta = schema.metadata or {}
        mine = {k: meta[k] for k in (META_SCHEMA_VERSION, META_FINGERPRINT) if k in meta}
        if first is None:
            first, first_name = mine, shard.name
        elif mine != first:
            what = (
                "model fingerprint"
                if mine.get(META_FINGERPRINT) != first.get(META_FINGERPRINT)
                else "trace schema version"
            )
            raise TraceError(
                f"cannot compact {shard.parent}: {first_name} and {shard.name} differ in "
                f"{what}; keep one model's traces per folder (move the other shards out first)"
            )
    return first or {}


def _stage(
    table: pa.Table, metadata: dict[bytes, bytes], out: Path, writer_id: str, index: int
) -> Path:
    """Write one merged shard durably under a hidden name readers skip."""
    # ends in .tmp: duckdb and polars globs ('*.parquet') match hidden files too
    path = out / f"{STAGE_PREFIX}{shard_name(writer_id, index)}{TEMP_SUFFIX}"
    return write_table_atomic(table.replace_schema_metadata(metadata), path)
