"""Settings read from the environment: one parser for every engine integration.

Why the environment: engines start their schedulers in processes they spawn, and call plugins
and scheduler classes with no arguments of ours, so the environment is the one channel that
reaches every such process (the SGLang plugin's ``DWISE_SGLANG_*``, the vLLM scheduler's
``DWISE_VLLM_*``). A bad value is refused naming the variable.
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


def coerce(prefix: str, name: str, kind: type, raw: Any) -> Any:
    """Setting ``name`` parsed as ``kind`` (bool, int, float, or str: empty is None) from an
    environment string or a JSON value; the error names ``{prefix}{NAME}``."""
    try:
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in TRUE:
                return True
            if text in FALSE:
                return False
            raise ValueError(text)
        if kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise ValueError(raw)
            return int(raw)
        if kind is float:
            return float(raw)
        return None if raw is None or str(raw).strip() == "" else str(raw).strip()
    except (TypeError, ValueError):
        raise ConfigError(
            f"{prefix}{name.upper()}={raw!r} is not a valid {kind.__name__}"
        ) from None
