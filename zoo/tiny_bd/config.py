"""Configuration of the tiny-bd reference model (plain dataclass, saved as config.json)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dwise_predict.atomic import write_json
from dwise_predict.errors import ConfigError


@dataclass(frozen=True)
class TinyBDConfig:
    """Shape of the model. Defaults = the shipped tiny-bd (4 layers x 128 wide: on 2 shared CPU
    cores, a narrower model gets more steps, and steps mattered more than width)."""

    vocab_size: int = 264
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 384
    block_size: int = 32
    max_position: int = 16384
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    pad_token_id: int = 0
    mask_token_id: int = 1
    eos_token_id: int = 2
    model_type: str = "tiny-bd"

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ConfigError("head dimension must be even for rotary embeddings")
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TinyBDConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TinyBDConfig:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read tiny-bd config {path}: {e}") from e
