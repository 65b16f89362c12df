"""Work the plugin must do but the scheduler thread must not wait for: file writes.

SGLang turns its overlap scheduler off for dLLMs, so every microsecond the scheduler thread
spends outside the forward is GPU idle time. Serving-trace shards and monitor snapshots are
fsync-ed files; they are handed to one daemon thread here, in submission order. A failure there
is logged with what to do, never raised into the scheduler: a full disk must not become an
outage. :meth:`Background.drain` waits for everything submitted so far (tests, benchmarks and
shutdown use it).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class Background:
    """One worker thread running submitted calls in order; errors are logged, not raised."""

    def __init__(self, name: str = "dwise-background") -> None:
        self._tasks: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()
        self.failures = 0
        # a clean interpreter exit writes what is still queued (daemon threads are not joined)
        atexit.register(_close_at_exit, weakref.ref(self))

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._tasks.put((fn, args))

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            try:
                if task is None:
                    return
                fn, args = task
                fn(*args)
            except Exception as e:  # logged: the scheduler thread must never see it
                self.failures += 1
                log.error(
                    "dwise plugin: background %s failed: %s (serving goes on; check the "
                    "trace/monitor folder's space and permissions)",
                    getattr(task[0], "__qualname__", "task") if task else "task",
                    e,
                )
            finally:
                self._tasks.task_done()

    def drain(self) -> None:
        """Block until every call submitted so far has run."""
        if self._thread.is_alive():
            self._tasks.join()

    def close(self) -> None:
        """Run what is queued, then stop the thread. Idempotent."""
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()


def _close_at_exit(ref: weakref.ref[Background]) -> None:
    background = ref()
    if background is not None:
        background.close()
