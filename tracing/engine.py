"""Batched block-diffusion decoding (LowConfidence or JointThreshold), first-round hidden capture.

This is the decoding a DWISE server runs (docs/concepts.md), made exact and observable:

* **Layout** (``DecodeConfig.block_alignment``, docs/tracing.md). ``absolute`` is how SGLang's
  dLLM loop (and LLaDA2's reference generation) runs: blocks sit at absolute positions, the
  prompt's ``floor(L / block_size)`` whole blocks are prefilled, and the prompt's tail of
  ``L mod block_size`` tokens shares the first output block, which holds
  ``block_size - L mod block_size`` masks; every later output block starts at a multiple of
  ``block_size``. ``response`` prefills ``ceil(L / block_size)`` prompt blocks (the last may be
  short) and starts the first output block, fully masked, at position ``L``.
* **Prefill.** The prefilled part of the chat-templated prompt is split into blocks of
  ``block_size`` tokens from position 0; block ``c`` attends the blocks before it and itself
  bidirectionally, and its keys/values join the cache. A server runs one prompt block per
  round; the tracer computes up to ``prefill_chunk_tokens`` of them in one forward with the
  same block-causal mask — identical keys/values, 16x fewer forwards on a long prompt — and
  attributes that forward's time evenly to the prompt blocks it carried.
* **Denoising.** Each output block starts with its masks (after the prompt's tail, in the
  absolute layout's first block) and attends the whole clean cache plus itself
  bidirectionally; the prompt's tail is clean input the decoder never changes. Every round,
  per request, the decoder (:mod:`.decoders`) changes the block's masked part: LowConfidence
  unmasks the masked positions whose top-1 probability is at least ``threshold`` with their
  argmax token, and at least the single most confident one, so a block takes between 1 and
  its length rounds (``threshold <= 0``: everything in one round,
  ``threshold > 1``: one position per round). JointThreshold also re-writes decoded tokens
  and finishes a block on a step that changes nothing, so a block takes up to
  ``block_size + max_post_edit_steps + 1`` rounds (``DecodeConfig.max_steps_per_block``).
* **Commit.** A block is done when the decoder says so (LowConfidence: no mask left;
  JointThreshold: a step that changed nothing, or the edit budget spent); its clean tokens
  must join the cache with keys/values computed from clean inputs (like a prompt block). They
  ride in front of the request's next block in the next round's forward (the next block sees
  them, they do not see it), so committing costs no extra forward and is not a denoising
  round.
* **Stop.** A request is done when a finished block contains an end-of-sequence token, or
  when its output budget is spent (the last block is shortened to fit the budget exactly).

Requests are batched with continuous batching: ``batch_size`` seats (*slots*); a finished
request's seat goes to the next waiting request, whose prompt is prefilled before the next
denoising round. In each round every seated request advances its block by one denoising step. Rows
never see each other (the adapter masks per row), so a request's rounds, tokens and hidden vector do
not depend on the batch it ran in.

The **first-round hidden state** of a request is the mean, over the masked rows of its first
output block (the prompt's tail left out, as the SGLang plugin pools it), of the model's
final-layer hidden state in the first denoising round of that block, taken from the very
forward that produced that round's logits (no second pass).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from dwise_predict.errors import ConfigError, ModelError, WorkloadError
from dwise_predict.fingerprint import ABSOLUTE, RESPONSE, check_block_alignment
from dwise_predict.rounds import RoundsPerBlock
from dwise_predict.traces import prompt_blocks

from .adapters.base import BlockBatch, StepAdapter
from .decoders import (
    DEFAULT_EDIT_THRESHOLD,
    DEFAULT_MAX_POST_EDIT_STEPS,
    LOW_CONFIDENCE,
    Decoder,
    unmask_step,
)

__all__ = [
    "LOW_CONFIDENCE",
    "DecodeConfig",
    "DecodeRequest",
    "RequestResult",
    "decode",
    "unmask_step",
    "validate_requests",
]

#: prompt tokens computed per prefill forward (rounded down to whole blocks, at least one block)
PREFILL_CHUNK_TOKENS = 512
#: raised where the engine finds an empty slot it had just filled: a bug, never a user error
_LOST_SEAT = "decode engine bug: an active slot has no request or block; please report it"


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode: block size, decoder and its threshold(s), output budget (tokens), layout.

    ``threshold`` is LowConfidence's τ, or JointThreshold's mask-to-token threshold;
    ``edit_threshold`` and ``max_post_edit_steps`` are read by JointThreshold only.
    ``block_alignment`` is the block layout (module docstring): ``absolute`` or ``response``.
    """

    block_size: int
    threshold: float = 0.95
    max_new_tokens: int = 256
    decoding: str = LOW_CONFIDENCE
    edit_threshold: float = DEFAULT_EDIT_THRESHOLD
    max_post_edit_steps: int = DEFAULT_MAX_POST_EDIT_STEPS
    block_alignment: str = RESPONSE

    def __post_init__(self) -> None:
        check_block_alignment(self.block_alignment)
        if self.block_size < 1:
            raise ConfigError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not math.isfinite(self.threshold):
            raise ConfigError(f"threshold must be a finite number, got {self.threshold}")
        Decoder(
            self.decoding, self.threshold, self.edit_threshold, self.max_post_edit_steps
        )  # refuses an unknown decoding or bad parameters

    @property
    def decoder(self) -> Decoder:
        return Decoder(self.decoding, self.threshold, self.edit_threshold, self.max_post_edit_steps)

    def prefill_tokens(self, prompt_tokens: int) -> int:
        """How many leading prompt tokens are prefilled as whole blocks before denoising; the
        rest (absolute layout only) is the tail that shares the first output block."""
        if self.block_alignment == ABSOLUTE:
            return prompt_tokens // self.block_size * self.block_size
        return prompt_tokens

    @property
    def max_steps_per_block(self) -> int:
        """``S``: the most denoising rounds one output block can take under this decoder."""
        return self.decoder.max_steps(self.block_size)


@dataclass
class DecodeRequest:
    """One request to decode: an id and the exact prompt token ids (chat template applied)."""

    request_id: str
    prompt_ids: list[int]


@dataclass
class RequestResult(RoundsPerBlock):
    """What the dLLM did with one request."""

    request_id: str
    prompt_tokens: int
    prompt_blocks: int
    #: generated tokens, in order, up to the end of the last decoded block (EOS included)
    output_ids: list[int]
    rounds_per_block: list[int]
    finished_eos: bool
    hit_budget: bool
    #: mean final-layer hidden row of the first denoising round of the first output block
    first_round_hidden: np.ndarray | None
    #: wall time (ms) of every round this request took part in: prefill rounds, then denoising
    #: rounds
    round_wall_ms: list[float] = field(default_factory=list)
    #: with ``split_commit``: wall time (ms) of each finished block's own commit forward
    refresh_wall_ms: list[float] = field(default_factory=list)

    def content_ids(self, eos_ids: Iterable[int]) -> list[int]:
        """Output tokens before the first end-of-sequence token (the response proper)."""
        eos = set(eos_ids)
        for i, tok in enumerate(self.output_ids):
            if tok in eos:
                return self.output_ids[:i]
        return list(self.output_ids)


@dataclass
class _Seat:
    """Decoding state of one request in one slot."""

    req: DecodeRequest
    #: prompt tokens prefilled as whole blocks (the rest is the first output block's tail)
    prefill_end: int = 0
    prefilled: int = 0
    output: list[int] = field(default_factory=list)
    block: torch.Tensor | None = None  # current output block (mask where undecided)
    block_start: int = 0  # position of the block's first token (its prompt tail, if any)
    tail: list[int] = field(default_factory=list)  # prompt tokens in front of the block
    rounds: list[int] = field(default_factory=list)
    hidden: np.ndarray | None = None
    wall: list[float] = field(default_factory=list)
    refresh: list[float] = field(default_factory=list)
    finished_eos: bool = False
    pending: list[int] = field(
        default_factory=list
    )  # a finished block's clean tokens, committed next round
    pending_start: int = 0
    post_edit_steps: int = 0  # JointThreshold: steps of the current block that began with no mask

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_end


def validate_requests(
    requests: list[DecodeRequest], config: DecodeConfig, max_context: int
) -> None:
    """Refuse, before any decoding, requests that cannot be decoded (empty, over the context)."""
    seen: set[str] = set()
    for r in requests:
        if r.request_id in seen:
            raise WorkloadError(f"request id {r.request_id!r} appears twice; ids must be unique")
        seen.add(r.request_id)
        if not r.prompt_ids:
            raise WorkloadError(
                f"request {r.request_id!r} has an empty prompt; drop it from the workload"
            )
        need = len(r.prompt_ids) + config.max_new_tokens
        if need > max_context:
            raise WorkloadError(
                f"request {r.request_id!r}: prompt of {len(r.prompt_ids)} tokens + budget of "
                f"{config.max_new_tokens} = {need} exceeds the model's context of {max_context} "
                "tokens; shorten or drop the prompt, or lower --max-new-tokens"
            )


def decode(
    adapter: StepAdapter,
    requests: Iterable[DecodeRequest],
    config: DecodeConfig,
    *,
    batch_size: int = 8,
    on_round: Callable[[int, float], None] | None = None,
    split_commit: bool = False,
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[RequestResult]:
    """Decode ``requests`` with continuous batching; yield each result as its request finishes.

    ``on_round(n_rows, seconds)`` is called after every round (for progress bars).
    Deterministic: greedy tokens, first-index tie breaks, no sampling.
    ``split_commit=True`` (cost profiling) commits a finished block in a forward of its own,
    timed into ``refresh_wall_ms``, instead of folding it into the next round, so the KV
    refresh and the denoising steps are measured apart; the last block is committed too, so
    a request of n blocks has n refreshes, as the cost model prices them.
    ``clock`` (seconds) times every phase: ``time.thread_time`` measures the calling thread's
    CPU time, steadier than wall time on a shared machine when torch runs one thread.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    pending = list(requests)
    info = adapter.info
    validate_requests(pending, config, info.max_context)
    if not pending:
        return
    if info.mask_token_id is None:
        raise ConfigError(
            f"{info.model_id} has no mask token; it cannot be decoded by a "
            f"mask-predict decoder ({config.decoding})"
        )
    n_slots = min(batch_size, len(pending))
    capacity = max(len(r.prompt_ids) for r in pending) + config.max_new_tokens
    adapter.open_slots(n_slots, capacity)
    queue = deque(pending)
    seats: list[_Seat | None] = [None] * n_slots
    mask_id, eos = int(info.mask_token_id), set(info.eos_token_ids)
    chunk = max(config.block_size, PREFILL_CHUNK_TOKENS // config.block_size * config.block_size)
    with torch.inference_mode():
        while queue or any(s is not None for s in seats):
            for slot in range(n_slots):
                if seats[slot] is None and queue:
                    adapter.reset_slot(slot)
                    req = queue.popleft()
                    seats[slot] = _Seat(
                        req=req, prefill_end=config.prefill_tokens(len(req.prompt_ids))
                    )
            active = [i for i, s in enumerate(seats) if s is not None]
            prefilling = [i for i in active if seats[i].in_prefill]  # type: ignore[union-attr]
            while prefilling:
                _prefill(adapter, seats, prefilling, config, chunk, clock)
                prefilling = [i for i in prefilling if seats[i].in_prefill]  # type: ignore[union-attr]
            if split_commit:
                _commit(adapter, seats, active, clock)
            t0 = clock()
            done_blocks = _round(adapter, seats, active, config, mask_id)
            finished: list[int] = []
            for slot in done_blocks:
                seat = seats[slot]
                if seat is None or seat.block is None:
                    raise ModelError(_LOST_SEAT)
                tokens = seat.block.tolist()
                seat.output.extend(tokens)
                seat.block = None
                if any(t in eos for t in tokens):
                    seat.finished_eos = True
                    finished.append(slot)
                elif len(seat.output) >= config.max_new_tokens:
                    finished.append(slot)
                if slot not in finished or split_commit:
                    seat.pending, seat.pending_start = seat.tail + tokens, seat.block_start
                seat.tail = []
            wall = clock() - t0
            for slot in active:
                seats[slot].wall.append(wall * 1e3)  # type: ignore[union-attr]
            if on_round is not None:
                on_round(len(active), wall)
            if split_commit and finished:  # the last block's refresh, as the cost model prices it
                _commit(adapter, seats, finished, clock)
            for slot in finished:
                seat = seats[slot]
                if seat is None:
                    raise ModelError(_LOST_SEAT)
                seats[slot] = None
                yield _result(seat, config)


def _prefill(
    adapter: StepAdapter,
    seats: list[_Seat | None],
    slots: list[int],
    config: DecodeConfig,
    chunk: int,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """One forward carrying up to ``chunk`` prompt tokens (whole blocks) of each prefilling seat."""
    bs = config.block_size
    ids, pos, segs = [], [], []
    for slot in slots:
        seat = seats[slot]
        if seat is None:
            raise ModelError(_LOST_SEAT)
        start = seat.prefilled
        part = seat.req.prompt_ids[start : min(start + chunk, seat.prefill_end)]
        ids.append(part)
        pos.append(list(range(start, start + len(part))))
        segs.append([(start + j) // bs - start // bs for j in range(len(part))])
    batch = _pad(slots, ids, pos, [len(r) for r in ids], pad_id=0, segments=segs)
    t0 = clock()
    adapter.forward(batch)
    per_block = (clock() - t0) * 1e3 / max(segs[i][-1] + 1 for i in range(len(slots)))
    for row, slot in enumerate(slots):
        seat = seats[slot]
        if seat is None:
            raise ModelError(_LOST_SEAT)
        seat.prefilled += len(ids[row])
        seat.wall.extend([per_block] * (segs[row][-1] + 1))


def _commit(
    adapter: StepAdapter,
    seats: list[_Seat | None],
    active: list[int],
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """One forward that only writes finished blocks' clean tokens to the cache (KV refresh)."""
    ready = [(i, s) for i in active if (s := seats[i]) is not None and s.pending]
    if not ready:
        return
    ids = [s.pending for _, s in ready]
    pos = [list(range(s.pending_start, s.pending_start + len(s.pending))) for _, s in ready]
    batch = _pad([i for i, _ in ready], ids, pos, [len(r) for r in ids], pad_id=0)
    t0 = clock()
    adapter.forward(batch)
    ms = (clock() - t0) * 1e3
    for _, seat in ready:
        seat.refresh.append(ms)
        seat.pending = []


def _round(
    adapter: StepAdapter,
    seats: list[_Seat | None],
    active: list[int],
    config: DecodeConfig,
    mask_id: int,
) -> list[int]:
    """One denoising step on one block per active seat; returns the slots whose block just finished.

    A seat whose previous block finished last round carries that block's clean tokens in front
    of its new block (segment 0, committed to the cache); the new block is segment 1. In the
    absolute layout the first output block starts with the prompt's tail: clean tokens of the
    block's own segment, which the decoder never sees or changes.
    """
    bs = config.block_size
    rows_ids: list[list[int]] = []
    rows_pos: list[list[int]] = []
    rows_seg: list[list[int]] = []
    commit: list[int] = []
    for slot in active:
        seat = seats[slot]
        if seat is None:
            raise ModelError(_LOST_SEAT)
        if seat.block is None:  # start a new output block: its masks, cut to the budget
            if not seat.output:  # the first: after the prompt's tail (absolute layout)
                seat.tail = list(seat.req.prompt_ids[seat.prefill_end :])
                seat.block_start = seat.prefill_end
            else:
                seat.block_start = len(seat.req.prompt_ids) + len(seat.output)
            length = min(bs - len(seat.tail), config.max_new_tokens - len(seat.output))
            seat.block = torch.full((length,), mask_id, dtype=torch.long)
            seat.rounds.append(0)
            seat.post_edit_steps = 0
        c, n = len(seat.pending), len(seat.tail) + len(seat.block)
        rows_ids.append(seat.pending + seat.tail + seat.block.tolist())
        rows_pos.append(
            list(range(seat.pending_start, seat.pending_start + c))
            + list(range(seat.block_start, seat.block_start + n))
        )
        rows_seg.append([0] * c + [1 if c else 0] * n)
        commit.append(c)
    batch = _pad(
        active, rows_ids, rows_pos, commit, mask_id, segments=rows_seg if any(commit) else None
    )
    out = adapter.forward(batch)
    decoder = config.decoder
    done: list[int] = []
    for row, slot in enumerate(active):
        seat = seats[slot]
        if seat is None or seat.block is None:
            raise ModelError(_LOST_SEAT)
        c = commit[row] + len(seat.tail)  # the block's masked positions start here
        n = len(seat.block)
        seat.pending = []
        if seat.hidden is None and len(seat.rounds) == 1 and seat.rounds[0] == 0:
            seat.hidden = (
                out.hidden[row, c : c + n].float().mean(dim=0).cpu().numpy().astype(np.float32)
            )
        seat.block, seat.post_edit_steps, finished = decoder.step(
            out.logits[row, c : c + n], seat.block, seat.post_edit_steps, mask_id
        )
        seat.rounds[-1] += 1
        if finished:
            done.append(slot)
    return done


def _pad(
    slots: list[int],
    ids: list[list[int]],
    pos: list[list[int]],
    commit: list[int],
    pad_id: int,
    segments: list[list[int]] | None = None,
) -> BlockBatch:
    t = max(len(r) for r in ids)
    input_ids = torch.full((len(ids), t), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(ids), t), dtype=torch.long)
    seg = torch.zeros((len(ids), t), dtype=torch.long) if segments is not None else None
    for i, (r, p) in enumerate(zip(ids, pos)):
        input_ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        position_ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        if seg is not None and segments is not None:
            seg[i, : len(r)] = torch.tensor(segments[i], dtype=torch.long)
    return BlockBatch(
        slots=list(slots),
        input_ids=input_ids,
        position_ids=position_ids,
        n_valid=[len(r) for r in ids],
        commit=list(commit),
        segments=seg,
    )


def _result(seat: _Seat, config: DecodeConfig) -> RequestResult:
    return RequestResult(
        request_id=seat.req.request_id,
        prompt_tokens=len(seat.req.prompt_ids),
        prompt_blocks=prompt_blocks(
            len(seat.req.prompt_ids), config.block_size, config.block_alignment
        ),
        output_ids=list(seat.output),
        rounds_per_block=list(seat.rounds),
        finished_eos=seat.finished_eos,
        hit_budget=not seat.finished_eos and len(seat.output) >= config.max_new_tokens,
        first_round_hidden=seat.hidden,
        round_wall_ms=list(seat.wall),
        refresh_wall_ms=list(seat.refresh),
    )
