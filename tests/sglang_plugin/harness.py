"""tiny-bd served by SGLang 0.5.23's real dLLM scheduler classes, on CPU, without a server.

SGLang's model runner needs a GPU, so this module swaps only it: :class:`TinyBDRunner`
computes each request's logits with tiny-bd from the request's full token context (its
committed tokens up to the block, then the block itself), so LowConfidence sees real
confidences. Everything else is SGLang's own: ``Scheduler`` (built the way SGLang's CPU unit
tests build it: ``Scheduler.__new__`` plus the attributes its dLLM methods read), ``Req``,
``DllmManager``, ``PrefillAdder``, ``ScheduleBatch``, ``ReqToTokenPool``, the token-to-KV
allocator, ``RadixCache`` (disabled), ``LowConfidence``, ``TpModelWorker``'s dLLM forward,
``process_batch_result_dllm`` and the plugin framework (``load_plugins``, ``HookRegistry``).

The runner is batch-independent (one forward per request, the committed prefix's keys and
values cached per request: they are a function of those tokens only, because tiny-bd is
block-causal), so a request's output tokens cannot depend on which round or batch it ran in.
That is what lets a test compare stock and plugin outputs token for token.

Used by ``tests/sglang_plugin/`` and ``benchmarks/sglang_scheduler.py``; it is test
equipment, so it lives with the tests and ships in no wheel. Needs the ``.venv-sglang``
environment (``make test-sglang``).
"""

from __future__ import annotations

import os
import time
from array import array
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from dwise_predict.tracing.adapters.tiny_bd import tiny_bd_model_id
from dwise_predict.zoo.tiny_bd.generate import _extend
from dwise_predict.zoo.tiny_bd.io import from_pretrained
from dwise_predict.zoo.tiny_bd.model import KV
from dwise_predict.zoo.tiny_bd.tokenizer import EOS, MASK


def install_torchvision_shim() -> None:
    """Define the two operators the CUDA torchvision wheel registers fakes for at import.

    torchvision 0.28.0 on the package index is a CUDA build; its ``_meta_registrations`` calls
    ``register_fake("torchvision::nms")`` at import, which fails on a CPU torch where the op
    was never defined. SGLang imports torchvision, so CPU runs define the ops first.
    """
    if (
        torch.library._get_schema_if_exists("torchvision::nms")
        if hasattr(torch.library, "_get_schema_if_exists")
        else _has_op("nms")
    ):
        return
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)  # a Library deregisters its ops when collected


_KEEP: list[Any] = []


def _has_op(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


class TinyBDRunner:
    """A model runner whose logits are tiny-bd's, per request, from its full token context."""

    def __init__(
        self, block_size: int = 32, checkpoint: str = "tiny-bd", memo: bool = False
    ) -> None:
        # one thread: the per-request forwards are tiny, and a shared CPU thrashes with more
        torch.set_num_threads(1)
        #: with ``memo``, each request's block forward is computed once and reused by later
        #: serving runs of the same requests (a benchmark's many policies): its output is a
        #: function of the request, the block's position and its current tokens only
        self.memo: dict[tuple[Any, int, bytes], torch.Tensor] | None = {} if memo else None
        tb = from_pretrained(checkpoint)
        #: the name SGLang serves the model under (its --model-path), as tracing names it, so
        #: a bundle trained on a checkpoint's traces passes the plugin's fingerprint check
        self.model_id = tiny_bd_model_id(checkpoint)
        self.model = tb.model.eval()
        self.tokenizer = tb.tokenizer
        self.chat_template = tb.chat_template
        self.block_size = block_size
        self.reqs: Sequence[Any] = ()
        self._cache: dict[Any, tuple[list[int], KV | None]] = {}
        self.forwards = 0

    def _prefix_kv(self, rid: Any, ctx: list[int]) -> KV | None:
        """Keys/values of the committed tokens ``ctx``, extended block by block and cached."""
        toks, kv = self._cache.get(rid, ([], None))
        if toks != ctx[: len(toks)]:
            toks, kv = [], None
        bs = self.block_size
        for start in range(len(toks), len(ctx), bs):
            chunk = torch.as_tensor(ctx[start : start + bs], dtype=torch.long)[None]
            pos = torch.arange(start, start + chunk.shape[1])[None]
            kv = _extend(kv, self.model(chunk, pos, None, kv).kv)
        self._cache[rid] = (list(ctx), kv)
        return kv

    def forget(self, rid: Any) -> None:
        self._cache.pop(rid, None)

    @torch.inference_mode()
    def forward(self, forward_batch: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessor

        bs = self.block_size
        n = forward_batch.batch_size
        ids = forward_batch.input_ids.view(n, bs)
        hidden = []
        for i, req in enumerate(self.reqs):
            start = int(req.dllm_block_offset)
            key = (req.rid, start, ids[i].numpy().tobytes()) if self.memo is not None else None
            if key is not None and key in self.memo:  # type: ignore[operator]
                hidden.append(self.memo[key])  # type: ignore[index]
                continue
            committed = list(req.origin_input_ids) + list(req.output_ids)
            ctx = committed[:start]
            kv = self._prefix_kv(req.rid, ctx)
            pos = torch.arange(start, start + bs)[None]
            out = self.model(ids[i : i + 1].long(), pos, None, kv)
            hidden.append(out.hidden[0])
            if key is not None:
                self.memo[key] = out.hidden[0].clone()  # type: ignore[index]
        self.forwards += 1
        h = torch.cat(hidden, dim=0)
        # through the class attribute, so a hook on _get_dllm_logits (the plugin's hidden-state
        # capture) wraps this call exactly as it wraps the real logits processor's
        logits_output = LogitsProcessor._get_dllm_logits(_LMHead(self.model), h, None, None)
        return SimpleNamespace(logits_output=logits_output, can_run_graph=False)


class ServerTokenizer:
    """What a server's ``scheduler.tokenizer`` is: a ``transformers`` fast tokenizer, with its
    ``decode``, its ``backend_tokenizer`` and its ``chat_template``."""

    def __init__(self, backend: Any, chat_template: str | None) -> None:
        self.backend_tokenizer = backend
        self.chat_template = chat_template

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        return str(
            self.backend_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        )


class _LMHead:
    """Stands in for the LogitsProcessor instance: tied embeddings, the mask never predicted."""

    return_full_logits = True

    def __init__(self, model: Any) -> None:
        self.model = model

    def _get_logits(self, hidden: torch.Tensor, lm_head: Any, metadata: Any) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, self.model.embed.weight).float()
        logits[:, MASK] = float("-inf")
        return logits


class ScriptedRunner:
    """A model runner whose outputs are scripted, for fault runs that need many rounds fast.

    Each request's answer is fixed by its rid: ``lengths[rid]`` output tokens, the last one
    EOS (a request without one runs to its budget). Each denoising step unmasks 1-4 of a
    block's masked positions (a hash of rid, block and step), the rest left below
    LowConfidence's threshold, so blocks take varied numbers of rounds through SGLang's own
    algorithm. Hidden rows are a function of the request only. Nothing here depends on the
    batch, so outputs cannot depend on scheduling either.
    """

    vocab = 264
    hidden_size = 128

    def __init__(self, lengths: dict[str, int], block_size: int = 32) -> None:
        self.lengths = lengths
        self.block_size = block_size
        self.reqs: Sequence[Any] = ()
        self.forwards = 0
        self.tokenizer = None

    def forget(self, rid: Any) -> None:
        pass

    @torch.inference_mode()
    def forward(self, forward_batch: Any, **kwargs: Any) -> Any:
        from sglang.srt.layers.logits_processor import LogitsProcessor

        bs, n = self.block_size, forward_batch.batch_size
        ids = forward_batch.input_ids.view(n, bs)
        logits = torch.zeros(n * bs, self.vocab)
        logits[:, 3:5] = 5.0  # two equal tops: confidence 0.5, under any threshold
        hidden = torch.zeros(n * bs, self.hidden_size)
        for i, req in enumerate(self.reqs):
            start = int(req.dllm_block_offset)
            n_prompt = len(req.origin_input_ids)
            masked = (ids[i] == MASK).nonzero().flatten().tolist()
            seed = sum(map(ord, str(req.rid)))
            hidden[i * bs : (i + 1) * bs] = float(seed % 97) / 97.0
            take = 1 + (seed + start + len(masked)) % 4
            for j in masked[:take]:
                pos = start + j - n_prompt  # output position
                end = self.lengths.get(req.rid)
                token = EOS if end is not None and pos == end - 1 else 10 + pos % 200
                logits[i * bs + j, token] = 30.0
        self.forwards += 1
        head = _ScriptedHead(logits)
        out = LogitsProcessor._get_dllm_logits(head, hidden, None, None)
        return SimpleNamespace(logits_output=out, can_run_graph=False)


class _ScriptedHead:
    return_full_logits = True

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def _get_logits(self, hidden: torch.Tensor, lm_head: Any, metadata: Any) -> torch.Tensor:
        return self.logits


# -- the scheduler ---------------------------------------------------------------------------


@dataclass
class RequestSpec:
    """One request to serve: its id, prompt text (chat-templated already) and ids."""

    rid: str
    text: str
    input_ids: list[int]
    max_new_tokens: int
    category: str = ""
    #: what the client sends as SGLang's ``extra_key`` (observe mode reads ``category:NAME``)
    label: str | None = None


@dataclass
class RunResult:
    """What one serving run did, round by round and request by request."""

    rounds: int = 0
    prefill_only_rounds: int = 0
    filled_slots: int = 0
    completion_round: dict[str, int] = field(default_factory=dict)
    first_block_round: dict[str, int] = field(default_factory=dict)
    #: forwards each request took part in, and how many of them carried a prompt block
    forwards: dict[str, int] = field(default_factory=dict)
    prompt_forwards: dict[str, int] = field(default_factory=dict)
    output_ids: dict[str, list[int]] = field(default_factory=dict)
    kv_free_before: int = 0
    kv_free_after: int = 0
    req_slots_free_before: int = 0
    req_slots_free_after: int = 0
    max_residents: int = 0
    wall_seconds: float = 0.0
    kv_balanced_every_round: bool = True
    #: the round before which each request entered SGLang's waiting queue
    arrival_round: dict[str, int] = field(default_factory=dict)
    #: rounds with nothing to run while requests were still to arrive
    idle_rounds: int = 0
    #: every round's batch: (round, request ids, whether each ran a prompt block), to compare
    #: a served run with its replay round by round
    batches: list[tuple[int, list[str], list[bool]]] = field(default_factory=list)


@contextmanager
def server_args(**overrides: Any):  # type: ignore[no-untyped-def]
    """Install SGLang server args for the duration (what its CPU unit tests do)."""
    from sglang.srt.runtime_context import get_context, get_parallel

    override = get_context().override_server_args(**overrides)
    override.install()
    try:
        # one scheduler process of a server without tensor, data or pipeline parallelism
        with get_parallel().override(tp_rank=0, dp_rank=None, pp_size=1):
            yield
    finally:
        override.restore()


def make_scheduler(
    *,
    max_running_requests: int,
    block_size: int = 32,
    threshold: float = 0.95,
    pool_tokens: int = 1 << 20,
    context_len: int = 16384,
    model_path: str = "tiny-bd",
) -> Any:
    """A real SGLang ``Scheduler`` with real pools, allocator and radix cache (disabled)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.dllm.config import DllmConfig
    from sglang.srt.dllm.mixin.scheduler import DllmManager
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache

    dc = DllmConfig(
        algorithm="LowConfidence",
        algorithm_config={"threshold": threshold},
        block_size=block_size,
        mask_id=MASK,
        max_running_requests=max_running_requests,
        first_done_first_out_mode=True,
    )
    s = Scheduler.__new__(Scheduler)
    s.server_args = SimpleNamespace(model_path=model_path, served_model_name=None, revision=None)
    s.model_config = SimpleNamespace(
        context_len=context_len,
        vocab_size=264,
        hidden_size=128,
        is_encoder_decoder=False,
        is_multimodal=False,
    )
    s.dllm_config = dc
    s.dllm_manager = DllmManager(dllm_config=dc)
    s.req_to_token_pool = ReqToTokenPool(
        size=max_running_requests,
        max_context_len=context_len,
        device="cpu",
        enable_memory_saver=False,
    )
    s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
        pool_tokens, torch.float32, "cpu", kvcache=None, need_sort=False
    )
    s.tree_cache = RadixCache(
        CacheInitParams(
            disable=True,
            req_to_token_pool=s.req_to_token_pool,
            token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
            page_size=1,
        )
    )
    s.waiting_queue = []
    s.policy = SimpleNamespace(calc_priority=lambda queue: None)
    s.enable_priority_preemption = False
    s.enable_priority_scheduling = False
    s.priority_scheduling_preemption_threshold = 0
    s.page_size = 1
    s.new_token_ratio_tracker = SimpleNamespace(current=1.0)
    s.max_prefill_tokens = 1 << 20
    s.chunked_prefill_size = -1
    s.is_mixed_chunk = False
    s.truncation_align_size = None
    s.enable_overlap = False
    s.spec_algorithm = SimpleNamespace(is_none=lambda: True)
    s.metrics_reporter = SimpleNamespace(
        num_generated_tokens=0, report_prefill_stats=lambda **kw: None, enable_metrics=False
    )
    s.tokenizer = None  # a server started with --skip-tokenizer-init; CpuServer sets tiny-bd's
    s.output_streamer = SimpleNamespace(stream_output=lambda *a, **kw: None)
    s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
    s.chunked_req = None
    s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
    s.disaggregation_mode = DisaggregationMode.NULL
    s.load_snapshot_writer = None  # a scheduler that publishes no load snapshot (fleet.py does)
    return s


class CpuServer:
    """A real SGLang ``Scheduler`` driven round by round, the way its event loop drives it.

    ``submit`` puts a request in SGLang's waiting queue (an arrival between rounds),
    ``abort`` goes through SGLang's own ``Scheduler.abort_request`` (a client disconnect),
    ``step`` runs one round: ``filter_finished_reqs``, ``finish_dllm_forward`` of the staging
    requests, ``get_new_batch_dllm`` (where the plugin composes the round), the forward and
    ``process_batch_result_dllm``. Use it as a context manager: SGLang's server args stay
    installed while it serves.
    """

    def __init__(
        self,
        *,
        max_running_requests: int,
        runner: TinyBDRunner,
        block_size: int = 32,
        threshold: float = 0.95,
        pool_tokens: int = 1 << 20,
        on_scheduler: Any = None,
    ) -> None:
        self.max_running_requests = max_running_requests
        self.runner = runner
        self.block_size = block_size
        self.threshold = threshold
        self.pool_tokens = pool_tokens
        self.on_scheduler = on_scheduler
        self.rounds = 0
        self.reqs: dict[str, Any] = {}
        self.aborted: set[str] = set()
        #: every request SGLang reported back as aborted (its tokenizer-side clean-up message)
        self.abort_outputs: list[str] = []
        self._args: Any = None
        #: which requests of the last batch carried a prompt block (read before the forward)
        self.last_prefill: list[bool] = []

    def __enter__(self) -> CpuServer:
        from sglang.srt.dllm.algorithm import get_algorithm

        n = self.max_running_requests
        self._args = server_args(pp_max_micro_batch_size=n, max_running_requests=n)
        self._args.__enter__()
        s = self.scheduler = make_scheduler(
            max_running_requests=n,
            block_size=self.block_size,
            threshold=self.threshold,
            pool_tokens=self.pool_tokens,
            model_path=getattr(self.runner, "model_id", "tiny-bd"),
        )
        # what Scheduler.abort_request reads besides the queues (a server without
        # disaggregation, multimodal encoders, grammars or a Rust front end)
        s.mm_receiver = None
        s.rust_server = None
        s.enable_continuous_input_polling = False
        s.result_queue = []
        s.last_batch = None
        s.beam_coordinator.retire_group = lambda req: None
        s.grammar_manager = SimpleNamespace(abort_requests=lambda recv_req: None)
        s.ipc_channels = SimpleNamespace(
            send_to_tokenizer=SimpleNamespace(
                send_output=lambda out, req: self.abort_outputs.append(req.rid)
            )
        )
        # a real scheduler holds the server's tokenizer; SGLang 0.5.23's Req keeps only the
        # prompt's ids (not its text), so the plugin decodes them with it for the features
        tok = self.runner.tokenizer
        chat_template = getattr(self.runner, "chat_template", None)
        s.tokenizer = None if tok is None else ServerTokenizer(tok, chat_template)
        if self.on_scheduler is not None:
            self.on_scheduler(s)
        self.worker = SimpleNamespace(
            dllm_algorithm=get_algorithm(s.dllm_config), model_runner=self.runner
        )
        self.kv_free_before = s.token_to_kv_pool_allocator.available_size()
        self.req_slots_free_before = s.req_to_token_pool.available_size()
        return self

    def __exit__(self, *exc: Any) -> None:
        state = getattr(self.scheduler, "dwise_serving", None)
        if state is not None:
            state.drain()  # what the plugin hands its background threads is on disk
        self._args.__exit__(*exc)

    # -- what a client does ------------------------------------------------------------------
    def submit(self, spec: RequestSpec) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=0.0)
        sp.normalize(None)
        # a server gives every Req the model's EOS ids (ModelConfig.hf_eos_token_id), so a
        # request finishes at its EOS instead of running to max_new_tokens
        req = Req(
            spec.rid,
            spec.text,
            array("q", spec.input_ids),
            sp,
            eos_token_ids={EOS},
            dllm_config=self.scheduler.dllm_config,
            extra_key=spec.label,
        )
        self.reqs[spec.rid] = req
        self.scheduler.waiting_queue.append(req)
        return req

    def abort(self, rid: str = "", *, abort_all: bool = False) -> None:
        """A client disconnect, through SGLang's own ``Scheduler.abort_request``."""
        from sglang.srt.managers.io_struct import AbortReq

        self.scheduler.abort_request(AbortReq(rid=rid, abort_all=abort_all))
        for r, req in self.reqs.items():
            if (abort_all or r.startswith(rid)) and not req.finished():
                self.aborted.add(r)
                self.runner.forget(r)

    # -- one round -----------------------------------------------------------------------------
    def step(self) -> Any:
        """One round of SGLang's loop; returns the batch it ran, or None (nothing to run)."""
        from sglang.srt.managers.tp_worker import TpModelWorker

        s = self.scheduler
        s.dllm_manager.filter_finished_reqs()
        for req in s.dllm_manager.staging_queue:
            s.finish_dllm_forward(req)
        s.running_batch.batch_is_full = False
        batch = s.get_new_batch_dllm(s.running_batch)
        self.rounds += 1
        if batch is None:
            s.last_batch = None
            return None
        self.runner.reqs = batch.reqs
        self.last_prefill = [r.is_dllm_prefill() for r in batch.reqs]
        fb = SimpleNamespace(
            batch_size=len(batch.reqs),
            input_ids=batch.prefill_input_ids_cpu.clone(),
            seq_lens=batch.seq_lens,
            dllm_prompt_mask=None,
            forward_mode=batch.forward_mode,
        )
        result = TpModelWorker._forward_batch_generation_dllm(self.worker, fb, batch)
        result.copy_done = None
        s.process_batch_result_dllm(batch, result)
        s.last_batch = batch
        for req in batch.reqs:
            if req.finished():
                self.runner.forget(req.rid)
        return batch

    def drain(self) -> None:
        """What the next round would do first: drop finished requests from the dLLM queues."""
        s = self.scheduler
        s.dllm_manager.filter_finished_reqs()
        for req in s.dllm_manager.staging_queue:
            s.finish_dllm_forward(req)

    def kv_balanced(self) -> bool:
        return _kv_balanced(self.scheduler, self.reqs.values())

    @property
    def kv_free(self) -> int:
        return int(self.scheduler.token_to_kv_pool_allocator.available_size())

    @property
    def req_slots_free(self) -> int:
        return int(self.scheduler.req_to_token_pool.available_size())


def serve(
    requests: Sequence[RequestSpec],
    *,
    max_running_requests: int,
    runner: TinyBDRunner,
    block_size: int = 32,
    threshold: float = 0.95,
    pool_tokens: int = 1 << 20,
    max_rounds: int = 100_000,
    on_scheduler: Any = None,
    arrival_rounds: Sequence[int] | None = None,
) -> tuple[RunResult, Any]:
    """Serve ``requests`` to completion, one forward a round.

    ``arrival_rounds[i]`` is the round before which request i enters SGLang's waiting queue
    (0 = before the first round); by default all arrive at once (a burst). Rounds are
    counted from 1, so a request that arrives at round a and finishes in round c took
    ``c - a`` rounds. ``on_scheduler(scheduler)`` runs once the scheduler is built (the
    plugin's start-up hook stands there in a real server, at the end of
    ``Scheduler.__init__``).
    """
    arrive = [0] * len(requests) if arrival_rounds is None else [int(a) for a in arrival_rounds]
    if len(arrive) != len(requests):
        raise ValueError("arrival_rounds needs one round per request")
    order = sorted(range(len(requests)), key=lambda i: (arrive[i], i))
    with CpuServer(
        max_running_requests=max_running_requests,
        runner=runner,
        block_size=block_size,
        threshold=threshold,
        pool_tokens=pool_tokens,
        on_scheduler=on_scheduler,
    ) as server:
        s = server.scheduler
        res = RunResult(
            kv_free_before=server.kv_free_before,
            req_slots_free_before=server.req_slots_free_before,
        )
        nxt = 0
        t0 = time.perf_counter()
        while len(res.completion_round) < len(requests):
            while nxt < len(order) and arrive[order[nxt]] <= server.rounds:
                spec = requests[order[nxt]]
                server.submit(spec)
                res.arrival_round[spec.rid] = server.rounds
                nxt += 1
            if server.rounds >= max_rounds:
                left = len(requests) - len(res.completion_round)
                raise RuntimeError(f"{left} requests unfinished after {max_rounds} rounds")
            batch = server.step()
            if batch is None:
                if nxt < len(order):
                    res.idle_rounds += 1
                    continue  # nothing has arrived yet: the server idles until something does
                left = len(requests) - len(res.completion_round)
                raise RuntimeError(f"round {server.rounds}: no batch with {left} unfinished")
            res.rounds = server.rounds
            prefill = [bool(p) for p in server.last_prefill]
            res.batches.append((server.rounds, [str(r.rid) for r in batch.reqs], prefill))
            res.filled_slots += len(batch.reqs)
            res.prefill_only_rounds += int(all(prefill))
            res.max_residents = max(res.max_residents, len(s.dllm_manager.waiting_queue))
            for req, pre in zip(batch.reqs, prefill):
                res.forwards[req.rid] = res.forwards.get(req.rid, 0) + 1
                res.prompt_forwards[req.rid] = res.prompt_forwards.get(req.rid, 0) + int(pre)
                if req.output_ids and req.rid not in res.first_block_round:
                    res.first_block_round[req.rid] = server.rounds
                if req.finished() and req.rid not in res.completion_round:
                    res.completion_round[req.rid] = server.rounds
                    res.output_ids[req.rid] = list(req.output_ids)
            res.kv_balanced_every_round &= server.kv_balanced()
        server.drain()
        res.wall_seconds = time.perf_counter() - t0
        res.kv_free_after = server.kv_free
        res.req_slots_free_after = server.req_slots_free
    return res, s


def _kv_balanced(s: Any, reqs: Any) -> bool:
    """Allocator usage equals the KV the live requests hold (nothing leaked, nothing shared)."""
    alloc = s.token_to_kv_pool_allocator
    used = alloc.size - alloc.available_size()
    held = sum(
        int(r.kv.kv_allocated_len)
        for r in reqs
        if getattr(r, "kv", None) is not None and r.kv.req_pool_idx is not None
    )
    return used == held


def eval_requests(
    n: int,
    runner: TinyBDRunner,
    *,
    max_new_tokens: int = 256,
    stratified: bool = True,
    max_prompt_tokens: int | None = None,
) -> list[RequestSpec]:
    """``n`` requests from the tiny-bd eval split, chat-templated with the model's template.

    ``stratified`` takes them round-robin over categories (the paper's kind of mix, long
    contexts included) in the split's order; otherwise the first ``n`` rows.
    ``max_prompt_tokens`` keeps only prompts up to that many tokens (tests use short ones).
    """
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig, render_prompt

    dc = DataConfig()
    records = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed).eval
    if max_prompt_tokens is not None:
        tok = runner.tokenizer
        records = [
            r for r in records if len(tok.encode(render_prompt(r.prompt)).ids) <= max_prompt_tokens
        ]
    if stratified:
        by_cat: dict[str, list[Any]] = {}
        for r in records:
            by_cat.setdefault(r.category, []).append(r)
        cats = sorted(by_cat)
        picked: list[Any] = []
        i = 0
        while len(picked) < n and any(i < len(by_cat[c]) for c in cats):
            picked += [by_cat[c][i] for c in cats if i < len(by_cat[c])]
            i += 1
        records = picked[:n]
    else:
        records = records[:n]
    out = []
    for r in records:
        text = render_prompt(r.prompt)
        out.append(
            RequestSpec(r.id, text, runner.tokenizer.encode(text).ids, max_new_tokens, r.category)
        )
    return out


def plugin_env(bundle: str, **settings: Any) -> dict[str, str]:
    """Environment variables that turn the plugin on (for :func:`os.environ` updates)."""
    env = {"DWISE_SGLANG_BUNDLE": bundle}
    env.update({f"DWISE_SGLANG_{k.upper()}": str(v) for k, v in settings.items()})
    return env


@contextmanager
def environ(values: dict[str, str | None]):  # type: ignore[no-untyped-def]
    """Set (or with None, unset) environment variables for the duration."""
    old = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def remove_hooks() -> None:
    """Undo every hook SGLang's ``HookRegistry`` applied, and let ``load_plugins`` run again.

    ``HookRegistry.reset()`` forgets registrations but leaves the patched functions in place;
    a process that serves twice (stock, then with the plugin) must restore the originals.
    """
    import pkgutil

    import sglang.srt.plugins as plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    for target in list(HookRegistry._hooks):
        obj_path, attr = target.rsplit(".", 1)
        try:
            obj = pkgutil.resolve_name(obj_path)
        except Exception:
            continue
        raw = obj.__dict__.get(attr) if isinstance(obj, type) else getattr(obj, attr, None)
        fn = raw
        while fn is not None and _is_hook_wrapper(fn):
            fn = fn.__wrapped__
        if fn is not raw and fn is not None:
            setattr(obj, attr, fn)
    HookRegistry.reset()
    plugins._plugins_loaded = False


def _is_hook_wrapper(fn: Any) -> bool:
    code = getattr(fn, "__code__", None)
    return (
        hasattr(fn, "__wrapped__")
        and code is not None
        and code.co_filename.endswith("hook_registry.py")
    )
