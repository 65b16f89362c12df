"""Adapter for transformers' native ``DiffusionGemmaForBlockDiffusion`` (traced through its own
loop).

DiffusionGemma does not decode by masking: each canvas (block) starts as random tokens, and
an entropy-bound sampler accepts low-entropy tokens and renoises the rest, until its own
stopping rule (stable and confident) or ``max_denoising_steps``. Re-implementing that loop
would trace a different algorithm, so this adapter runs the model's real ``generate`` and
observes it:

* a streamer's ``put_draft`` is called once per denoising step and ``put`` once per finished
  canvas, so *steps per block* = drafts between two ``put`` calls, and the time between
  events is the step's wall time (the encoder pass of a canvas is folded into its first step);
* a forward hook on the decoder's final norm keeps its output on the *first* decoder call,
  i.e. the first denoising step of the first canvas: the rows ``lm_head`` reads in that very
  forward, mean-pooled (no second pass).

Sampling is random, so each request runs alone (batch 1) under its own seed derived from the
run seed and the request id, in a forked RNG: results do not depend on batch composition,
order or resume, and the caller's RNG is untouched.

Layout: the context is encoded in a separate pass and each canvas starts right after it, so
its traces are response-aligned (``block_alignment = response``), which is also how SGLang
serves it (its Gemma4Renoise algorithm encodes the context apart and places the first canvas
at the prompt's length). The absolute layout does not apply and is refused.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dwise_predict.errors import ConfigError, MissingDependencyError, ModelError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import RESPONSE, text_hash

from ..decoders import Decoder
from ..engine import RequestResult
from .base import AdapterInfo, BaseAdapter

DECODING = "diffusion_gemma_entropy_bound"


class _StepRecorder:
    """A draft-compatible streamer recording denoising steps per canvas and their wall times."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.wall_ms: list[float] = []
        self._puts = 0
        self._last = time.perf_counter()

    def put(self, value: Any) -> None:
        self._puts += 1
        if self._puts == 1:  # the prompt
            self._last = time.perf_counter()
            self.steps.append(0)
        else:  # a canvas is finished; the next one starts
            self.steps.append(0)

    def put_draft(self, value: Any = None, logits: Any = None) -> None:
        now = time.perf_counter()
        self.wall_ms.append((now - self._last) * 1e3)
        self._last = now
        self.steps[-1] += 1

    def end(self) -> None:
        while self.steps and self.steps[-1] == 0:  # the slot opened after the last canvas
            self.steps.pop()


class DiffusionGemmaAdapter(BaseAdapter):
    """Traces ``DiffusionGemmaForBlockDiffusion.generate`` request by request."""

    native_loop = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str,
        revision: str | None = None,
        max_denoising_steps: int | None = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        cfg, tc = model.config, model.config.text_config
        self.canvas_length = int(cfg.canvas_length)
        defaults = model.generation_config._get_default_generation_params()
        gc = model.generation_config
        self.max_denoising_steps = int(
            max_denoising_steps or gc.max_denoising_steps or defaults["max_denoising_steps"]
        )
        if self.max_denoising_steps < 1:
            raise ConfigError(f"max_denoising_steps must be >= 1, got {self.max_denoising_steps}")
        self.gen_params = {
            k: (getattr(gc, k, None) if getattr(gc, k, None) is not None else defaults[k])
            for k in ("t_min", "t_max", "stability_threshold", "confidence_threshold")
        }
        self.default_entropy_bound = float(
            (gc.sampler_config or defaults["sampler_config"]).entropy_bound
        )
        eos = gc.eos_token_id if gc.eos_token_id is not None else tc.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)
        self.pad_token_id = gc.pad_token_id if gc.pad_token_id is not None else tc.pad_token_id
        template = getattr(tokenizer, "chat_template", None)
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self.featurizer = PromptFeaturizer(
            tokenizer.backend_tokenizer, template, template_kwargs=special
        )
        dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.info = AdapterInfo(
            model_id=model_id,
            revision=revision,
            dtype=str(dtype).removeprefix("torch."),
            hidden_size=int(tc.hidden_size),
            vocab_size=int(tc.vocab_size),
            mask_token_id=None,
            eos_token_ids=eos_ids,
            max_context=int(tc.max_position_embeddings),
            native_block_size=self.canvas_length,
            decoding=DECODING,
            tokenizer_hash=text_hash(tokenizer.backend_tokenizer.to_str()),
            chat_template_hash=text_hash(template) if template else None,
            extra={"max_denoising_steps": self.max_denoising_steps, **self.gen_params},
            # the encoder reads the whole context in its own pass and every canvas starts right
            # after it, offline and in SGLang alike (Gemma4Renoise sets
            # requires_separate_context_encoding: its block offset is the prompt's length)
            block_alignments=(RESPONSE,),
        )

    def resolve_block_size(self, block_size: int | None) -> int:
        if block_size is not None and block_size != self.canvas_length:
            raise ConfigError(
                f"DiffusionGemma decodes canvases of {self.canvas_length} tokens (config "
                f"canvas_length); --block-size {block_size} cannot change that: drop --block-size"
            )
        return self.canvas_length

    def max_steps_per_block(self) -> int:
        """``S``: a canvas takes at most ``max_denoising_steps`` steps (it renoises, so it
        may take more steps than it has tokens)."""
        return self.max_denoising_steps

    def decoding_threshold(self, threshold: float | None) -> float:
        """DiffusionGemma's acceptance parameter is the sampler's entropy bound (> 0)."""
        if threshold is None:
            return self.default_entropy_bound
        if not threshold > 0:
            raise ConfigError(
                f"DiffusionGemma's threshold is its entropy bound and must be > 0, got {threshold}"
            )
        return float(threshold)

    def decoder_mask_id(self) -> int:
        """The token a mask-predict decoder starts each canvas from: the tokenizer's mask token."""
        mask = getattr(self.tokenizer, "mask_token_id", None)
        if mask is None:
            raise ConfigError(
                f"{self.info.model_id}'s tokenizer has no mask token, so it can "
                f"only be traced with its own sampler ({DECODING}); drop --decoding"
            )
        return int(mask)

    def generate_decoded(
        self, prompt_ids: list[int], *, decoder: Decoder, max_new_tokens: int, request_id: str = ""
    ) -> RequestResult:
        """Trace one request with an engine decoder (LowConfidence or JointThreshold) instead of
        the model's own sampler: greedy, so no seed is needed."""
        return _DecoderLoop(self, decoder, self.decoder_mask_id()).run(
            prompt_ids, max_new_tokens, request_id
        )

    def generate_traced(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        threshold: float,
        seed: int,
        request_id: str = "",
    ) -> RequestResult:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            EntropyBoundSamplerConfig,
        )

        recorder = _StepRecorder()
        captured: list[torch.Tensor] = []

        def keep_first(_module: Any, _inputs: Any, output: torch.Tensor) -> None:
            if not captured:
                captured.append(output.detach()[0].float().mean(dim=0).cpu())

        handle = self.model.model.decoder.norm.register_forward_hook(keep_first)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        gen_config = copy.deepcopy(self.model.generation_config)
        try:
            with (
                torch.inference_mode(),
                torch.random.fork_rng(devices=[] if self.device.type == "cpu" else None),
            ):
                torch.manual_seed(seed)
                out = self.model.generate(
                    input_ids,
                    streamer=recorder,
                    generation_config=gen_config,
                    max_new_tokens=max_new_tokens,
                    max_denoising_steps=self.max_denoising_steps,
                    sampler_config=EntropyBoundSamplerConfig(entropy_bound=float(threshold)),
                    eos_token_id=list(self.info.eos_token_ids),
                    pad_token_id=self.pad_token_id,
                    disable_compile=True,
                    **self.gen_params,
                )
        finally:
            handle.remove()
        recorder.end()
        seq = out.sequences if hasattr(out, "sequences") else out
        # whole canvases are decoded; tokens past the budget are not part of the record
        output = [int(t) for t in seq[0, len(prompt_ids) :].tolist()][:max_new_tokens]
        eos = set(self.info.eos_token_ids)
        finished_eos = any(t in eos for t in output)
        if not recorder.steps or any(s < 1 for s in recorder.steps):
            raise ModelError(
                f"request {request_id!r}: DiffusionGemma's loop reported no denoising steps "
                "(streamer put_draft not called); this transformers version is not supported"
            )
        n = len(prompt_ids)
        return RequestResult(
            request_id=request_id,
            prompt_tokens=n,
            prompt_blocks=max(1, -(-n // self.canvas_length)),
            output_ids=output,
            rounds_per_block=list(recorder.steps),
            finished_eos=finished_eos,
            hit_budget=not finished_eos,
            first_round_hidden=captured[0].numpy().astype(np.float32) if captured else None,
            round_wall_ms=list(recorder.wall_ms),
        )


class _DecoderLoop:
    """DiffusionGemma's encoder and decoder driven by one of the engine's mask-predict decoders.

    The same outer loop as ``generate`` (encode the prompt, then per canvas: denoise with the
    decoder over the encoder's cache, append, encode the canvas), but each canvas starts fully
    masked and the :class:`~dwise_predict.tracing.decoders.Decoder` decides every step, with
    plain logits (no temperature schedule, no sampling). So LowConfidence and JointThreshold
    rounds per block can be compared on an encoder-decoder block-diffusion model too.
    """

    def __init__(self, adapter: DiffusionGemmaAdapter, decoder: Decoder, mask_id: int) -> None:
        self.adapter, self.decoder, self.mask_id = adapter, decoder, mask_id

    def run(self, prompt_ids: list[int], max_new_tokens: int, request_id: str) -> RequestResult:
        a, model = self.adapter, self.adapter.model
        length, eos = a.canvas_length, set(a.info.eos_token_ids)
        n_canvases = -(-max_new_tokens // length)
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=a.device)
        cur = len(prompt_ids)
        cache = model._prepare_cache_for_generation(
            copy.deepcopy(model.generation_config), 1, cur + n_canvases * length
        )
        attention = torch.ones((1, cur), dtype=torch.bool, device=a.device)
        enc_pos = torch.arange(0, cur, dtype=torch.int32, device=a.device)[None]
        dec_pos = torch.arange(cur, cur + length, dtype=torch.int32, device=a.device)[None]
        dec_attention = torch.nn.functional.pad(attention, (0, length), value=True)
        rounds: list[int] = []
        walls: list[float] = []
        hidden: list[torch.Tensor] = []
        output: list[int] = []

        def keep_first(_module: Any, _inputs: Any, out: torch.Tensor) -> None:
            if not hidden:
                hidden.append(out.detach()[0].float().mean(dim=0).cpu())

        handle = model.model.decoder.norm.register_forward_hook(keep_first)
        try:
            with torch.inference_mode():
                for c in range(n_canvases):
                    t0 = time.perf_counter()
                    ids, enc_mask = model._prepare_encoder_inputs(
                        input_ids=input_ids,
                        attention_mask=attention,
                        encoder_position_ids=enc_pos,
                        cache=cache,
                        is_prefill=c == 0,
                        canvas_length=length,
                        batch_size=1,
                    )
                    cache = model.model.encoder(
                        input_ids=ids, attention_mask=enc_mask, cache=cache, position_ids=enc_pos
                    ).cache
                    canvas = self._denoise(model, cache, dec_attention, dec_pos, rounds, walls, t0)
                    output.extend(canvas[0].tolist())
                    input_ids = torch.cat([input_ids, canvas], dim=-1)
                    if any(t in eos for t in canvas[0].tolist()):
                        break
                    nxt = model._prepare_kwargs_for_next_canvas(
                        attention_mask=attention,
                        decoder_attention_mask=dec_attention,
                        decoder_position_ids=dec_pos,
                        canvas_length=length,
                        cur_len=cur,
                    )
                    cur, dec_attention, attention, enc_pos, dec_pos = nxt
        finally:
            handle.remove()
        output = output[:max_new_tokens]
        finished_eos = any(t in eos for t in output)
        return RequestResult(
            request_id=request_id,
            prompt_tokens=len(prompt_ids),
            prompt_blocks=max(1, -(-len(prompt_ids) // length)),
            output_ids=output,
            rounds_per_block=rounds,
            finished_eos=finished_eos,
            hit_budget=not finished_eos,
            first_round_hidden=hidden[0].numpy().astype(np.float32) if hidden else None,
            round_wall_ms=walls,
        )

    def _denoise(
        self,
        model: Any,
        cache: Any,
        dec_attention: torch.Tensor,
        dec_pos: torch.Tensor,
        rounds: list[int],
        walls: list[float],
        t0: float,
    ) -> torch.Tensor:
        """One canvas, from all masks to the decoder's finish; appends its steps and times."""
        canvas = torch.full(
            (1, self.adapter.canvas_length),
            self.mask_id,
            dtype=torch.long,
            device=self.adapter.device,
        )
        mask_mapping = model.model.decoder.create_diffusion_decoder_attention_mask(
            config=model.config,
            inputs_embeds=canvas.unsqueeze(-1),
            cache=cache,
            decoder_attention_mask=dec_attention,
        )
        self_conditioning = None
        post_edit, steps, done = 0, 0, False
        while not done:
            out = model(
                decoder_input_ids=canvas,
                self_conditioning_logits=self_conditioning,
                decoder_attention_mask=mask_mapping,
                cache=cache,
                decoder_position_ids=dec_pos,
            )
            block, post_edit, done = self.decoder.step(
                out.logits[0], canvas[0].cpu(), post_edit, self.mask_id
            )
            canvas = block[None].to(self.adapter.device)
            self_conditioning = out.logits.to(model.model.decoder.embed_tokens.weight.dtype)
            steps += 1
            now = time.perf_counter()
            walls.append((now - t0) * 1e3)
            t0 = now
        rounds.append(steps)
        return canvas


def load_diffusion_gemma(
    path: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    max_denoising_steps: int | None = None,
    **_: Any,
) -> DiffusionGemmaAdapter:
    """Load a DiffusionGemma checkpoint folder (model + tokenizer) as an adapter."""
    try:
        from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion
    except ImportError as e:  # pragma: no cover - depends on the installed transformers
        raise MissingDependencyError(
            "DiffusionGemma needs transformers >= 5.23: pip install -U transformers"
        ) from e
    path = Path(path)
    try:
        model = DiffusionGemmaForBlockDiffusion.from_pretrained(str(path), dtype=dtype)
        # transformers types PreTrainedModel.to through a decorator whose stub takes the model as
        # the argument
        model = model.to(device)  # type: ignore[arg-type]
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ModelError(
            f"cannot load DiffusionGemma from {path}: {e}; the folder needs config.json, the "
            "weights and a tokenizer"
        ) from e
    revision = None
    weights = sorted(path.glob("*.safetensors"))
    if weights:
        import hashlib

        h = hashlib.sha256()
        for w in weights:
            h.update(w.name.encode())
            h.update(str(w.stat().st_size).encode())
        revision = h.hexdigest()[:12]
    return DiffusionGemmaAdapter(
        model,
        tokenizer,
        model_id=f"diffusion-gemma:{path.name}",
        revision=revision,
        max_denoising_steps=max_denoising_steps,
    )
