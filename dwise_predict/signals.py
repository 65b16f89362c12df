"""Turn a stop request (SIGTERM) into an exception, the way Python turns Ctrl-C into one.

Job schedulers stop or preempt a job with SIGTERM (Slurm, Kubernetes, systemd) and send
SIGKILL a grace period later. Python's default for SIGTERM is to die on the spot, so no
``finally`` runs and work held in memory is lost. Inside :func:`terminate_as_interrupt`
SIGTERM raises :class:`~dwise_predict.errors.Terminated` (a ``KeyboardInterrupt``) in the main
thread instead, so the same clean-up that keeps work on Ctrl-C keeps it on SIGTERM.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from .errors import Terminated


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While inside, the first SIGTERM raises :class:`Terminated`; later ones are ignored.

    Ignoring the repeats matters: a second SIGTERM arriving while the clean-up writes the
    last shard must not abort that write. Nothing changes when called outside the main
    thread (Python only runs signal handlers there) or when the application already
    installed its own SIGTERM handler (a server that shuts down its own way keeps it).
    The previous handler is restored on exit.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:
        yield
        return
    raised = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal raised
        if not raised:
            raised = True
            raise Terminated(signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
