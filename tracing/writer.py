"""Parquet trace writer: atomic, sharded, resumable.

A tracing run can take hours on a real dLLM, so its output must survive interruption:

* **Atomic.** Every shard is written under a hidden temporary name in the output folder and
  then ``os.replace``-d into ``shard-NNNNN.parquet``; a crash or Ctrl-C never leaves a file a
  reader would pick up (readers skip dot-files).
* **Sharded.** A shard is written every ``shard_size`` requests, so at most one shard's worth
  of work is lost to a hard kill. On a clean interrupt (exception, Ctrl-C) the requests
  already finished are flushed as a last, complete shard.
* **Resumable.** ``resume=True`` reads the request ids already in the folder's shards, checks
  that those shards come from the same model and decoding setting, and numbers new shards
  after the existing ones. Without ``resume``, an output folder that already holds shards is
  refused rather than silently mixed.

The rows follow :data:`dwise_predict.traces.TRACE_SCHEMA` exactly, with the schema version and
the model fingerprint in the Parquet key-value metadata.
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dwise_predict.atomic import TEMP_SUFFIX, atomic_path
from dwise_predict.errors import TraceError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.traces import (
    META_FINGERPRINT,
    META_SCHEMA_VERSION,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
)

SHARD_PATTERN = re.compile(r"^shard-(\d{5,})\.parquet$")
_TMP_PREFIX = ".shard-"


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.parquet"


def existing_shards(out_dir: Path) -> list[Path]:
    """The finished shards in ``out_dir``, in index order."""
    if not out_dir.is_dir():
        return []
    return sorted((p for p in out_dir.iterdir() if SHARD_PATTERN.match(p.name)),
                  key=lambda p: int(SHARD_PATTERN.match(p.name).group(1)))  # type: ignore[union-attr]


def rows_to_table(rows: list[dict[str, Any]], fingerprint: ModelFingerprint) -> pa.Table:
    """Rows (dicts keyed by column name) as an Arrow table of schema v1 with its metadata."""
    missing = [f.name for f in TRACE_SCHEMA if any(f.name not in r for r in rows)]
    if missing:
        raise TraceError(f"trace rows lack columns {missing}; this is a bug in the tracer")
    columns = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in TRACE_SCHEMA}
    meta = {
        META_SCHEMA_VERSION: str(TRACE_SCHEMA_VERSION).encode(),
        META_FINGERPRINT: fingerprint.to_json().encode(),
    }
    return pa.table(columns, schema=TRACE_SCHEMA.with_metadata(meta))


def write_table_atomic(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` through a temporary file in the same folder and a rename."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


class TraceWriter:
    """Collects trace rows and writes them as atomic Parquet shards of ``shard_size`` rows.

    Use as a context manager: on normal exit and on an exception (Ctrl-C included) the rows
    already collected are written as one last complete shard; nothing partial is left.
    """

    def __init__(self, out_dir: str | Path, fingerprint: ModelFingerprint, *, shard_size: int = 1000,
                 resume: bool = False) -> None:
        if shard_size < 1:
            raise TraceError(f"shard_size must be >= 1, got {shard_size}")
        self.out_dir = Path(out_dir)
        self.fingerprint = fingerprint
        self.shard_size = shard_size
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise TraceError(f"--out {self.out_dir} is a file; pass a folder for the trace shards")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        shards = existing_shards(self.out_dir)
        if shards and not resume:
            raise TraceError(
                f"{self.out_dir} already holds {len(shards)} trace shard(s); pass --resume to continue that run, "
                "or choose another --out folder"
            )
        self.done_ids: set[str] = traced_ids(shards, fingerprint) if shards else set()
        self._next = int(SHARD_PATTERN.match(shards[-1].name).group(1)) + 1 if shards else 0  # type: ignore[union-attr]
        self._rows: list[dict[str, Any]] = []
        self.written: list[Path] = []
        self.rows_written = 0

    def _remove_stale_temps(self) -> None:
        """Temp files of a run killed hard (SIGKILL) are ours to remove; readers skip them anyway."""
        for p in self.out_dir.glob(f"{_TMP_PREFIX}*{TEMP_SUFFIX}"):
            with contextlib.suppress(OSError):
                p.unlink()

    def add(self, row: dict[str, Any]) -> None:
        rid = row["request_id"]
        if rid in self.done_ids:
            raise TraceError(f"request {rid!r} is already traced in {self.out_dir}; each request is traced once")
        self.done_ids.add(rid)
        self._rows.append(row)
        if len(self._rows) >= self.shard_size:
            self.flush()

    def flush(self) -> Path | None:
        if not self._rows:
            return None
        table = rows_to_table(self._rows, self.fingerprint)
        path = write_table_atomic(table, self.out_dir / shard_name(self._next))
        self._next += 1
        self.rows_written += len(self._rows)
        self._rows = []
        self.written.append(path)
        return path

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()


def traced_ids(shards: list[Path], fingerprint: ModelFingerprint) -> set[str]:
    """Request ids already in ``shards``; refuses shards from another model or decoding setting."""
    ids: set[str] = set()
    want = fingerprint.to_dict()
    for shard in shards:
        try:
            schema = pq.read_schema(shard)
            raw = (schema.metadata or {}).get(META_FINGERPRINT)
            col = pq.read_table(shard, columns=["request_id"]).column("request_id").to_pylist()
        except (OSError, pa.ArrowInvalid) as e:
            raise TraceError(f"cannot read existing shard {shard}: {e}; delete it and rerun with --resume") from e
        if raw is None:
            raise TraceError(f"{shard} has no model fingerprint; it is not a dwise-predict trace shard")
        have = json.loads(raw)
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            raise TraceError(
                f"cannot resume into {shard.parent}: its shards were traced with a different setting "
                f"(differs in {', '.join(diff)}); use the same --model/--block-size/--threshold/--max-new-tokens, "
                "or another --out folder"
            )
        ids.update(col)
    return ids
