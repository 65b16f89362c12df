"""Parquet trace writer: durable, sharded, resumable, and safe with many writers per folder.

Traces are the project's most expensive data (a forward pass per round on the served model),
so the writer is built to lose as little of them as possible:

* **Durable and atomic.** A shard is written under a hidden temporary name ending in ``.tmp``,
  fsync-ed, renamed to its final name, and the folder is fsync-ed: a reader never sees a
  partial file (no ``*.parquet`` glob matches it) and a finished shard survives a power loss.
* **Flushed by count and by time.** A shard is written every ``shard_size`` requests, and
  a background timer writes one as soon as the oldest unwritten request has waited
  ``flush_interval_s`` seconds. A hard kill (SIGKILL, out of memory, node loss) therefore
  loses at most the requests finished in the last ``flush_interval_s`` seconds. On a clean
  stop (exception, Ctrl-C, SIGTERM under :func:`dwise_predict.signals.terminate_as_interrupt`)
  the requests already finished are written as a last, complete shard.
* **Many writers, one folder.** Every writer names its shards
  ``shard-<host>-<pid>-<random>-<counter>.parquet``, so writers on any number of hosts and
  processes never overwrite each other and need no lock (locks are unreliable on shared
  filesystems and go stale when a node dies). ``resume=True`` reads the request ids of every
  writer's shards and checks they come from the same model and decoding setting. Two
  writers that trace the same request concurrently both keep it; readers keep the first
  copy (:func:`dwise_predict.traces.first_copies`). Without ``resume`` an output folder that
  already holds shards is refused rather than silently mixed.

The rows follow :data:`dwise_predict.traces.TRACE_SCHEMA` exactly, with the schema version and
the model fingerprint in the Parquet key-value metadata.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
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
    check_schema,
    shard_files,
)

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 1000
#: seconds a finished request may wait in memory before it is written (the crash-loss bound)
DEFAULT_FLUSH_INTERVAL_S = 60.0
#: a temporary file this old belongs to a dead writer whatever host it ran on (a write takes
#: seconds), so any writer may remove it
STALE_TEMP_S = 3600.0

#: ``<host>-<pid>-<8 hex>``, found inside shard and temporary file names
_OWNER = re.compile(r"shard-(?P<host>.+)-(?P<pid>\d+)-(?P<rand>[0-9a-f]{8})-\d{5,}\.parquet")


def new_writer_id() -> str:
    """A writer id unique across hosts and processes: ``<host>-<pid>-<8 random hex>``.

    The host and pid say who wrote a shard (and let a writer on the same host tell that a
    temporary file's owner is dead); the random part keeps ids apart across hosts with the
    same name, containers that all run as pid 1, and pid reuse.
    """
    return f"{_host()}-{os.getpid()}-{secrets.token_hex(4)}"


def _host() -> str:
    """This host's name, reduced to characters safe in a file name."""
    return re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:40] or "host"


def shard_name(writer_id: str, index: int) -> str:
    return f"shard-{writer_id}-{index:05d}.parquet"


def existing_shards(out_dir: Path) -> list[Path]:
    """Every writer's finished shards in ``out_dir`` (what readers see), sorted by name."""
    return shard_files(out_dir)


def rows_to_table(rows: list[dict[str, Any]], fingerprint: ModelFingerprint) -> pa.Table:
    """Rows (dicts keyed by column name) as an Arrow table of the current schema, with metadata."""
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
    """Write ``table`` to ``path`` durably: hidden temporary file, fsync, rename, fsync folder."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    return path


class TraceWriter:
    """Collects trace rows and writes them as durable Parquet shards.

    A shard is written when ``shard_size`` rows are waiting, or when the oldest waiting row
    has waited ``flush_interval_s`` seconds (``None`` or 0: by count only). Use it as a
    context manager, or call :meth:`close`: on normal exit and on an exception (Ctrl-C and
    :class:`~dwise_predict.errors.Terminated` included) the rows still waiting are written as
    one last complete shard; nothing partial is left. ``add`` is safe to call from one
    thread while the timer writes from another: rows are swapped out under the lock and
    written outside it, so ``add`` never waits for a disk.
    """

    def __init__(
        self,
        out_dir: str | Path,
        fingerprint: ModelFingerprint,
        *,
        shard_size: int = DEFAULT_SHARD_SIZE,
        flush_interval_s: float | None = DEFAULT_FLUSH_INTERVAL_S,
        resume: bool = False,
    ) -> None:
        if shard_size < 1:
            raise TraceError(f"shard_size must be >= 1, got {shard_size}")
        if flush_interval_s is not None and flush_interval_s < 0:
            raise TraceError(
                f"flush interval must be >= 0 seconds (0: by count only), got {flush_interval_s}"
            )
        self.out_dir = Path(out_dir)
        self.fingerprint = fingerprint
        self.shard_size = shard_size
        self.flush_interval_s = flush_interval_s or None
        self.writer_id = new_writer_id()
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise TraceError(f"--out {self.out_dir} is a file; pass a folder for the trace shards")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(self.out_dir)
        shards = existing_shards(self.out_dir)
        if shards and not resume:
            raise TraceError(
                f"{self.out_dir} already holds {len(shards)} trace shard(s); pass --resume to "
                "continue that run, or choose another --out folder"
            )
        #: request id -> prompt sha256 of every request traced in the folder or added here
        self.done_ids: dict[str, str] = traced_requests(shards, fingerprint) if shards else {}
        self.written: list[Path] = []
        self.rows_written = 0
        self.write_s = 0.0  #: seconds spent writing shards (what the durability costs)
        self._rows: list[dict[str, Any]] = []
        self._oldest = 0.0  # monotonic time the oldest waiting row was added
        self._count = 0  # shards this writer has written: the counter in its shard names
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._error: BaseException | None = None
        self._timer: threading.Thread | None = None
        if self.flush_interval_s is not None:
            self._timer = threading.Thread(
                target=self._flush_on_time, daemon=True, name=f"trace-flush-{self.writer_id}"
            )
            self._timer.start()

    def add(self, row: dict[str, Any]) -> None:
        self._raise_timer_error()
        rid = row["request_id"]
        with self._lock:
            if rid in self.done_ids:
                raise TraceError(
                    f"request {rid!r} is already traced in {self.out_dir}; "
                    "each request is traced once"
                )
            # appended before it is marked done: a Ctrl-C between the two keeps the row
            self._rows.append(row)
            self.done_ids[rid] = row["prompt_sha256"]
            if len(self._rows) == 1:
                self._oldest = time.monotonic()
                self._wake.notify()
            batch = self._take_locked() if len(self._rows) >= self.shard_size else None
        if batch is not None:
            self._write(*batch)

    def flush(self) -> Path | None:
        """Write the waiting rows as one shard now; returns its path (None if none waited)."""
        with self._lock:
            batch = self._take_locked()
        return None if batch is None else self._write(*batch)

    def _take_locked(self) -> tuple[list[dict[str, Any]], int] | None:
        """Swap the waiting rows out and claim a shard number (under the lock; no I/O)."""
        if not self._rows:
            return None
        rows, self._rows = self._rows, []
        index, self._count = self._count, self._count + 1
        return rows, index

    def _write(self, rows: list[dict[str, Any]], index: int) -> Path:
        """Write one shard outside the lock, so ``add`` never waits for a disk. Rows whose
        write fails (or is interrupted) go back to the front of the queue: never a loss."""
        path = self.out_dir / shard_name(self.writer_id, index)
        t0 = time.perf_counter()
        try:
            write_table_atomic(rows_to_table(rows, self.fingerprint), path)
        except BaseException:
            with self._lock:
                self._rows[:0] = rows
                self._oldest = time.monotonic()
            raise
        with self._lock:
            self.write_s += time.perf_counter() - t0
            self.rows_written += len(rows)
            self.written.append(path)
        return path

    def _flush_on_time(self) -> None:
        """Timer thread: write the waiting rows once the oldest has waited the interval."""
        interval = self.flush_interval_s or 0.0
        while True:
            with self._lock:
                if self._closed:
                    return
                if not self._rows:
                    self._wake.wait()
                    continue
                due = self._oldest + interval - time.monotonic()
                if due > 0:
                    self._wake.wait(due)
                    continue
                batch = self._take_locked()
            if batch is None:
                continue
            try:
                self._write(*batch)
            except BaseException as e:  # reported to the caller by the next add()/close()
                self._error = e
                return

    def _raise_timer_error(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise TraceError(f"writing a trace shard to {self.out_dir} failed: {e}") from e

    def close(self) -> None:
        """Stop the timer and write the rows still waiting. Idempotent."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        if self._timer is not None:
            self._timer.join()
        self.flush()  # raises if the rows cannot be written
        if self._error is not None:  # the rows the timer failed to write are on disk now
            log.warning(
                "a timed shard write to %s failed (%s); its rows were written at close",
                self.out_dir,
                self._error,
            )
            self._error = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def traced_requests(shards: list[Path], fingerprint: ModelFingerprint) -> dict[str, str]:
    """Request id -> prompt sha256 of every row in ``shards``.

    Refuses shards from another model or decoding setting. A shard that vanished since the
    folder was listed (a concurrent ``traces compact`` replaced it) is skipped.
    """
    done: dict[str, str] = {}
    want = fingerprint.to_dict()
    for shard in shards:
        try:
            schema = pq.read_schema(shard)
            raw = (schema.metadata or {}).get(META_FINGERPRINT)
            cols = pq.read_table(shard, columns=["request_id", "prompt_sha256"])
        except FileNotFoundError:
            continue
        except (OSError, pa.ArrowInvalid, KeyError) as e:
            raise TraceError(
                f"cannot read existing shard {shard}: {e}; move it out of the "
                "folder and rerun with --resume"
            ) from e
        check_schema(schema, shard)
        if raw is None:
            raise TraceError(
                f"{shard} has no model fingerprint; it is not a dwise-predict "
                "trace shard: move it out of the folder"
            )
        have = json.loads(raw)
        diff = sorted(k for k in set(want) | set(have) if want.get(k) != have.get(k))
        if diff:
            legacy = (
                " (its shards predate block_alignment: they were traced response-aligned, and "
                "new shards cannot share their folder)"
                if "block_alignment" in diff and have.get("block_alignment") is None
                else ""
            )
            raise TraceError(
                f"cannot resume into {shard.parent}: its shards were traced with a different "
                f"setting (differs in {', '.join(diff)}){legacy}; use the same --model/"
                "--block-size/--threshold/--max-new-tokens/--block-alignment, or another "
                "--out folder"
            )
        done.update(
            zip(cols.column("request_id").to_pylist(), cols.column("prompt_sha256").to_pylist())
        )
    return done


def remove_stale_temps(folder: Path) -> list[Path]:
    """Remove temporary files left by writers (or compactions) that died mid-write.

    Several writers share a folder, so only files whose owner is certainly gone are removed:
    a temporary file of a writer on this host whose process no longer exists, or any
    temporary file older than :data:`STALE_TEMP_S`. Readers skip these files anyway.
    Returns the files removed.
    """
    host = _host()
    now = time.time()
    removed = []
    for p in folder.iterdir():
        if not (p.name.startswith(".") and p.name.endswith(TEMP_SUFFIX)):
            continue
        m = _OWNER.search(p.name)
        try:
            old = now - p.stat().st_mtime > STALE_TEMP_S
        except OSError:
            continue
        dead = m is not None and m["host"] == host and not _pid_alive(int(m["pid"]))
        if old or dead:
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    return removed


def _pid_alive(pid: int) -> bool:
    if os.name != "posix":
        return True  # cannot tell safely: keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
