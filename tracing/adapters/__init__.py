"""dLLM adapters behind one small protocol, and :func:`load_adapter`, the one entry point.

``load_adapter(name_or_path)`` accepts:

* ``"tiny-bd"`` — the project's shipped reference model (``dwise_predict.zoo.tiny_bd``);
* a folder whose ``config.json`` says ``"model_type": "tiny-bd"`` — a tiny-bd checkpoint;
* a folder whose ``config.json`` says ``"model_type": "diffusion_gemma"`` — transformers'
  native ``DiffusionGemmaForBlockDiffusion`` (traced through its own generation loop);
* ``"hf-mask-predict:PATH_OR_HUB_ID"`` — a Hugging Face mask-predict dLLM (LLaDA/LLaDA2/SDAR
  style, ``trust_remote_code``), decoded by the engine's LowConfidence loop.

This module imports nothing heavy; torch and transformers load inside :func:`load_adapter`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dwise_predict.errors import ModelError

HF_MASK_PREDICT_PREFIX = "hf-mask-predict:"

ACCEPTED = (
    "'tiny-bd', a tiny-bd checkpoint folder, a DiffusionGemma folder (config.json model_type "
    "'diffusion_gemma'), or 'hf-mask-predict:PATH_OR_HUB_ID'"
)


def _model_type(path: Path) -> str | None:
    cfg = path / "config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"cannot read {cfg}: {e}; the model folder is damaged") from e
    mt = data.get("model_type") if isinstance(data, dict) else None
    return mt if isinstance(mt, str) else None


def load_adapter(
    name_or_path: str | Path, *, dtype: str = "float32", device: str = "cpu", **options: Any
) -> Any:
    """Resolve a model name or folder to a ready adapter (see the module docstring).

    ``options`` go to the adapter (e.g. ``mask_token_id``/``block_size``/``attention`` for
    hf-mask-predict, ``max_denoising_steps`` for DiffusionGemma).
    """
    torch_dtype = _torch_dtype(dtype)
    name = str(name_or_path)
    if name.startswith(HF_MASK_PREDICT_PREFIX):
        from .hf_mask_predict import load_hf_mask_predict

        target = name[len(HF_MASK_PREDICT_PREFIX) :]
        if not target:
            raise ModelError(f"'{HF_MASK_PREDICT_PREFIX}' needs a path or hub id after the colon")
        return load_hf_mask_predict(target, dtype=torch_dtype, device=device, **options)
    if name == "tiny-bd":
        from .tiny_bd import load_tiny_bd

        return load_tiny_bd(name, dtype=torch_dtype, device=device)
    path = Path(name)
    if path.is_dir():
        mt = _model_type(path)
        if mt == "tiny-bd":
            from .tiny_bd import load_tiny_bd

            return load_tiny_bd(path, dtype=torch_dtype, device=device)
        if mt == "diffusion_gemma":
            from .diffusion_gemma import load_diffusion_gemma

            return load_diffusion_gemma(path, dtype=torch_dtype, device=device, **options)
        raise ModelError(
            f"{path} holds a model of type {mt!r}, which the tracer cannot decode; accepted: "
            f"{ACCEPTED}. For another mask-predict dLLM pass --model {HF_MASK_PREDICT_PREFIX}{path}"
        )
    raise ModelError(
        f"unknown model {name!r}: not a known name nor an existing folder; accepted: {ACCEPTED}"
    )


def _torch_dtype(dtype: str) -> Any:
    import torch

    table = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in table:
        raise ModelError(f"unknown dtype {dtype!r}; use one of {sorted(table)}")
    return table[dtype]


__all__ = ["load_adapter", "HF_MASK_PREDICT_PREFIX", "ACCEPTED"]
