"""dwise_predict.tracing: decode a block-diffusion LM over a workload and record its denoising work.

The engine, adapters and writer need torch, but the workload builder in this package must stay
light, so nothing heavy is imported here: the public names below load on first use.

    from dwise_predict.tracing import load_adapter, trace_workload
    adapter = load_adapter("tiny-bd")
    summary = trace_workload(adapter, records, "traces/", batch_size=16)
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "load_adapter": ".adapters",
    "trace_workload": ".runner",
    "TraceSummary": ".runner",
    "DecodeConfig": ".engine",
    "Decoder": ".decoders",
    "DecodeRequest": ".engine",
    "RequestResult": ".engine",
    "decode": ".engine",
    "TraceWriter": "dwise_predict.trace_writer",
    "compact_traces": ".compact",
    "plan_decoding": ".plans",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
