"""Watch the bundle reference for a new revision; download, verify and load it off the
scheduler thread.

Why a thread of its own: loading a bundle reads and hashes every file (megabytes) and builds
its predictors, and pulling a Hub revision is a download; SGLang's scheduler thread must not
wait for either (every millisecond it spends outside the forward is GPU idle time). So the
watcher does all of it and leaves the result, a ready :class:`Arrival`, in a one-slot inbox
that the scheduler thread empties between rounds (``lifecycle.py``).

What counts as a new revision: ``DWISE_SGLANG_BUNDLE`` resolves to a folder (a local path, a
symlink an operator flips to the next revision, a Hub ref whose branch moved to a new commit);
its identity is that folder's real path and the sha256 of its ``manifest.json``, which lists
the sha256 of every file. A changed identity is loaded once; a revision that fails (integrity,
fingerprint, a predictor the configured policy needs) is refused once, not retried every poll.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import DwisePredictError

if TYPE_CHECKING:
    from ..bundle import Bundle

log = logging.getLogger(__name__)

#: while a revision loads, the loading thread runs at most LOAD_BUSY_SECONDS at a time and
#: then sleeps LOAD_PAUSE_SECONDS (:func:`throttled`): at most a fifth of the interpreter
LOAD_BUSY_SECONDS = 0.0002
LOAD_PAUSE_SECONDS = 0.0008
#: and the interpreter hands the GIL back to the scheduler thread after this many seconds
#: (sys.setswitchinterval) instead of its default 5 ms
LOAD_SWITCH_INTERVAL = 0.0001


@dataclass(frozen=True)
class Revision:
    """Where a bundle reference points now: its local folder and that folder's identity."""

    path: Path
    manifest_sha256: str

    @property
    def identity(self) -> tuple[str, str]:
        return str(self.path), self.manifest_sha256

    @property
    def short(self) -> str:
        return self.manifest_sha256[:12]


def current_revision(ref: str) -> Revision:
    """Resolve ``ref`` (a folder, a symlink, a Hub ref, a zoo name) to its revision now."""
    from ..bundle import resolve_bundle_path
    from ..bundle.format import MANIFEST

    path = Path(os.path.realpath(resolve_bundle_path(ref)))
    digest = hashlib.sha256((path / MANIFEST).read_bytes()).hexdigest()
    return Revision(path, digest)


@dataclass
class Arrival:
    """What the watcher found: a loaded and verified bundle, or why a revision was refused."""

    revision: Revision
    bundle: Bundle | None
    error: str | None
    #: seconds the load and verification took on the watcher thread, and when they ran
    load_seconds: float
    started: float
    finished: float
    thread: str


class BundleWatcher:
    """Polls ``ref`` every ``interval`` seconds on a daemon thread (see the module doc).

    ``verify(bundle)`` raises a :class:`~dwise_predict.errors.DwisePredictError` for a bundle
    that must not serve here (fingerprint, policy needs); it runs on the watcher thread."""

    def __init__(
        self,
        ref: str,
        interval: float,
        verify: Callable[[Bundle], None],
        *,
        seen: Revision | None = None,
    ) -> None:
        self.ref = ref
        self.interval = float(interval)
        self.verify = verify
        self._seen = None if seen is None else seen.identity
        self._lock = threading.Lock()
        self._inbox: Arrival | None = None
        self._stop = threading.Event()
        #: (started, finished) perf_counter times of every load, for benchmarks
        self.loads: list[tuple[float, float]] = []
        self.polls = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="dwise-bundle-watch")
        self._thread.start()

    # -- the scheduler thread ---------------------------------------------------------------------
    def take(self) -> Arrival | None:
        """The newest ready arrival, if any (never blocks on a load: the lock guards a swap)."""
        with self._lock:
            arrival, self._inbox = self._inbox, None
        return arrival

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    # -- the watcher thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> Arrival | None:
        """One check: load and verify the revision ``ref`` points at if it is new."""
        self.polls += 1
        try:
            rev = current_revision(self.ref)
        except (OSError, DwisePredictError) as e:  # mid-publish, the Hub unreachable: next poll
            log.debug("dwise bundle watch: %s not readable now (%s)", self.ref, e)
            return None
        with self._lock:
            if rev.identity == self._seen:
                return None
            self._seen = rev.identity
        arrival = self._load(rev)
        with self._lock:
            self._inbox = arrival  # a newer revision replaces one not taken yet
        return arrival

    def _load(self, rev: Revision) -> Arrival:
        from ..bundle import load_bundle

        t0 = time.perf_counter()
        bundle: Bundle | None = None
        error = None
        try:
            with throttled():
                bundle = load_bundle(rev.path)
                self.verify(bundle)
                _warm(bundle)
        except Exception as e:  # any failure refuses this revision; serving goes on
            kind = "" if isinstance(e, DwisePredictError) else f"{type(e).__name__}: "
            bundle, error = None, f"{kind}{e}"
        t1 = time.perf_counter()
        self.loads.append((t0, t1))
        return Arrival(rev, bundle, error, t1 - t0, t0, t1, threading.current_thread().name)


@contextmanager
def throttled(
    busy: float = LOAD_BUSY_SECONDS,
    pause: float = LOAD_PAUSE_SECONDS,
    switch_interval: float = LOAD_SWITCH_INTERVAL,
) -> Iterator[None]:
    """Run the body on this thread at a duty cycle of ``busy / (busy + pause)``.

    Why: loading a bundle is mostly Python (parsing trees into tables, building featurizers)
    that holds the GIL. A thread that wants the GIL all the time halves the scheduler thread's
    share of it, and every time the scheduler thread gives the GIL up (each torch call, each
    lock) it waits a switch interval to get it back: measured in SGLang's loop, rounds
    overlapping a load took up to 8x the median round. Throttled, the loading thread holds
    the GIL at most about ``busy`` seconds at a time and then sleeps (the GIL released)
    ``pause`` seconds, so a round overlapping a load costs about what it costs without one;
    the load takes ``(busy + pause) / busy`` times longer and more (a revision of the
    admission model: 16 ms alone, about 0.2 s throttled), which a background refresh affords.

    The throttle is a trace function (``sys.settrace``: called at each Python function call,
    on this thread only; any trace function already set, a debugger's or coverage's, is put
    back on exit), and the switch interval is the interpreter's, restored on exit."""
    since = [time.perf_counter()]

    def on_call(frame: object, event: str, arg: object) -> None:
        now = time.perf_counter()
        if now - since[0] >= busy:
            time.sleep(pause)
            since[0] = time.perf_counter()
        return None  # no line events inside the frame

    interval = sys.getswitchinterval()
    previous = sys.gettrace()
    sys.setswitchinterval(min(interval, switch_interval))
    sys.settrace(on_call)
    try:
        yield
    finally:
        sys.settrace(previous)
        sys.setswitchinterval(interval)


def _warm(bundle: Bundle) -> None:
    """Run both admission paths once here (the per-arrival one and the batch one), so their
    first call's costs are not the scheduler thread's, and a bundle that cannot predict is
    refused."""
    import numpy as np

    row = bundle.admission_row("What is 12 + 30?\nAnswer with a number.", 20)
    bundle.predict_admission_one(row)
    bundle.predict_admission_features(np.tile(np.asarray(row), (16, 1)))
