"""The model card (README.md) written next to the tiny-bd weights.

A checkpoint folder must say what it is without the repository around it: architecture,
parameter count, data, the exact training command, and the figures measured on it.
"""

from __future__ import annotations

import re
from typing import Any

from .config import TinyBDConfig


def n_params(config: TinyBDConfig) -> int:
    """Parameter count from the shape alone (tied embeddings)."""
    d, f, v, n = config.d_model, config.d_ff, config.vocab_size, config.n_layers
    per_layer = 3 * d * d + d * d + 2 * d * f + f * d + 2 * d
    return v * d + n * per_layer + d


def training_stages(training: dict[str, Any]) -> list[dict[str, Any]]:
    """The stages of a ``training.json``, oldest first: each stage nests its predecessor under
    ``previous_stage``, so a checkpoint continued N times carries its whole history."""
    stages: list[dict[str, Any]] = []
    stage: dict[str, Any] | None = training
    while stage:
        stages.append(stage)
        stage = stage.get("previous_stage")
    return stages[::-1]


def _stage_line(i: int, stage: dict[str, Any], numbered: bool) -> str:
    """One stage's result and the settings its command line does not show when the defaults moved
    since (stages 1-2 ran when lr defaulted to 3e-3 and the loss was the plain mean)."""
    r, c = stage.get("result", {}), stage.get("train_config", {})
    if "merge" in stage:  # written by merge.py: no training, a weighted mean of checkpoints
        parts = ", ".join(f"{m['revision']} x {m['weight']:g}" for m in stage["merge"])
        return f"- {f'stage {i}: ' if numbered else ''}weighted average of the weights: {parts}"
    if "grow" in stage:  # written by grow.py: no training, the same function with a wider MLP
        g = stage["grow"]
        return (
            f"- {f'stage {i}: ' if numbered else ''}grown from {g['revision']}: feed-forward "
            f"width {g['d_ff'][0]} -> {g['d_ff'][1]}, new units add nothing until trained"
        )
    if "stopped" in stage:  # a run stopped by hand and shipped from a --snapshot-dir snapshot
        return (
            f"- {f'stage {i}: ' if numbered else ''}steps: {r.get('steps')}, seconds: "
            f"{r.get('seconds')}, stopped {stage['stopped']}; peak lr {c.get('lr')}, "
            f"EOS-padding loss weight {c.get('pad_weight', 1.0)}"
        )
    by_hand = ", stopped by hand (Ctrl-C)" if r.get("stopped_by_hand") else ""
    return (
        f"- {f'stage {i}: ' if numbered else ''}steps: {r.get('steps')}, seconds: "
        f"{r.get('seconds')}, final loss: {r.get('final_loss')}, stopped by the time budget: "
        f"{r.get('stopped_by_time')}{by_hand}"
        f"; peak lr {c.get('lr')}, EOS-padding loss weight {c.get('pad_weight', 1.0)}"
    )


MEASURED_HEADING = "## Measured (docs/reference-model.md)"
"""The card section the report (``report.py``) rewrites with its headline figures."""


#: the recipe's modules, once importable from the model package, now in ``recipe/``
_RECIPE_MODULE = re.compile(r"dwise_predict\.zoo\.tiny_bd\.(?!recipe\.)(\w+)")


def recipe_command(command: str) -> str:
    """A recorded training command as it runs today (the recipe moved out of the package)."""
    return _RECIPE_MODULE.sub(r"dwise_predict.zoo.tiny_bd.recipe.\1", command)


def model_card(config: TinyBDConfig, training: dict[str, Any]) -> str:
    """Markdown card as training writes it; the report appends the measured figures later."""
    stages = training_stages(training)
    counts = training.get("result", {}).get("counts", {})
    lines = [
        "---",
        "license: mit",
        "library_name: dwise-predict",
        "tags: [block-diffusion, masked-diffusion, dllm, tiny, reference-model]",
        "---",
        "",
        "# tiny-bd: the dwise-predict reference block-diffusion LM",
        "",
        "A small LLaDA2-style masked block-diffusion "
        "transformer trained on 2 CPU cores so that the",
        "project's predictors and scheduler run on real "
        "denoising behaviour (no dLLM weights can be",
        "downloaded where the project is built). Not "
        "a useful assistant: it learned output formats,",
        "when to stop, and simple tasks (arithmetic, "
        "multiple choice, copy/reverse/count, retrieval).",
        "",
        "## Architecture",
        "",
        f"- {config.n_layers} layers, d_model {config.d_model}, "
        f"{config.n_heads} heads, SwiGLU d_ff {config.d_ff},",
        "  RMSNorm, rotary positions, tied embeddings; "
        "final norm output = the hidden state tracers capture",
        f"- {n_params(config):,} parameters (fp32 safetensors)",
        f"- block size {config.block_size}: bidirectional "
        "attention inside a block, causal across blocks,",
        "  KV cache of finished (clean) blocks",
        "- byte-level tokenizer (256 bytes + 8 specials; PAD=0, MASK=1, EOS=2), chat template",
        "  `<|user|>\\n{prompt}\\n<|assistant|>\\n`",
        "",
        "## Decoding (as traced)",
        "",
        "As SGLang serves it (absolute block layout): blocks sit at multiples of the block size;",
        "the prompt's whole blocks are prefilled, its last len(prompt) mod 32 tokens open the",
        "first output block as clean input and the rest of that block starts masked; every round",
        "unmasks the masked positions whose top-1 probability is >= tau (at least the most",
        "confident one); stop at an EOS in a finished block or at the output budget (256",
        "tokens). Trained in both layouts since card 20 (`--block-alignment`), so the",
        "response-aligned layout (output blocks from position len(prompt)) decodes too.",
        "",
        "## Training",
        "",
        "Masked block-diffusion loss (each output block "
        "its own mask ratio t ~ U(0,1], CE on masked",
        "positions) with the BD3-LM two-stream layout, "
        "AdamW, warmup + cosine, fp32 on CPU, Lightning,",
        "`seed_everything(seed, workers=True)`, "
        "`Trainer(deterministic=True)`; each stage's peak lr and",
        "EOS-padding loss weight (1.0 = plain mean) are listed with its result below.",
        "",
        "```",
        *(recipe_command(stage.get("command", "")) for stage in stages),
        "```",
        "",
        *(
            [
                "Each command continues the previous one's "
                "output (its `--init-from`; the folders are",
                "where each stage ran) with a fresh schedule and other data draws.",
                "`zoo/tiny_bd/weights` in a command (as `--init-from` or `--anchor`) "
                "means the weights shipped",
                "when that command ran, the previous zoo release.",
            ]
            if len(stages) > 1
            else []
        ),
        *(
            [
                "Checkpoints under `zoo/tiny_bd/candidates/` that some commands name were "
                "removed from the",
                "repository; they are in git history "
                "(`git checkout 1d6b277^ -- zoo/tiny_bd/candidates`).",
            ]
            if any("zoo/tiny_bd/candidates/" in st.get("command", "") for st in stages)
            else []
        ),
        "",
        *(_stage_line(i, stage, numbered=len(stages) > 1) for i, stage in enumerate(stages, 1)),
        "- data of the last stage (examples per category; real "
        "ones only from the workload's TRAIN split, repeated;",
        "  generated ones fresh and checked absent from the eval split): "
        + ", ".join(f"{k} {v}" for k, v in counts.items()),
        "",
    ]
    return "\n".join(lines)
