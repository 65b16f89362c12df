"""Profile traces: what `dwise-predict profile` measured, one Parquet row per request.

A profile trace keeps each request's phases apart (prefill, every denoising step (b, s),
each block's commit/KV refresh), measured while the request was served alone, so its times
are the request's own and not those of whatever shared its batch. Ordinary traces
(``round_wall_ms``, batched) can be read too, as a fallback: their commit is folded into the
next block's first step, so only the total is trusted (see ``fit_cost_profile``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dwise_predict.atomic import write_bytes
from dwise_predict.errors import TraceError
from dwise_predict.traces import read_trace_fingerprint, read_traces, trace_files

from .cost_profile import ProfiledRequest

PROFILE_TRACES_FILE = "profile.parquet"
META_KIND = b"dwise.kind"
META_FINGERPRINT = b"dwise.fingerprint"
META_HARDWARE = b"dwise.hardware"
KIND = b"cost-profile-traces"

SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("prompt_tokens", pa.int32(), nullable=False),
        pa.field("prompt_blocks", pa.int32(), nullable=False),
        pa.field("rounds_per_block", pa.list_(pa.int32()), nullable=False),
        pa.field("prefill_ms", pa.float64(), nullable=False),
        pa.field("denoise_ms", pa.float64(), nullable=False),
        pa.field("refresh_ms", pa.float64(), nullable=False),
        # every denoising step's wall time in order: block 0 steps 0.., block 1 steps 0.., ...
        pa.field("step_ms", pa.list_(pa.float32()), nullable=False),
        # the speed probe next to the request (ProfiledRequest.probe_ms); null: not measured.
        # Phase and step times are as measured: the fit applies the speed correction.
        pa.field("probe_ms", pa.float64(), nullable=True),
    ]
)


def write_profile_traces(
    path: str | Path,
    requests: Sequence[ProfiledRequest],
    request_ids: Sequence[str],
    prompt_tokens: Sequence[int],
    step_ms: Sequence[Sequence[float]],
    fingerprint: dict[str, Any],
    hardware: str,
) -> Path:
    """Write ``profile.parquet`` atomically (``path`` is the file or its folder)."""
    p = Path(path)
    if p.suffix != ".parquet":
        p.mkdir(parents=True, exist_ok=True)
        p = p / PROFILE_TRACES_FILE
    table = pa.table(
        {
            "request_id": list(request_ids),
            "prompt_tokens": list(prompt_tokens),
            "prompt_blocks": [r.prompt_blocks for r in requests],
            "rounds_per_block": [list(r.rounds_per_block) for r in requests],
            "prefill_ms": [r.prefill_ms for r in requests],
            "denoise_ms": [r.denoise_ms for r in requests],
            "refresh_ms": [r.refresh_ms for r in requests],
            "step_ms": [list(s) for s in step_ms],
            "probe_ms": [r.probe_ms for r in requests],
        },
        schema=SCHEMA,
    ).replace_schema_metadata(
        {
            META_KIND: KIND,
            META_FINGERPRINT: json.dumps(fingerprint, sort_keys=True).encode(),
            META_HARDWARE: hardware.encode(),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes(p, sink.getvalue().to_pybytes())
    return p


def is_profile_traces(path: str | Path) -> bool:
    p = Path(path)
    f = p / PROFILE_TRACES_FILE if p.is_dir() else p
    if not f.is_file():
        return False
    try:
        meta = pq.read_schema(f).metadata or {}
    except (pa.ArrowInvalid, OSError):
        return False
    return meta.get(META_KIND) == KIND


def read_profile_traces(path: str | Path) -> tuple[list[ProfiledRequest], dict[str, Any], str]:
    """Profiled requests, the fingerprint and the hardware line of a profile (or ordinary) trace.

    Ordinary traces give requests whose prefill is their first ``prompt_blocks`` rounds,
    whose denoising is the rest and whose refresh is 0 (folded in: the fit uses the total)."""
    p = Path(path)
    if is_profile_traces(p):
        f = p / PROFILE_TRACES_FILE if p.is_dir() else p
        table = pq.read_table(f)
        meta = table.schema.metadata or {}
        fingerprint = json.loads(meta.get(META_FINGERPRINT, b"{}"))
        hardware = meta.get(META_HARDWARE, b"").decode()
        rows = table.to_pylist()
        return (
            [
                ProfiledRequest(
                    r["prompt_blocks"],
                    tuple(r["rounds_per_block"]),
                    r["prefill_ms"],
                    r["denoise_ms"],
                    r["refresh_ms"],
                    r.get("probe_ms"),  # absent from profiles measured before probes
                )
                for r in rows
            ],
            fingerprint,
            hardware,
        )
    if not trace_files(p):
        raise TraceError(
            f"{p} holds no profile or trace files; run `dwise-predict profile` or "
            "`dwise-predict trace` first"
        )
    table = read_traces(p, columns=["prompt_blocks", "rounds_per_block", "round_wall_ms"])
    fingerprint = read_trace_fingerprint(p).to_dict()
    out = []
    for r in table.to_pylist():
        walls, m = r["round_wall_ms"], r["prompt_blocks"]
        if not walls:
            continue
        out.append(
            ProfiledRequest(
                m, tuple(r["rounds_per_block"]), float(sum(walls[:m])), float(sum(walls[m:])), 0.0
            )
        )
    if not out:
        raise TraceError(f"traces at {p} have no round_wall_ms; they cannot price a cost profile")
    return out, fingerprint, "ordinary traces (batched rounds; commit folded into the next step)"
