"""Each replica's outstanding predicted work: Prometheus gauges, and a report beside SGLang's load
snapshot that the data-parallel controller reads (:mod:`.dispatch`).

The planning state's core scheduler keeps the work up to date per event
(:class:`~dwise_predict.runtime.load.LoadTrackingScheduler`: arrivals, each round's rows,
finishes, aborts). Whenever SGLang publishes its own load snapshot (``Scheduler.
publish_load_snapshot``: after every batch, and when the scheduler goes idle), the plugin
publishes its figures with the same timestamp:

====================================  =======================================================
``dwise_outstanding_work_rounds``     prompt blocks left + r̂, over waiting and resident
                                      requests (one block of one request for one round)
``dwise_outstanding_work_seconds``    the same priced by the bundle's cost profile (NaN when
                                      the bundle has none)
====================================  =======================================================

The report also carries how that work is spread over the requests
(:class:`~dwise_predict.runtime.fleet.WorkHistogram`): the controller's ``dwise`` method picks
a rank by it.

The gauges carry SGLang's own labels (``--enable-metrics``), so any router that scrapes
``/metrics`` (an llm-d-style endpoint picker) can read them. The report is a small shared-memory
file next to SGLang's (``/dev/shm/dwise_loads_<instance>.shm`` beside
``/dev/shm/sglang_loads_<instance>.shm``), one fixed-size slot per DP rank written under a
sequence counter, so a reader never sees half a report and never takes a lock.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import struct
import time
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..runtime.fleet import WORK_BUCKETS, ReplicaLoad, WorkHistogram
from ..runtime.load import LoadTrackingScheduler
from . import seam
from .metrics import exported_labels

log = logging.getLogger(__name__)

MAGIC = b"DWLD"
VERSION = 2
_HEADER = struct.Struct("<4sHH")
#: sequence (odd while a write is under way), timestamp, work in rounds, in seconds, requests,
#: then the work histogram's counts and sums
_SLOT = struct.Struct(f"<Qdddq{2 * WORK_BUCKETS}d")
_SEQ = struct.Struct("<Q")

#: the attribute of the plugin's state that holds its load signal, made at the first publish
SIGNAL_ATTR = "load_signal"


def report_path(sglang_path: str) -> str:
    """The plugin's report file beside SGLang's load-snapshot file ``sglang_path``."""
    folder, name = os.path.split(sglang_path)
    return os.path.join(folder, "dwise_" + name.removeprefix("sglang_"))


def _size(dp_size: int) -> int:
    return _HEADER.size + dp_size * _SLOT.size


class ReportWriter:
    """Writes one DP rank's slot of the report file (created and sized by whichever rank
    comes first)."""

    def __init__(self, path: str, dp_size: int, dp_rank: int) -> None:
        if not 0 <= dp_rank < dp_size:
            raise ConfigError(f"dp_rank={dp_rank} outside dp_size={dp_size}")
        import fcntl

        self.path, self.dp_size, self.dp_rank = path, dp_size, dp_rank
        size = _size(dp_size)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
                self.mmap = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
                _HEADER.pack_into(self.mmap, 0, MAGIC, VERSION, dp_size)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        self._offset = _HEADER.size + dp_rank * _SLOT.size
        self._seq = _SEQ.unpack_from(self.mmap, self._offset)[0] & ~1

    def write(
        self,
        timestamp: float,
        rounds: float,
        seconds: float,
        requests: int,
        hist: WorkHistogram | None = None,
    ) -> None:
        # no histogram: NaN counts, which a reader turns back into None (rank by work alone)
        counts, sums = (
            (np.full(WORK_BUCKETS, np.nan), np.zeros(WORK_BUCKETS))
            if hist is None
            else (hist.counts, hist.sums)
        )
        seq = self._seq + 1
        _SEQ.pack_into(self.mmap, self._offset, seq)  # odd: a write is under way
        _SLOT.pack_into(
            self.mmap, self._offset, seq, timestamp, rounds, seconds, requests, *counts, *sums
        )
        self._seq = seq + 1
        _SEQ.pack_into(self.mmap, self._offset, self._seq)

    def close(self) -> None:
        self.mmap.close()


class ReportReader:
    """Reads every rank's latest report; a rank that has not written yet reads as absent."""

    def __init__(self, path: str, dp_size: int) -> None:
        self.path, self.dp_size = path, dp_size
        self.mmap: mmap.mmap | None = None

    def _attach(self) -> bool:
        if self.mmap is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            if os.fstat(fd).st_size < _size(self.dp_size):
                return False
            mapped = mmap.mmap(fd, _size(self.dp_size), access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        magic, version, dp_size = _HEADER.unpack_from(mapped, 0)
        if (magic, version, dp_size) != (MAGIC, VERSION, self.dp_size):
            mapped.close()
            log.warning("%s is not a dwise load report for %d ranks", self.path, self.dp_size)
            return False
        self.mmap = mapped
        return True

    def read(self, dp_rank: int) -> ReplicaLoad | None:
        if not self._attach() or self.mmap is None:
            return None
        mapped = self.mmap
        offset = _HEADER.size + dp_rank * _SLOT.size
        for _ in range(4):  # a write under way: read again
            seq, ts, rounds, seconds, requests, *hist = _SLOT.unpack_from(mapped, offset)
            if seq == 0:
                return None  # never written
            if seq & 1 or _SEQ.unpack_from(mapped, offset)[0] != seq:
                continue
            return ReplicaLoad(
                replica=dp_rank,
                requests=int(requests),
                tokens=0,
                work_rounds=float(rounds),
                work_seconds=float(seconds),
                timestamp=float(ts),
                work_hist=None if math.isnan(hist[0]) else _histogram(hist),
            )
        return None

    def read_all(self) -> list[ReplicaLoad]:
        reports = (self.read(r) for r in range(self.dp_size))
        return [report for report in reports if report is not None]

    def close(self) -> None:
        if self.mmap is not None:
            self.mmap.close()
            self.mmap = None


def _histogram(values: list[float]) -> WorkHistogram:
    return WorkHistogram(np.asarray(values[:WORK_BUCKETS]), np.asarray(values[WORK_BUCKETS:]))


class WorkGauges:
    """``dwise_outstanding_work_rounds`` and ``_seconds`` with SGLang's labels."""

    #: by registry (held, so an id is never reused for another registry)
    _made: dict[Any, tuple[Any, Any]] = {}

    def __init__(self, labels: dict[str, str], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Gauge

        reg = REGISTRY if registry is None else registry
        names = [str(k) for k in labels]
        if reg not in self._made:  # one pair of gauges per registry, however many states
            kw: dict[str, Any] = {"registry": reg, "multiprocess_mode": "mostrecent"}
            self._made[reg] = (
                Gauge(
                    "dwise_outstanding_work_rounds",
                    "predicted outstanding work: prompt blocks left + estimated denoising "
                    "rounds left, over waiting and resident requests",
                    names,
                    **kw,
                ),
                Gauge(
                    "dwise_outstanding_work_seconds",
                    "predicted outstanding work priced by the bundle's cost profile "
                    "(NaN without one)",
                    names,
                    **kw,
                ),
            )
        rounds, seconds = self._made[reg]
        lab = {str(k): str(v) for k, v in labels.items()}
        self.rounds, self.seconds = rounds.labels(**lab), seconds.labels(**lab)

    def set(self, rounds: float, seconds: float) -> None:
        self.rounds.set(rounds)
        self.seconds.set(seconds)


def work_gauges_for(scheduler: Any, registry: Any = None) -> WorkGauges | None:
    """Gauges when this SGLang scheduler exports metrics (``--enable-metrics``), else None."""
    labels = exported_labels(scheduler)
    return None if labels is None else WorkGauges(labels, registry)


class LoadSignal:
    """One scheduler's outstanding work, published to its gauges and its report slot."""

    def __init__(self, gauges: WorkGauges | None, writer: ReportWriter | None) -> None:
        self.gauges = gauges
        self.writer = writer
        self.published = 0

    def publish(self, core: Any, timestamp: float) -> tuple[float, float]:
        """Publish the core scheduler's outstanding work; returns (rounds, seconds)."""
        rounds = float(core.outstanding_rounds)
        seconds = float(core.outstanding_seconds)
        if self.gauges is not None:
            self.gauges.set(rounds, seconds)
        if self.writer is not None:
            hist = WorkHistogram.of(core.outstanding_work())
            self.writer.write(timestamp, rounds, seconds, int(core.table.live_rows), hist)
        self.published += 1
        return rounds, seconds


def _signal_for(scheduler: Any, state: Any) -> LoadSignal:
    signal = getattr(state, SIGNAL_ATTR, None)
    if signal is not None:
        return signal  # type: ignore[no-any-return]
    writer = None
    where = seam.load_snapshot_file(scheduler)
    if where is None:
        log.info(
            "SGLang publishes its load snapshots over zmq (multi-node) or not at all: the "
            "dwise work report is not written; the controller's dwise method falls back"
        )
    else:
        path, dp_size, dp_rank = where
        try:
            writer = ReportWriter(report_path(path), dp_size, dp_rank)
        except OSError as e:
            log.warning("cannot write the dwise load report next to %s: %s", path, e)
    signal = LoadSignal(work_gauges_for(scheduler), writer)
    setattr(state, SIGNAL_ATTR, signal)
    return signal


def publish(scheduler: Any, state: Any, load: Any) -> None:
    """SGLang just published its load snapshot ``load`` (None: throttled, off or failed):
    publish the plugin's outstanding work beside it, with the same timestamp."""
    core = getattr(state, "core", None)
    if load is None or not isinstance(core, LoadTrackingScheduler):
        return  # observe mode keeps no core, so no work to report
    try:
        ts = seam.snapshot_time(load)
        _signal_for(scheduler, state).publish(core, ts if math.isfinite(ts) else time.time())
    except Exception as e:  # as SGLang treats its own snapshot: a failed publish never stops
        if not FAILED["publishes"]:  # the scheduler loop; said once
            log.warning("publishing the dwise outstanding work failed: %s", e)
        FAILED["publishes"] += 1


#: publishes that failed in this process (the first is logged)
FAILED = {"publishes": 0}
