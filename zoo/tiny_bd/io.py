"""Saving and loading tiny-bd checkpoints as a folder of small declared parts.

A checkpoint folder holds ``config.json``, ``model.safetensors`` (weights only: never a
pickle), ``tokenizer.json``, ``tokenizer_config.json`` (with the chat template, like
Hugging Face models) and a ``README.md`` model card. The shipped reference model lives in
``weights/`` beside this file and is what the name ``tiny-bd`` resolves to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from dwise_predict.atomic import staged_folder, write_json, write_text
from dwise_predict.errors import ModelError

from .config import TinyBDConfig
from .model import TinyBDModel
from .tokenizer import CHAT_TEMPLATE, EOS, MASK, PAD, build_tokenizer

#: the name the zoo (and `dwise-predict trace --model tiny-bd`) resolves to the shipped weights
NAME = "tiny-bd"
WEIGHTS_DIR = Path(__file__).parent / "weights"


@dataclass
class TinyBD:
    """A loaded checkpoint: model (eval mode), tokenizer, chat template, and where it came from."""

    model: TinyBDModel
    tokenizer: Tokenizer
    chat_template: str
    path: Path | None
    revision: str | None

    @property
    def config(self) -> TinyBDConfig:
        return self.model.config


def save_pretrained(
    model: TinyBDModel,
    out_dir: str | Path,
    *,
    card: str | None = None,
    extra_config: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint folder atomically (temp folder, then rename)."""
    out = Path(out_dir)
    with staged_folder(out) as tmp:
        model.config.save(tmp / "config.json")
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(
            state,
            str(tmp / "model.safetensors"),
            metadata={"format": "pt", "model_type": "tiny-bd"},
        )
        build_tokenizer().save(str(tmp / "tokenizer.json"))
        tok_cfg = {
            "chat_template": CHAT_TEMPLATE,
            "pad_token": "<|pad|>",
            "mask_token": "<|mask|>",
            "eos_token": "<|eos|>",
            "model_max_length": model.config.max_position,
            **(extra_config or {}),
        }
        write_json(tmp / "tokenizer_config.json", tok_cfg, sort_keys=False)
        if card is not None:
            write_text(tmp / "README.md", card)
    return out


def save_derived(
    model: TinyBDModel, out: str | Path, parent: Path, command: str, kind: str, record: Any
) -> Path:
    """Write a checkpoint made from others without training (a merge, a growth).

    Its ``training.json`` nests ``parent``'s history under ``previous_stage``, as a continued
    stage does, and records how it was made under ``kind``, so the card lists it as a stage.
    """
    from .card import model_card

    history = parent / "training.json"
    previous = json.loads(history.read_text()) if history.exists() else None
    training: dict[str, Any] = {
        "command": command,
        kind: record,
        "previous_stage": previous,
        "result": {"counts": (previous or {}).get("result", {}).get("counts", {})},
    }
    path = save_pretrained(model, out, card=model_card(model.config, training))
    write_json(path / "training.json", training, sort_keys=False, default=str)
    return path


def from_pretrained(
    name_or_path: str | Path = NAME, *, dtype: torch.dtype = torch.float32
) -> TinyBD:
    """Load ``tiny-bd`` (the shipped weights) or a checkpoint folder written by
    :func:`save_pretrained`."""
    path = WEIGHTS_DIR if str(name_or_path) == NAME else Path(name_or_path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    if not cfg_file.exists() or not weights.exists():
        raise ModelError(
            f"{path} is not a tiny-bd checkpoint (needs config.json and model.safetensors); "
            + (
                "the shipped weights are missing: reinstall dwise-predict"
                if str(name_or_path) == NAME
                else "pass `tiny-bd` or a folder written by save_pretrained"
            )
        )
    cfg = TinyBDConfig.load(cfg_file)
    model = TinyBDModel(cfg)
    state = load_file(str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelError(
            f"{weights} does not match config.json: missing {missing}, unexpected {unexpected}"
        )
    model = model.to(dtype).eval()
    tok_file = path / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(tok_file)) if tok_file.exists() else build_tokenizer()
    template = CHAT_TEMPLATE
    tc = path / "tokenizer_config.json"
    if tc.exists():
        template = json.loads(tc.read_text()).get("chat_template", CHAT_TEMPLATE)
    revision = weights_revision(weights)
    return TinyBD(
        model=model, tokenizer=tokenizer, chat_template=template, path=path, revision=revision
    )


def weights_revision(weights: Path) -> str:
    """Content hash of the weights: the model 'revision' recorded in fingerprints."""
    import hashlib

    h = hashlib.sha256()
    with open(weights, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:12]


__all__ = [
    "NAME",
    "WEIGHTS_DIR",
    "weights_revision",
    "TinyBD",
    "from_pretrained",
    "save_pretrained",
    "PAD",
    "MASK",
    "EOS",
]
