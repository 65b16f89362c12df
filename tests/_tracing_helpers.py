"""Small real models for the tracing tests (random weights, made deliberately confident).

A freshly initialised tiny-bd is unsure of every position (every block takes ``block_size``
rounds). Scaling the final norm makes its predictions peaked so confidence really varies
between positions, and giving the EOS embedding one strong coordinate makes some requests
stop at EOS, so both stopping rules are exercised by the real model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
from dwise_predict.zoo.tiny_bd.io import save_pretrained
from dwise_predict.zoo.tiny_bd.model import TinyBDModel

PROMPTS = [
    "hello",
    "what is 2+2?",
    "a" * 50,
    "line\nline2\n" * 5,
    "x",
    "tell me a story",
    "yo",
    "abc" * 20,
    "zzz",
    "qwerty uiop",
    "Write a haiku about the sea.",
    "1 2 3 4 5 6 7 8 9 10 11 12",
]


def make_tiny_bd(
    out: Path,
    *,
    block_size: int = 8,
    norm_scale: float = 50.0,
    eos_weight: float = 0.4,
    seed: int = 0,
    max_position: int = 16384,
) -> Path:
    torch.manual_seed(seed)
    cfg = TinyBDConfig(
        d_model=64,
        n_layers=2,
        n_heads=2,
        d_ff=128,
        block_size=block_size,
        max_position=max_position,
    )
    model = TinyBDModel(cfg)
    with torch.no_grad():
        model.norm.weight.mul_(norm_scale)
        model.embed.weight[cfg.eos_token_id] = 0.0
        model.embed.weight[cfg.eos_token_id, 0] = eos_weight
    return save_pretrained(model, out)


def workload_records(prompts: list[str] = PROMPTS, category: str = "chat") -> list[dict]:
    return [
        {
            "id": f"req-{i:03d}",
            "category": category,
            "source": "test",
            "prompt": p,
            "reference": None,
            "meta": {},
        }
        for i, p in enumerate(prompts)
    ]


def make_diffusion_gemma(
    out: Path, *, canvas_length: int = 8, max_denoising_steps: int = 6, seed: int = 0
) -> Path:
    """A tiny random DiffusionGemma (text + a 1-layer vision tower) with tiny-bd's byte
    tokenizer."""
    from transformers import (
        DiffusionGemmaConfig,
        DiffusionGemmaForBlockDiffusion,
    )
    from transformers.models.diffusion_gemma.configuration_diffusion_gemma import (
        DiffusionGemmaTextConfig,
    )

    text = DiffusionGemmaTextConfig(
        vocab_size=264,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=16,
        max_position_embeddings=512,
        sliding_window=64,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=3,
        layer_types=["sliding_attention", "full_attention"],
        num_experts=4,
        top_k_experts=2,
        moe_intermediate_size=32,
    )
    vision = dict(
        model_type="gemma4_vision",
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=8,
        position_embedding_size=64,
    )
    cfg = DiffusionGemmaConfig(
        text_config=text,
        vision_config=vision,
        canvas_length=canvas_length,
        image_token_id=260,
        boi_token_id=261,
        eoi_token_id=262,
    )
    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    model.generation_config.max_denoising_steps = max_denoising_steps
    model.save_pretrained(str(out))
    _save_byte_tokenizer(out)
    return out


def _save_byte_tokenizer(out: Path) -> None:
    """tiny-bd's byte tokenizer and chat template, saved as a transformers tokenizer beside a
    model."""
    from dwise_predict.zoo.tiny_bd.tokenizer import CHAT_TEMPLATE, build_tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(),
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        mask_token="<|mask|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(out))


def make_bert_mask_predict(out: Path, *, seed: int = 0) -> Path:
    """A tiny random BERT masked LM with tiny-bd's byte tokenizer: a real HF mask-predict model,
    offline."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=264,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        eos_token_id=2,
    )
    model = BertForMaskedLM(cfg).eval()
    with torch.no_grad():  # peaked predictions, so confidence varies between positions
        model.cls.predictions.transform.LayerNorm.weight.mul_(30.0)
    model.save_pretrained(str(out))
    _save_byte_tokenizer(out)
    return out


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These models are tiny: one thread is faster than two on the shared 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
