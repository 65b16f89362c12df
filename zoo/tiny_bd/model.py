"""The tiny-bd transformer: bidirectional attention inside a block, causal across blocks.

The model itself is mask-agnostic: every forward takes explicit ``position_ids`` and a boolean
attention mask, plus an optional KV cache of earlier (clean, committed) tokens. That one
signature serves all three uses:

* block-by-block inference (prefill and denoising): the current block attends to the cache
  and bidirectionally to itself; the forward also returns the block's own keys/values so the
  caller decides whether to commit them (clean blocks) or drop them (a still-noisy block);
* training with a block-causal mask over a whole sequence (see :func:`block_causal_mask`);
* the tracer's hidden-state capture: ``hidden`` is the final norm's output, i.e. the rows the
  refinement predictor reads, returned by the same forward that produces the logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import TinyBDConfig

#: per layer: (keys, values), each [batch, heads, length, head_dim], rotary already applied
KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TinyBDOutput:
    logits: torch.Tensor  # [B, T, V]
    hidden: torch.Tensor  # [B, T, D] final-norm output
    kv: KV  # keys/values of the T input tokens, per layer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: TinyBDConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        past: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        new_kv = (k, v)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, t, -1)), new_kv


class MLP(nn.Module):
    def __init__(self, cfg: TinyBDConfig) -> None:
        super().__init__()
        self.gate_up = nn.Linear(cfg.d_model, 2 * cfg.d_ff, bias=False)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class Layer(nn.Module):
    def __init__(self, cfg: TinyBDConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past):  # type: ignore[no-untyped-def]
        a, kv = self.attn(self.attn_norm(x), cos, sin, mask, past)
        x = x + a
        return x + self.mlp(self.mlp_norm(x)), kv


class TinyBDModel(nn.Module):
    """A small masked block-diffusion LM. ``hidden`` = output of the final norm."""

    inv_freq: torch.Tensor  # rotary frequencies, a non-persistent buffer

    def __init__(self, cfg: TinyBDConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        inv_freq = 1.0 / (
            cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32) / cfg.head_dim)
        )
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)

    def rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = (position_ids.to(torch.float32)[..., None] * self.inv_freq)[
            :, None
        ]  # [B, 1, T, dh/2]
        return freqs.cos(), freqs.sin()

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        past_kv: KV | None = None,
    ) -> TinyBDOutput:
        """One forward.

        ``attn_mask``: bool ``[B or 1, 1, T, P+T]`` (True = may attend) over the ``P`` cached and
        ``T`` new tokens; None = every new token sees the whole cache and all new tokens (the
        right mask for one block whose cache has no padding).
        """
        if position_ids.max() >= self.config.max_position:
            raise ValueError(
                f"position {int(position_ids.max())} exceeds "
                f"max_position {self.config.max_position}"
            )
        x = self.embed(input_ids)
        cos, sin = self.rope(position_ids)
        new_kv: KV = []
        for i, layer in enumerate(self.layers):
            x, kv = layer(x, cos, sin, attn_mask, past_kv[i] if past_kv is not None else None)
            new_kv.append(kv)
        hidden = self.norm(x)
        logits = F.linear(hidden, self.embed.weight)  # tied embeddings
        return TinyBDOutput(logits=logits, hidden=hidden, kv=new_kv)


def block_causal_mask(
    n_tokens: int, block_size: int, offset: int = 0, device: torch.device | None = None
) -> torch.Tensor:
    """``[1, 1, n, n]`` bool: token i sees token j iff block(j) <= block(i).

    Blocks are counted from ``offset`` (the position of the first token), so a sequence whose
    blocks are aligned to the output start uses the same mask as block-by-block inference.
    """
    pos = torch.arange(n_tokens, device=device) + offset
    blk = pos // block_size
    return (blk[None, :] <= blk[:, None])[None, None]
