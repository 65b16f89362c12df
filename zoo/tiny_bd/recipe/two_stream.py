"""The two-stream training layout (BD3-LM) that trains every output block in one forward.

Decoding sees an output block while it is still noisy, with a cache of the *clean* prompt and
the clean earlier output blocks. Training must show the model exactly that view for every
block at once, so each training sequence is laid out as

    [prompt | clean response | noisy response]

with the noisy tokens reusing the positions of the clean tokens they replace, and a mask
that reproduces the decoder's visibility:

* prompt token in chunk c (chunks of ``block_size`` from position 0) sees prompt chunks <= c
  (the decoder prefills the prompt chunk by chunk);
* clean response token in output block b sees the whole prompt and clean output blocks <= b
  (the commit forward of a finished block);
* noisy response token in output block b sees the whole prompt, clean output blocks < b and
  the noisy tokens of block b (bidirectionally) -- the denoising forward;
* padding sees only itself and is seen by nobody.

Output blocks start at ``len(prompt)``, not at a multiple of ``block_size``, like decoding in
the response-aligned layout. In the absolute layout (how SGLang serves the model,
docs/tracing.md) the prompt's ``len(prompt) mod block_size`` last tokens share the first output
block: :func:`collate` with ``absolute`` moves them to the front of the response, as clean
tokens that are never masked and carry no loss, so every output block starts at a multiple of
``block_size``. :func:`tests.test_tiny_bd` checks that the logits of noisy block j here equal a
cached, block-by-block inference forward in both layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dwise_predict.errors import TrainingError

from ..tokenizer import EOS, MASK, PAD

#: token kinds inside a two-stream sequence
PROMPT, CLEAN, NOISY, PADDING = 0, 1, 2, 3


@dataclass
class TwoStreamBatch:
    """A padded batch ready for ``TinyBDModel.forward``.

    ``targets`` holds the clean token at every noisy position that was masked and -100
    elsewhere, so cross-entropy over it is the masked-diffusion loss. ``mask_ratio`` is the
    per-position t of its block (0 where not a noisy position), for optional 1/t weighting.
    """

    input_ids: torch.Tensor  # [B, T] long
    position_ids: torch.Tensor  # [B, T] long
    attn_mask: torch.Tensor  # [B, 1, T, T] bool
    targets: torch.Tensor  # [B, T] long, -100 = no loss
    mask_ratio: torch.Tensor  # [B, T] float
    kind: torch.Tensor  # [B, T] long (PROMPT/CLEAN/NOISY/PADDING)
    #: [B, T] bool: noisy positions after the response's first EOS (the EOS padding of its last
    #: block)
    eos_padding: torch.Tensor | None = None
    #: [B] bool: rows whose examples are distilled from teacher checkpoints (:mod:`.distill`)
    distill_rows: torch.Tensor | None = None
    #: [B] bool: rows whose examples are held to the anchor checkpoint (:mod:`.distill`)
    anchor_rows: torch.Tensor | None = None


def layout(
    prompt_len: int, response_len: int, block_size: int, total_len: int
) -> tuple[torch.Tensor, ...]:
    """Kind, block index and position of every slot of one padded two-stream sequence."""
    if response_len % block_size:
        raise TrainingError(
            f"response length {response_len} is not a multiple of block_size {block_size}; "
            "pad the last output block with EOS (data.encode_example does)"
        )
    n = prompt_len + 2 * response_len
    if n > total_len:
        raise TrainingError(f"sequence of {n} tokens does not fit the padded length {total_len}")
    kind = torch.full((total_len,), PADDING, dtype=torch.long)
    blk = torch.full((total_len,), -1, dtype=torch.long)
    pos = torch.zeros(total_len, dtype=torch.long)
    p = torch.arange(prompt_len)
    r = torch.arange(response_len)
    kind[:prompt_len] = PROMPT
    blk[:prompt_len] = p // block_size
    pos[:prompt_len] = p
    for start, k in ((prompt_len, CLEAN), (prompt_len + response_len, NOISY)):
        kind[start : start + response_len] = k
        blk[start : start + response_len] = r // block_size
        pos[start : start + response_len] = prompt_len + r
    return kind, blk, pos


def visibility(kind: torch.Tensor, blk: torch.Tensor) -> torch.Tensor:
    """``[..., T, T]`` bool: query i may attend key j (see the module docstring)."""
    qk, kk = kind[..., :, None], kind[..., None, :]
    qb, kb = blk[..., :, None], blk[..., None, :]
    key_prompt = kk == PROMPT
    see_prompt_q = key_prompt & (kb <= qb)
    see_clean_q = key_prompt | ((kk == CLEAN) & (kb <= qb))
    see_noisy_q = key_prompt | ((kk == CLEAN) & (kb < qb)) | ((kk == NOISY) & (kb == qb))
    vis = torch.where(
        qk == PROMPT,
        see_prompt_q,
        torch.where(
            qk == CLEAN,
            see_clean_q,
            torch.where(qk == NOISY, see_noisy_q, torch.zeros_like(see_prompt_q)),
        ),
    )
    eye = torch.eye(kind.shape[-1], dtype=torch.bool)
    return vis | ((qk == PADDING) & eye)


def absolute_layout(
    prompt: Sequence[int], response: Sequence[int], block_size: int
) -> tuple[list[int], list[int], int]:
    """``(prompt head, tail + response, tail length)``: the prompt's last ``len mod block_size``
    tokens moved into the first output block, as the absolute layout decodes them.

    The response stays a whole number of blocks: the tail takes the place of trailing EOS
    padding when there is enough of it, else one more block of EOS padding is added.
    """
    m = len(prompt) % block_size
    if m == 0:
        return list(prompt), list(response), 0
    r = list(response)
    first_eos = r.index(EOS) if EOS in r else len(r)
    padding = len(r) - first_eos - 1
    r = r[: len(r) - m] if padding >= m else r + [EOS] * (block_size - m)
    return list(prompt[: len(prompt) - m]), list(prompt[len(prompt) - m :]) + r, m


def collate(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    block_size: int,
    generator: torch.Generator | None = None,
    t_min: float = 0.0,
    mask_ratios: Sequence[Sequence[float]] | None = None,
    absolute: Sequence[bool] | None = None,
) -> TwoStreamBatch:
    """Build a noised two-stream batch.

    Every output block of every example draws its own mask ratio t ~ U(t_min, 1] (LLaDA's
    forward process per block) unless ``mask_ratios`` gives them; each response position of the
    block is then masked with probability t. Noise comes from ``generator`` so a seeded run is
    reproducible. ``absolute[i]`` lays example i out in the absolute layout
    (:func:`absolute_layout`); by default every example is response-aligned.
    """
    if len(prompts) != len(responses) or not prompts:
        raise TrainingError(
            f"need matching, non-empty prompt and response lists, got {len(prompts)} and "
            f"{len(responses)}"
        )
    if absolute is not None and len(absolute) != len(prompts):
        raise TrainingError(f"{len(absolute)} layout flags for {len(prompts)} examples")
    tails = [0] * len(prompts)
    if absolute is not None:
        laid = [
            absolute_layout(p, r, block_size) if a else (list(p), list(r), 0)
            for p, r, a in zip(prompts, responses, absolute)
        ]
        prompts, responses, tails = (
            [x[0] for x in laid],
            [x[1] for x in laid],
            [x[2] for x in laid],
        )
    total = max(len(p) + 2 * len(r) for p, r in zip(prompts, responses))
    b = len(prompts)
    input_ids = torch.full((b, total), PAD, dtype=torch.long)
    targets = torch.full((b, total), -100, dtype=torch.long)
    ratio = torch.zeros(b, total)
    eos_padding = torch.zeros(b, total, dtype=torch.bool)
    kinds, blks, poss = [], [], []
    for i, (p, r) in enumerate(zip(prompts, responses)):
        lp, lr = len(p), len(r)
        kind, blk, pos = layout(lp, lr, block_size, total)
        kinds.append(kind)
        blks.append(blk)
        poss.append(pos)
        clean = torch.as_tensor(list(r), dtype=torch.long)
        n_blocks = lr // block_size
        if mask_ratios is not None:
            t = torch.as_tensor(list(mask_ratios[i]), dtype=torch.float32)
            if t.numel() != n_blocks:
                raise TrainingError(
                    f"example {i}: {t.numel()} mask ratios for {n_blocks} output blocks"
                )
        else:
            u = torch.rand(n_blocks, generator=generator)
            t = 1.0 - u * (1.0 - t_min)  # in (t_min, 1]
        t_pos = t.repeat_interleave(block_size)
        masked = torch.rand(lr, generator=generator) < t_pos
        masked[: tails[i]] = False  # the prompt's tail is clean input, never denoised
        noisy = torch.where(masked, torch.full_like(clean, MASK), clean)
        input_ids[i, :lp] = torch.as_tensor(list(p), dtype=torch.long)
        input_ids[i, lp : lp + lr] = clean
        input_ids[i, lp + lr : lp + 2 * lr] = noisy
        targets[i, lp + lr : lp + 2 * lr] = torch.where(masked, clean, torch.full_like(clean, -100))
        ratio[i, lp + lr : lp + 2 * lr] = t_pos
        first_eos = list(r).index(EOS, tails[i]) if EOS in r[tails[i] :] else lr
        eos_padding[i, lp + lr + first_eos + 1 : lp + 2 * lr] = True
    kind = torch.stack(kinds)
    blk = torch.stack(blks)
    return TwoStreamBatch(
        input_ids=input_ids,
        position_ids=torch.stack(poss),
        attn_mask=visibility(kind, blk)[:, None],
        targets=targets,
        mask_ratio=ratio,
        kind=kind,
        eos_padding=eos_padding,
    )
