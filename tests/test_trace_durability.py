"""Traces are never silently lost: SIGTERM, SIGKILL, several writers on one folder, compaction.

Every test traces with the real tiny-bd engine and writer; the stops are real signals and the
concurrent writers are real processes. Requests are made slow enough to stop mid-run with
``--threshold 1.01`` (one token per round, so every block takes ``block_size`` rounds).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from _tracing_helpers import make_tiny_bd, one_torch_thread, workload_records  # noqa: F401
from dwise_predict.tracing.compact import compact_traces

from dwise_predict.cli import main
from dwise_predict.errors import TraceError, WorkloadError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.prompts import read_prompts, select_shard, shard_of
from dwise_predict.trace_writer import TraceWriter, existing_shards, remove_stale_temps
from dwise_predict.traces import META_FINGERPRINT, read_traces

PROMPTS = [
    "hello",
    "what is 2+2?",
    "a" * 30,
    "line\nline2\n" * 3,
    "x",
    "tell me a story",
    "yo",
    "abc" * 10,
    "zzz",
    "qwerty uiop",
    "Write a haiku.",
    "1 2 3 4 5 6",
]
FAST = [
    "--block-size",
    "8",
    "--max-new-tokens",
    "16",
    "--threshold",
    "0.5",
    "--batch-size",
    "4",
    "--threads",
    "1",
    "-q",
]
SLOW = [
    "--block-size",
    "8",
    "--max-new-tokens",
    "24",
    "--threshold",
    "1.01",
    "--batch-size",
    "4",
    "--threads",
    "1",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=8)


def _workload(path: Path, prefix: str, n: int) -> Path:
    recs = workload_records([PROMPTS[i % len(PROMPTS)] + f" #{i}" for i in range(n)])
    for i, r in enumerate(recs):
        r["id"] = f"{prefix}-{i:03d}"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _trace(model_dir, workload, out, *extra):
    return [
        "trace",
        "--model",
        str(model_dir),
        "--workload",
        str(workload),
        "--out",
        str(out),
        *extra,
    ]


def _raw_ids(folder: Path) -> list[str]:
    """Every row's request id in every visible shard: what pandas or duckdb would see."""
    return [
        i
        for f in existing_shards(folder)
        for i in pq.read_table(f, columns=["request_id"]).column("request_id").to_pylist()
    ]


def _spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dwise_predict", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _SigtermAfter(logging.Handler):
    """A job scheduler that sends SIGTERM to this process after ``n`` requests are traced."""

    def __init__(self, n: int) -> None:
        super().__init__(logging.DEBUG)
        self.n, self.traced = n, []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("traced "):
            self.traced.append(record.args[0])
            if len(self.traced) == self.n:
                os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_mid_run_keeps_finished_requests_and_resume_completes(tmp_path, model_dir, capsys):
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    wl, out = _workload(tmp_path / "w.jsonl", "t", 16), tmp_path / "out"
    stopper = _SigtermAfter(5)
    runner_log = logging.getLogger("dwise_predict.tracing.runner")
    runner_log.addHandler(stopper)
    try:
        rc = main(_trace(model_dir, wl, out, *SLOW, "-v"))  # -v: the runner logs "traced <id>"
    finally:
        runner_log.removeHandler(stopper)
    err = capsys.readouterr().err
    assert rc == 143, err  # 128 + SIGTERM, what Slurm/Kubernetes expect
    assert "stopped by SIGTERM" in err and "--resume" in err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler restored
    assert sorted(_raw_ids(out)) == sorted(stopper.traced)  # all 5 finished ones, nothing else
    assert main(_trace(model_dir, wl, out, *SLOW, "-q", "--resume")) == 0
    ids = _raw_ids(out)
    assert len(ids) == len(set(ids)) == 16  # no request twice, even on disk


def test_sigkill_loses_at_most_the_flush_interval(tmp_path, model_dir):
    interval, margin = 0.25, 0.5  # margin: timer wake-up and shard write on a busy machine
    n = 384  # ~100 requests/s: several seconds of tracing, so the kill lands mid-run
    wl, out = _workload(tmp_path / "w.jsonl", "k", n), tmp_path / "out"
    proc = _spawn(_trace(model_dir, wl, out, *SLOW, "--flush-interval", str(interval), "-v"))
    seen: list[tuple[float, str]] = []  # (arrival time, request id) of every traced request
    for line in proc.stderr:  # type: ignore[union-attr]
        if line.startswith("traced "):
            seen.append((time.monotonic(), line.split()[1]))
            if seen[-1][0] - seen[0][0] > 1.5 or len(seen) == n // 4:
                break
    # a starved test process reads the log lines late and in bursts (stamps later than the
    # truth, so `old` below stays a safe under-estimate); wait until the first is surely old
    time.sleep(max(0.0, seen[0][0] + interval + margin + 0.1 - time.monotonic()))
    proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert killed - seen[0][0] > 2 * interval
    on_disk = set(_raw_ids(out))
    assert on_disk and len(on_disk) < n
    old = {rid for t, rid in seen if t < killed - interval - margin}
    assert old, "no request finished long enough before the kill to test the bound"
    assert old <= on_disk  # everything older than the interval survived the SIGKILL
    assert main(_trace(model_dir, wl, out, *SLOW, "-q", "--resume")) == 0
    ids = _raw_ids(out)
    assert len(ids) == len(set(ids)) == n
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the dead writer's temp


class _Warnings(logging.Handler):
    """The reader's warnings (``main`` reconfigures logging, so pytest's caplog can miss them)."""

    def __enter__(self) -> list[str]:
        self.messages: list[str] = []
        logging.getLogger("dwise_predict.traces").addHandler(self)
        return self.messages

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("dwise_predict.traces").removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_two_writers_on_one_folder_keep_every_request(tmp_path, model_dir):
    n = 24
    a, b = _workload(tmp_path / "a.jsonl", "a", n), _workload(tmp_path / "b.jsonl", "b", n)
    mixed, same = tmp_path / "mixed", tmp_path / "same"
    opts = [*SLOW, "-q", "--shard-size", "3", "--flush-interval", "0.05", "--resume"]
    # Force the overlap on a loaded machine (process start-up alone can outlast a writer): writer
    # a pauses once its first shard is on disk, until writer b has written one too.
    writer_a = _spawn(_trace(model_dir, a, mixed, *opts))
    _wait_for_writers(mixed, 1, writer_a)
    writer_a.send_signal(signal.SIGSTOP)
    writer_b = _spawn(_trace(model_dir, b, mixed, *opts))
    _wait_for_writers(mixed, 2, writer_b)
    writer_a.send_signal(signal.SIGCONT)
    procs = [
        writer_a,
        writer_b,
        _spawn(_trace(model_dir, a, same, *opts)),
        _spawn(_trace(model_dir, a, same, *opts)),
    ]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    writers: dict[str, list[int]] = {}  # writer id -> its shards' write times
    for f in existing_shards(mixed):
        writers.setdefault(f.name.rsplit("-", 1)[0], []).append(f.stat().st_mtime_ns)
    (first_a, last_a), (first_b, last_b) = [(min(t), max(t)) for t in writers.values()]
    assert first_a < last_b and first_b < last_a, "the two writers did not overlap in time"
    ids = _raw_ids(mixed)  # different workloads: both complete, nothing overwritten, no copies
    assert len(ids) == len(set(ids)) == 2 * n
    in_mixed = read_traces(mixed)
    assert in_mixed.num_rows == 2 * n
    with _Warnings() as warned:  # the same workload twice: readers see each request once
        table = read_traces(same)
    copies = len(_raw_ids(same)) - n  # both traced some requests before seeing the other's
    assert bool(copies) == any(f"{copies} request(s) were traced by more" in m for m in warned)
    only_a = in_mixed.filter(pc.starts_with(in_mixed.column("request_id"), "a-"))
    _assert_same_traces(table, only_a)  # what one writer alone traced for workload a


def _wait_for_writers(folder: Path, n: int, proc: subprocess.Popen) -> None:
    """Poll until shards from ``n`` distinct writers are in ``folder``."""
    while len({f.name.rsplit("-", 1)[0] for f in existing_shards(folder)}) < n:
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.002)


def _assert_same_traces(t1, t2):
    """Same requests and the same work; float noise in hidden states and timings aside."""
    cols = ["request_id", "prompt_sha256", "rounds_per_block", "total_rounds", "output_text"]
    rows = [sorted(t.select(cols).to_pylist(), key=lambda r: r["request_id"]) for t in (t1, t2)]
    assert rows[0] == rows[1]


def test_time_flush_writes_without_further_requests(tmp_path, model_dir):
    wl, src = _workload(tmp_path / "w.jsonl", "f", 4), tmp_path / "src"
    assert main(_trace(model_dir, wl, src, *FAST)) == 0
    rows = read_traces(src).to_pylist()
    fp = read_traces(src).schema.metadata[META_FINGERPRINT]
    fingerprint = ModelFingerprint.from_dict(json.loads(fp))
    out = tmp_path / "out"
    with TraceWriter(out, fingerprint, shard_size=100, flush_interval_s=0.3) as w:
        t0 = time.monotonic()
        w.add(rows[0])
        w.add(rows[1])
        while not existing_shards(out) and time.monotonic() - t0 < 10:
            time.sleep(0.02)
        waited = time.monotonic() - t0
        assert existing_shards(out) and waited >= 0.3  # written by the timer, not by count
        assert _raw_ids(out) == [rows[0]["request_id"], rows[1]["request_id"]]
        other = TraceWriter(out, fingerprint, resume=True, flush_interval_s=None)
        assert set(other.done_ids) == {rows[0]["request_id"], rows[1]["request_id"]}
        other.add(rows[2])
        other.close()
        w.add(rows[3])
    names = [f.name for f in existing_shards(out)]
    assert len(names) == 3 and len({n.rsplit("-", 1)[0] for n in names}) == 2
    assert sorted(_raw_ids(out)) == sorted(r["request_id"] for r in rows)


def test_a_failed_timed_write_stops_the_run_and_close_keeps_the_rows(
    tmp_path, model_dir, monkeypatch
):
    import dwise_predict.trace_writer as w

    wl, src = _workload(tmp_path / "w.jsonl", "e", 2), tmp_path / "src"
    assert main(_trace(model_dir, wl, src, *FAST)) == 0
    table = read_traces(src)
    fingerprint = ModelFingerprint.from_dict(json.loads(table.schema.metadata[META_FINGERPRINT]))
    real, failed = w.write_table_atomic, threading.Event()

    def disk_full_once(t, path):
        if not failed.is_set():
            failed.set()
            raise OSError(28, "No space left on device")
        return real(t, path)

    monkeypatch.setattr(w, "write_table_atomic", disk_full_once)
    out = tmp_path / "out"
    writer = TraceWriter(out, fingerprint, flush_interval_s=0.05)
    rows = table.to_pylist()
    writer.add(rows[0])
    assert failed.wait(10)
    writer._timer.join(10)  # the timer thread stops after a failed write
    with pytest.raises(TraceError, match="No space left on device"):
        writer.add(rows[1])  # the run learns of it at once
    writer.close()
    assert _raw_ids(out) == [rows[0]["request_id"]]  # nothing lost


def test_stale_temps_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    import socket

    host = socket.gethostname()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    names = {
        "dead": f".shard-{host}-{dead}-0123abcd-00000.parquet.x1.tmp",
        "live": f".shard-{host}-{os.getpid()}-0123abcd-00000.parquet.x2.tmp",
        "old": ".shard-otherhost-7-0123abcd-00000.parquet.x3.tmp",
        "fresh": ".shard-otherhost-7-0123abcd-00001.parquet.x4.tmp",
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"PAR1 half a file")
    os.utime(tmp_path / names["old"], (time.time() - 7200, time.time() - 7200))
    removed = {p.name for p in remove_stale_temps(tmp_path)}
    assert removed == {names["dead"], names["old"]}


def _small_shards(tmp_path, model_dir) -> Path:
    out = tmp_path / "shards"
    wl = _workload(tmp_path / "c.jsonl", "c", 12)
    assert main(_trace(model_dir, wl, out, *FAST, "--shard-size", "2")) == 0
    first = existing_shards(out)[0]  # a second writer traced the same two requests
    (out / first.name.replace("shard-", "shard-zz-")).write_bytes(first.read_bytes())
    return out


def test_compact_merges_keeps_every_row_and_refuses_another_fingerprint(
    tmp_path, model_dir, capsys
):
    out = _small_shards(tmp_path, model_dir)
    assert len(existing_shards(out)) == 7 and len(_raw_ids(out)) == 14
    before = read_traces(out)
    assert main(["traces", "compact", str(out), "--shard-size", "5"]) == 0
    assert "repeated requests dropped  2" in capsys.readouterr().out
    assert [pq.read_metadata(f).num_rows for f in existing_shards(out)] == [5, 5, 2]
    assert len(_raw_ids(out)) == 12
    after = read_traces(out)
    assert after.schema.metadata[META_FINGERPRINT] == before.schema.metadata[META_FINGERPRINT]
    assert after.drop_columns(["round_wall_ms"]).equals(before.drop_columns(["round_wall_ms"]))
    assert not [p for p in out.iterdir() if p.name.startswith(".")]

    other = tmp_path / "other"  # the same requests traced with another threshold
    wl = tmp_path / "c.jsonl"
    assert main(_trace(model_dir, wl, other, *[a if a != "0.5" else "0.9" for a in FAST])) == 0
    stray = existing_shards(other)[0]
    (out / stray.name).write_bytes(stray.read_bytes())
    listing = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert main(["traces", "compact", str(out)]) == 1
    assert "differ in model fingerprint" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == listing  # untouched


_CRASH = """
import os, sys
import dwise_predict.tracing.compact as c
real, calls = c.write_table_atomic, []
def crash_on_second(table, path):
    calls.append(path)
    if len(calls) == 2:
        os._exit(9)  # the process dies mid-compaction: no clean-up runs
    return real(table, path)
c.write_table_atomic = crash_on_second
c.compact_traces(sys.argv[1], shard_size=5)
"""


def test_compact_is_atomic_under_a_crash(tmp_path, model_dir, monkeypatch):
    out = _small_shards(tmp_path, model_dir)
    names = sorted(p.name for p in existing_shards(out))
    before = read_traces(out)
    crash = subprocess.run([sys.executable, "-c", _CRASH, str(out)], capture_output=True)
    assert crash.returncode == 9, crash.stderr
    assert sorted(p.name for p in existing_shards(out)) == names  # the old shards, as they were
    assert read_traces(out).equals(before)
    assert [p.name for p in out.iterdir() if p.name.startswith(".compact-")]  # staged, invisible
    import duckdb
    import polars as pl  # their globs match hidden *.parquet files: staged ones end in .tmp

    assert pl.read_parquet(out / "*.parquet").height == 14
    assert duckdb.sql(f"SELECT count(*) FROM '{out}/*.parquet'").fetchall() == [(14,)]

    import dwise_predict.tracing.compact as c  # a crash after the renames, before the deletes

    def die(_folder):
        raise OSError("power cut")

    monkeypatch.setattr(c, "fsync_dir", die)
    with pytest.raises(OSError, match="power cut"):
        compact_traces(out, shard_size=5)
    assert len(existing_shards(out)) == 7 + 3 and len(_raw_ids(out)) == 14 + 12
    with _Warnings() as warned:
        assert read_traces(out).num_rows == 12  # readers keep one copy of each request
    assert "14 request(s) were traced by more than one writer" in warned[0]  # 12 + the 2 copies
    monkeypatch.undo()
    summary = compact_traces(out, shard_size=5)  # running it again finishes the job
    assert (summary.rows_after, len(summary.written)) == (12, 3)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in summary.written)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceError, match="no trace shards"):
        compact_traces(tmp_path / "empty")


def test_num_shards_split_a_workload_into_disjoint_parts_read_as_one(tmp_path, model_dir, capsys):
    n = 20
    wl, out = _workload(tmp_path / "w.jsonl", "s", n), tmp_path / "out"
    opts = [*SLOW, "--flush-interval", "0", "--resume"]
    for i in range(3):  # three jobs of a Slurm array, one shared output folder
        assert (
            main(_trace(model_dir, wl, out, *opts, "--num-shards", "3", "--shard-index", str(i)))
            == 0
        )
    ids = _raw_ids(out)
    assert sorted(ids) == [f"s-{i:03d}" for i in range(n)]  # every request once, none twice
    records = read_prompts(wl)
    parts = [select_shard(records, 3, i) for i in range(3)]
    assert all(parts) and sum(len(p) for p in parts) == n
    assert [shard_of(r.id, 3) for r in parts[1]] == [1] * len(parts[1])
    # the split depends on the id only: the same request lands in the same part in any order
    assert select_shard(records[::-1], 3, 1) == parts[1][::-1]
    capsys.readouterr()
    bad = _trace(model_dir, wl, tmp_path / "x", *opts, "--num-shards", "3", "--shard-index", "3")
    assert main(bad) != 0 and "outside 0..2" in capsys.readouterr().err
    with pytest.raises(WorkloadError, match="must be >= 1"):
        select_shard(records, 0, 0)
