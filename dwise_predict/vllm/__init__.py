"""DWISE ordering inside vLLM's diffusion scheduler, loaded with ``--scheduler-cls``.

    DWISE_VLLM_BUNDLE=tiny-bd vllm serve MODEL \\
        --scheduler-cls dwise_predict.vllm.DWISEDiffusionScheduler

The scheduler classes extend vLLM 0.33.0's ``DiffusionScheduler`` / ``DiffusionAsyncScheduler``
and are resolved lazily (module ``__getattr__``), so ``import dwise_predict.vllm`` imports
neither vLLM nor torch; vLLM's own loader imports them when it builds its scheduler.

* :mod:`.seam`: every vLLM name used, checked at start-up;
* :mod:`.config`: the ``DWISE_VLLM_*`` settings;
* :mod:`.state`: vLLM's queues in, the runtime policy's order out;
* :mod:`.scheduler`: the two scheduler classes.

See docs/vllm.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DWISEDiffusionAsyncScheduler", "DWISEDiffusionScheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
