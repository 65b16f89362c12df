"""The oracle rung's knowledge: each request's true work, from an earlier run of it.

``DWISE_SGLANG_POLICY=oracle`` ranks by true remaining work, which only a replay knows: a
benchmark serves a set of requests once, then again under the oracle. The work is counted as
SGLang spends it, in denoising forwards (r + 1 per output block that needed r steps), so the
oracle's ranking and the server's progress count the same thing.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


def load_oracle(source: str | Path) -> dict[str, float]:
    """{request id: denoising forwards} from a JSON object of that, or a folder (or file) of
    traces (each row's Σ(r + 1) over its ``rounds_per_block``)."""
    path = Path(source).expanduser()
    if not path.exists():
        raise ConfigError(
            f"DWISE_SGLANG_ORACLE={source!r} does not exist; point it at a JSON file "
            "{request id: denoising forwards} or a folder of the requests' traces"
        )
    if path.is_file() and path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ConfigError(f"DWISE_SGLANG_ORACLE={source!r} is not valid JSON: {e}") from e
        if not isinstance(data, dict) or not all(
            isinstance(v, (int, float)) and v >= 1 for v in data.values()
        ):
            raise ConfigError(
                f"DWISE_SGLANG_ORACLE={source!r} must hold a JSON object of request id -> "
                "denoising forwards (numbers >= 1)"
            )
        return {str(k): float(v) for k, v in data.items()}
    from ..traces import read_traces

    table = read_traces(path, columns=["request_id", "rounds_per_block"])
    ids = table.column("request_id").to_pylist()
    rounds = table.column("rounds_per_block").to_pylist()
    return {str(i): float(sum(r + 1 for r in rpb)) for i, rpb in zip(ids, rounds)}
