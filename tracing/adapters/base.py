"""The small protocol every dLLM adapter implements, so one engine traces any block-diffusion model.

Two kinds of models exist, and so two kinds of adapters:

* **Step adapters** (:class:`StepAdapter`: tiny-bd, Hugging Face mask-predict models) expose one
  forward over one block per request, with a cache of committed (clean) tokens. The engine in
  :mod:`dwise_predict.tracing.engine` owns the decoding algorithm (LowConfidence unmasking) and
  calls :meth:`StepAdapter.forward` once per round; the adapter owns the cache layout.
* **Native-loop adapters** (:class:`NativeLoopAdapter`: DiffusionGemma) decode with their own
  sampler and stopping rule. Re-implementing that loop would trace a different algorithm, so
  the adapter runs the model's real ``generate`` and observes it through its per-step hook.

Both describe themselves with an :class:`AdapterInfo` (what goes into the fingerprint) and turn
a raw prompt into the exact token ids the model sees (:meth:`BaseAdapter.encode_prompt`), using
the same :class:`~dwise_predict.features.PromptFeaturizer` the admission predictor uses at serve
time, so the traced ``prompt_tokens`` is the number a scheduler will compute from raw text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from dwise_predict.errors import ConfigError
from dwise_predict.features import PromptFeaturizer
from dwise_predict.fingerprint import (
    ABSOLUTE,
    BLOCK_ALIGNMENTS,
    ModelFingerprint,
    check_block_alignment,
    text_hash,
)

if TYPE_CHECKING:  # torch is only needed by the implementations
    import torch

    from ..decoders import Decoder
    from ..engine import RequestResult


@dataclass(frozen=True)
class AdapterInfo:
    """Identity and decoding-relevant facts of a loaded dLLM."""

    model_id: str
    revision: str | None
    dtype: str
    hidden_size: int
    vocab_size: int
    mask_token_id: int | None
    eos_token_ids: tuple[int, ...]
    max_context: int
    #: the block size the model was built/trained for (None: any block size works)
    native_block_size: int | None = None
    #: the model's own decoding, recorded in traces (step adapters: the engine's, chosen per run)
    decoding: str = "low_confidence"
    tokenizer_hash: str | None = None
    chat_template_hash: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: the block layouts this adapter can trace (docs/tracing.md), the first being how the
    #: model is served and so the default: engine-driven mask-predict models can run either
    #: and are served by SGLang's dLLM loop at absolute positions; a model that encodes its
    #: context in a separate pass runs its blocks response-aligned only
    block_alignments: tuple[str, ...] = (ABSOLUTE, *(a for a in BLOCK_ALIGNMENTS if a != ABSOLUTE))


@dataclass
class BlockBatch:
    """One forward's input: a run of tokens per selected request slot.

    ``input_ids``/``position_ids`` are ``[n, T]`` (rows right-padded to ``T``); ``n_valid[i]``
    is how many of row ``i``'s tokens are real. A row is a sequence of *segments*
    (``segments[i, j]``, non-decreasing, 0-based; None = one segment per row): a token attends
    the slot's cache, every token of its own segment (bidirectionally) and the earlier
    segments, never a later one. That is block-causal attention, so a row can carry several
    prompt blocks at once, or a finished block followed by the next, still-masked block.

    ``commit[i]`` is how many of row ``i``'s leading tokens are clean (prompt blocks, or a
    finished output block) and must join the slot's cache after this forward; the rest (a
    denoising block with masks) only reads the cache.
    """

    slots: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    n_valid: list[int]
    commit: list[int]
    segments: torch.Tensor | None = None


@dataclass
class BlockOutput:
    """Logits ``[n, T, V]`` and the final-layer hidden rows ``[n, T, D]`` of the same forward."""

    logits: torch.Tensor
    hidden: torch.Tensor


class BaseAdapter:
    """What every adapter offers: identity, tokenizer, chat template, prompt encoding."""

    info: AdapterInfo
    featurizer: PromptFeaturizer

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of the chat-templated prompt: exactly what the model is fed.

        Uses the featurizer's rendering and tokenizer, so ``len(ids)`` equals the admission
        feature ``prompt_tokens`` a scheduler computes from the same raw text.
        """
        f = self.featurizer
        return list(
            f.tokenizer.encode(f.render(prompt), add_special_tokens=f.add_special_tokens).ids
        )

    def decode(self, ids: list[int]) -> str:
        return str(self.featurizer.tokenizer.decode(ids, skip_special_tokens=True))

    def fingerprint(
        self,
        *,
        block_size: int,
        threshold: float,
        max_new_tokens: int,
        extra: dict[str, Any] | None = None,
        decoding: str | None = None,
        max_steps_per_block: int | None = None,
        block_alignment: str | None = None,
    ) -> ModelFingerprint:
        """The fingerprint of traces this adapter makes (``decoding`` defaults to the model's,
        ``block_alignment`` to how the model is served)."""
        i = self.info
        return ModelFingerprint(
            model_id=i.model_id,
            block_size=block_size,
            threshold=float(threshold),
            decoding=decoding or i.decoding,
            mask_token_id=i.mask_token_id,
            hidden_size=i.hidden_size,
            max_steps_per_block=max_steps_per_block,
            max_new_tokens=max_new_tokens,
            revision=i.revision,
            dtype=i.dtype,
            tokenizer_hash=i.tokenizer_hash or text_hash(self.featurizer.tokenizer.to_str()),
            chat_template_hash=i.chat_template_hash or self.featurizer.chat_template_hash,
            extra={**i.extra, **(extra or {})},
            block_alignment=self.resolve_block_alignment(block_alignment),
        )

    def resolve_block_alignment(self, block_alignment: str | None) -> str:
        """The block layout to trace in: how the model is served unless overridden (and the
        model can run the other one)."""
        allowed = self.info.block_alignments
        if block_alignment is None:
            return allowed[0]
        check_block_alignment(block_alignment)
        if block_alignment not in allowed:
            raise ConfigError(
                f"{self.info.model_id} runs its blocks {' or '.join(allowed)}-aligned only (it "
                f"is served that way), so it cannot be traced with --block-alignment "
                f"{block_alignment}; drop the flag"
            )
        return block_alignment

    def resolve_block_size(self, block_size: int | None) -> int:
        """The block size to decode with: the model's own unless overridden (and allowed)."""
        native = self.info.native_block_size
        if block_size is None:
            if native is None:
                raise ConfigError(
                    f"{self.info.model_id} has no native block size; pass --block-size N"
                )
            return native
        if block_size < 1:
            raise ConfigError(f"block size must be >= 1, got {block_size}")
        return int(block_size)


class TracedModel(Protocol):
    """What the tracer asks of every model, whoever runs its generation loop: its identity and
    featurizer, its tokenizer, and the fingerprint and block layout its traces record."""

    info: AdapterInfo
    featurizer: PromptFeaturizer

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def fingerprint(
        self,
        *,
        block_size: int,
        threshold: float,
        max_new_tokens: int,
        extra: dict[str, Any] | None = None,
        decoding: str | None = None,
        max_steps_per_block: int | None = None,
        block_alignment: str | None = None,
    ) -> ModelFingerprint: ...

    def resolve_block_size(self, block_size: int | None) -> int: ...

    def resolve_block_alignment(self, block_alignment: str | None) -> str: ...


@runtime_checkable
class StepAdapter(TracedModel, Protocol):
    """A model the engine drives one block per request per round (mask-predict dLLMs).

    The adapter keeps one cache per *slot* (a seat in the running batch); the engine assigns
    requests to slots, resets a slot when a new request takes it, and never reads the cache.
    """

    def open_slots(self, n_slots: int, capacity: int) -> None:
        """Allocate caches for ``n_slots`` requests of at most ``capacity`` tokens each."""

    def reset_slot(self, slot: int) -> None:
        """Empty a slot's cache (a new request takes the seat)."""

    def forward(self, batch: BlockBatch) -> BlockOutput:
        """One forward: each row attends its slot's cache and itself bidirectionally."""


@runtime_checkable
class NativeLoopAdapter(TracedModel, Protocol):
    """A model whose own generation loop is traced (it has its own sampler and stopping rule)."""

    native_loop: bool

    def decoding_threshold(self, threshold: float | None) -> float:
        """The threshold recorded in traces (the model's own acceptance parameter)."""

    def max_steps_per_block(self) -> int:
        """``S``: the most denoising steps the model's own loop spends on one block."""

    def generate_traced(
        self,
        prompt_ids: list[int],
        *,
        max_new_tokens: int,
        threshold: float,
        seed: int,
        request_id: str = "",
    ) -> RequestResult:
        """Run the model's real generation for one request and return what it did."""


@runtime_checkable
class DecoderDrivenAdapter(NativeLoopAdapter, Protocol):
    """A native-loop model that can also be decoded greedily by an engine decoder (to compare
    its own sampler with LowConfidence or JointThreshold on the same prompts)."""

    def decoder_mask_id(self) -> int:
        """The token each canvas starts from: the tokenizer's mask token."""

    def generate_decoded(
        self, prompt_ids: list[int], *, decoder: Decoder, max_new_tokens: int, request_id: str = ""
    ) -> RequestResult:
        """Decode one request with ``decoder`` instead of the model's own sampler."""
