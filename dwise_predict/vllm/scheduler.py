"""The DWISE schedulers vLLM loads with ``--scheduler-cls``.

``DWISEDiffusionScheduler`` extends vLLM 0.33.0's ``DiffusionScheduler`` (and
``DWISEDiffusionAsyncScheduler`` its ``DiffusionAsyncScheduler``, for servers with async
scheduling). Each override calls vLLM's own method and only adds the translation to and from
:class:`~.state.DwiseVllmState`:

* ``__init__``: :func:`attach`: every vLLM name checked, settings read, bundle loaded and
  checked against the served model's fingerprint; a failure stops the engine at start-up;
* ``add_request``: the arrival's admission estimate and its row;
* ``schedule``: waiting queue and running list sorted by the policy's key, then vLLM's own
  ``schedule()`` (admission, token budget, KV allocation, preemption), then residency and
  preemptions read back from its output;
* ``update_from_output``: denoising steps, commits, prompt progress and finishes;
* ``finish_requests``: client aborts, waiting or running, forgotten after vLLM freed them.

Importing this module imports vLLM (``dwise_predict.vllm`` resolves these classes lazily, so
``import dwise_predict`` never does).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import ConfigError
from . import seam
from .config import load_config
from .state import DwiseVllmState

log = logging.getLogger(__name__)

#: the attribute that holds the DWISE state on a vLLM scheduler
STATE_ATTR = "dwise"


def attach(sched: Any) -> DwiseVllmState:
    """Check vLLM, the settings and the bundle against this scheduler; build the state."""
    from ..bundle import load_bundle

    seam.require()
    seam.check_scheduler(sched)
    config = load_config()
    canvas = seam.canvas_length(sched)
    if not seam.uses_fcfs_queue(sched):
        raise ConfigError(
            f"the DWISE scheduler orders vLLM's waiting queue itself, but this server runs "
            f"--scheduling-policy {seam.scheduling_policy(sched)} (a heap on priority): serve "
            "with the default --scheduling-policy fcfs"
        )
    bundle = None
    if config.bundle:
        bundle = load_bundle(config.bundle)
        bundle.check(seam.server_fingerprint(sched), allow_mismatch=config.allow_mismatch)
        if bundle.admission is None:
            raise ConfigError(
                f"bundle '{bundle.name}' has no admission predictor, which DWISE ranks "
                "arrivals by: train one with `dwise-predict train --only admission`"
            )
    state = DwiseVllmState(
        config,
        bundle,
        canvas_length=canvas,
        max_running=seam.max_running(sched),
        prompt_chunk=seam.prompt_chunk(sched),
    )
    log.info(
        "dwise: policy %s, canvas %d, max_num_seqs %d, bundle %s",
        config.policy,
        canvas,
        seam.max_running(sched),
        "none" if bundle is None else bundle.name,
    )
    return state


class _DWISEOrder:
    """The overrides both DWISE schedulers share (vLLM's scheduler follows in the MRO)."""

    dwise: DwiseVllmState

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dwise = attach(self)

    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        live = seam.live_requests(self).get(seam.rid(request))
        if live is not None and not seam.finished(live):
            self.dwise.arrive(live)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        self.dwise.order(self)
        out = super().schedule(*args, **kwargs)  # type: ignore[misc]
        self.dwise.after_schedule(self, out)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        result = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )
        self.dwise.after_update(self, scheduler_output, model_runner_output)
        return result

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        ended = super().finish_requests(request_ids, finished_status)  # type: ignore[misc]
        self.dwise.forget([seam.rid(r) for r in ended], aborted=True)
        return ended


_Sync, _Async = seam.base_classes()


class DWISEDiffusionScheduler(_DWISEOrder, _Sync):  # type: ignore[misc,valid-type]
    """vLLM's ``DiffusionScheduler``, its queues ranked by DWISE (see the module docstring)."""


class DWISEDiffusionAsyncScheduler(_DWISEOrder, _Async):  # type: ignore[misc,valid-type]
    """vLLM's ``DiffusionAsyncScheduler``, its queues ranked by DWISE."""
