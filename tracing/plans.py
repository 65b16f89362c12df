"""How a tracing run decodes, chosen once per adapter kind: one small function per kind.

A model is traced in one of three ways, and each fixes a different fingerprint:

* a **step adapter** (tiny-bd, Hugging Face mask-predict) is driven by the engine's decoder
  (:func:`plan_step`), with continuous batching over ``batch_size`` seats;
* a **native-loop adapter** (DiffusionGemma) runs its own sampler (:func:`plan_native`): the
  threshold and per-block step limit recorded are the model's, and each request gets its own
  seed, so sampling does not depend on batch or resume;
* a native-loop adapter that also takes an engine decoder
  (:class:`~.adapters.base.DecoderDrivenAdapter`) decodes greedily with it
  (:func:`plan_native_decoder`): the comparison of one model under two decoders.

:func:`plan_decoding` picks the kind and refuses a combination the model cannot run, before
anything is loaded or written. :func:`~.runner.trace_workload` then only writes rows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeGuard

from dwise_predict.errors import ConfigError
from dwise_predict.fingerprint import ModelFingerprint

from .adapters.base import DecoderDrivenAdapter, NativeLoopAdapter, StepAdapter
from .decoders import (
    DEFAULT_EDIT_THRESHOLD,
    DEFAULT_MAX_POST_EDIT_STEPS,
    DEFAULT_THRESHOLDS,
    LOW_CONFIDENCE,
)
from .engine import DecodeConfig, DecodeRequest, RequestResult, decode

#: any adapter the tracer accepts
Adapter = StepAdapter | NativeLoopAdapter

#: called once per engine round with the number of rows it carried and its seconds
OnRound = Callable[[int, float], None]

#: a plan's request loop: one result per request; closing it early frees seats and caches
RequestLoop = Generator[RequestResult, None, None]


@dataclass(frozen=True)
class DecodeSettings:
    """The decoding flags of one ``dwise-predict trace`` run, as the user gave them."""

    max_new_tokens: int
    threshold: float | None = None
    block_size: int | None = None
    block_alignment: str | None = None
    decoding: str | None = None
    edit_threshold: float = DEFAULT_EDIT_THRESHOLD
    max_post_edit_steps: int = DEFAULT_MAX_POST_EDIT_STEPS
    batch_size: int = 8
    seed: int = 0


@dataclass(frozen=True)
class DecodePlan:
    """What a run decodes with: the engine config, the fingerprint its traces carry, and the
    request loop (``run(requests, on_round)`` yields one result per request, in any order)."""

    config: DecodeConfig
    fingerprint: ModelFingerprint
    run: Callable[[list[DecodeRequest], OnRound], RequestLoop]
    #: True where ``run`` does not call ``on_round`` (a model's own loop): the runner counts
    #: each result's rounds instead
    counts_rounds_per_result: bool


def is_native(adapter: Adapter) -> TypeGuard[NativeLoopAdapter]:
    """Whether the adapter decodes with its own loop (rather than being driven per round)."""
    return bool(getattr(adapter, "native_loop", False))


def request_seed(seed: int, request_id: str) -> int:
    """Per-request seed for sampling models: independent of batch, order and resume."""
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def plan_decoding(adapter: Adapter, settings: DecodeSettings) -> DecodePlan:
    """The plan for ``adapter`` under ``settings``, refusing what the model cannot run."""
    if is_native(adapter):
        if settings.decoding in (None, adapter.info.decoding):
            return plan_native(adapter, settings)
        if not isinstance(adapter, DecoderDrivenAdapter):
            raise ConfigError(
                f"{adapter.info.model_id} decodes with its own sampler "
                f"({adapter.info.decoding}); drop --decoding {settings.decoding}"
            )
        return plan_native_decoder(adapter, settings)
    if not isinstance(adapter, StepAdapter):
        raise ConfigError(
            f"{type(adapter).__name__} is neither a step adapter (open_slots, reset_slot, "
            "forward) nor a native-loop one (native_loop = True, generate_traced); implement "
            "one of the two protocols of dwise_predict.tracing.adapters.base"
        )
    return plan_step(adapter, settings)


def plan_step(adapter: StepAdapter, s: DecodeSettings) -> DecodePlan:
    """The engine drives the model one block per request per round, with continuous batching."""
    config = _engine_config(adapter.resolve_block_size(s.block_size), s, adapter)

    def run(todo: list[DecodeRequest], on_round: OnRound) -> RequestLoop:
        yield from decode(adapter, todo, config, batch_size=s.batch_size, on_round=on_round)

    return DecodePlan(
        config, _engine_fingerprint(adapter, config), run, counts_rounds_per_result=False
    )


def plan_native(adapter: NativeLoopAdapter, s: DecodeSettings) -> DecodePlan:
    """The model's own generation, sampled with a per-request seed."""
    thr = float(adapter.decoding_threshold(s.threshold))
    config = DecodeConfig(
        block_size=adapter.resolve_block_size(s.block_size),
        threshold=thr,
        max_new_tokens=s.max_new_tokens,
        block_alignment=adapter.resolve_block_alignment(s.block_alignment),
    )
    fingerprint = adapter.fingerprint(
        block_size=config.block_size,
        threshold=thr,
        max_new_tokens=s.max_new_tokens,
        max_steps_per_block=adapter.max_steps_per_block(),
        block_alignment=config.block_alignment,
    )

    def run(todo: list[DecodeRequest], _on_round: OnRound) -> RequestLoop:
        for q in todo:
            yield adapter.generate_traced(
                q.prompt_ids,
                max_new_tokens=s.max_new_tokens,
                threshold=thr,
                seed=request_seed(s.seed, q.request_id),
                request_id=q.request_id,
            )

    return DecodePlan(config, fingerprint, run, counts_rounds_per_result=True)


def plan_native_decoder(adapter: DecoderDrivenAdapter, s: DecodeSettings) -> DecodePlan:
    """A native-loop model decoded greedily by an engine decoder, one request at a time."""
    config = _engine_config(adapter.resolve_block_size(s.block_size), s, adapter)
    # the canvases start from the tokenizer's mask, not the model's own noise
    fingerprint = _engine_fingerprint(
        adapter, config, {"decoder_mask_token_id": adapter.decoder_mask_id()}
    )

    def run(todo: list[DecodeRequest], _on_round: OnRound) -> RequestLoop:
        for q in todo:
            yield adapter.generate_decoded(
                q.prompt_ids,
                decoder=config.decoder,
                max_new_tokens=s.max_new_tokens,
                request_id=q.request_id,
            )

    return DecodePlan(config, fingerprint, run, counts_rounds_per_result=True)


def _engine_config(block_size: int, s: DecodeSettings, adapter: Adapter) -> DecodeConfig:
    name = s.decoding or LOW_CONFIDENCE
    if name not in DEFAULT_THRESHOLDS:
        raise ConfigError(
            f"unknown decoding {name!r}; choose one of {', '.join(DEFAULT_THRESHOLDS)}"
        )
    return DecodeConfig(
        block_size=block_size,
        threshold=DEFAULT_THRESHOLDS[name] if s.threshold is None else float(s.threshold),
        max_new_tokens=s.max_new_tokens,
        decoding=name,
        edit_threshold=s.edit_threshold,
        max_post_edit_steps=s.max_post_edit_steps,
        block_alignment=adapter.resolve_block_alignment(s.block_alignment),
    )


def _engine_fingerprint(
    adapter: Adapter, config: DecodeConfig, extra: dict[str, Any] | None = None
) -> ModelFingerprint:
    """The fingerprint of traces an engine decoder makes: its parameters and bound S."""
    return adapter.fingerprint(
        block_size=config.block_size,
        threshold=config.threshold,
        max_new_tokens=config.max_new_tokens,
        decoding=config.decoding,
        extra={**config.decoder.params(), **(extra or {})},
        max_steps_per_block=config.max_steps_per_block,
        block_alignment=config.block_alignment,
    )


__all__ = [
    "Adapter",
    "DecodePlan",
    "DecodeSettings",
    "is_native",
    "plan_decoding",
    "plan_native",
    "plan_native_decoder",
    "plan_step",
    "request_seed",
]
