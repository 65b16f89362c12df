"""Writing ONNX files the way every dwise-predict file is written: described, whole, never half.

The exporters stamp ``dwise.*`` metadata (read back by
:mod:`dwise_predict.predictors.onnx_runtime`) and save to a temporary name in the target folder
before ``os.replace``, so a crash never leaves a truncated model where a loader would find it.
Weights are always embedded (no external-data side file): the models are megabytes, and one
file is one sha256 in the bundle manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dwise_predict.atomic import write_bytes
from dwise_predict.predictors.onnx_runtime import FORMAT, FORMAT_VERSION


def set_metadata(model: Any, meta: dict[str, str]) -> None:
    """Replace the ``dwise.*`` metadata of an ``onnx.ModelProto`` with ``meta`` (+ format keys)."""
    keep = [p for p in model.metadata_props if not p.key.startswith("dwise.")]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in {
        "dwise.format": FORMAT,
        "dwise.format_version": str(FORMAT_VERSION),
        **meta,
    }.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, str(value)


def get_metadata(model: Any) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def save_model_atomic(model: Any, path: str | Path) -> Path:
    """Serialize ``model`` into ``path`` through a temporary file in the same folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, model.SerializeToString())
    return path
