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

Used by ``tests/sglang_plugin/`` and ``benchmarks/sglang_scheduler.py``. Needs the ``.venv-sglang``
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

from .generate import _extend
from .io import from_pretrained
from .model import KV
from .tokenizer import EOS, MASK


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

    def __init__(self, block_size: int = 32, checkpoint: str = "tiny-bd") -> None:
        # one thread: the per-request forwards are tiny, and a shared CPU thrashes with more
        torch.set_num_threads(1)
        tb = from_pretrained(checkpoint)
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
            committed = list(req.origin_input_ids) + list(req.output_ids)
            ctx = committed[:start]
            kv = self._prefix_kv(req.rid, ctx)
            pos = torch.arange(start, start + bs)[None]
            out = self.model(ids[i : i + 1].long(), pos, None, kv)
            hidden.append(out.hidden[0])
        self.forwards += 1
        h = torch.cat(hidden, dim=0)
        # through the class attribute, so a hook on _get_dllm_logits (the plugin's hidden-state
        # capture) wraps this call exactly as it wraps the real logits processor's
        logits_output = LogitsProcessor._get_dllm_logits(_LMHead(self.model), h, None, None)
        return SimpleNamespace(logits_output=logits_output, can_run_graph=False)


class _LMHead:
    """Stands in for the LogitsProcessor instance: tied embeddings, the mask never predicted."""

    return_full_logits = True

    def __init__(self, model: Any) -> None:
        self.model = model

    def _get_logits(self, hidden: torch.Tensor, lm_head: Any, metadata: Any) -> torch.Tensor:
        logits = torch.nn.functional.linear(hidden, self.model.embed.weight).float()
        logits[:, MASK] = float("-inf")
        return logits


# -- the scheduler ---------------------------------------------------------------------------


@dataclass
class RequestSpec:
    """One request to serve: its id, prompt text (chat-templated already) and ids."""

    rid: str
    text: str
    input_ids: list[int]
    max_new_tokens: int
    category: str = ""


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


@contextmanager
def server_args(**overrides: Any):  # type: ignore[no-untyped-def]
    """Install SGLang server args for the duration (what its CPU unit tests do)."""
    from sglang.srt.runtime_context import get_context

    override = get_context().override_server_args(**overrides)
    override.install()
    try:
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
        num_generated_tokens=0, report_prefill_stats=lambda **kw: None
    )
    s.output_streamer = SimpleNamespace(stream_output=lambda *a, **kw: None)
    s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
    s.chunked_req = None
    s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
    s.disaggregation_mode = DisaggregationMode.NULL
    return s


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
) -> tuple[RunResult, Any]:
    """Serve ``requests`` (a burst: all arrive before round 0) to completion; one forward a round.

    ``on_scheduler(scheduler)`` runs once the scheduler is built (the plugin's start-up hook
    stands there in a real server, at the end of ``Scheduler.__init__``).
    """
    from sglang.srt.dllm.algorithm import get_algorithm
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.sampling.sampling_params import SamplingParams

    with server_args(
        pp_max_micro_batch_size=max_running_requests, max_running_requests=max_running_requests
    ):
        s = make_scheduler(
            max_running_requests=max_running_requests,
            block_size=block_size,
            threshold=threshold,
            pool_tokens=pool_tokens,
        )
        # a real scheduler holds the server's tokenizer; SGLang 0.5.23's Req keeps only the
        # prompt's ids (not its text), so the plugin decodes them with it for the features
        s.tokenizer = runner.tokenizer
        if on_scheduler is not None:
            on_scheduler(s)
        worker = SimpleNamespace(dllm_algorithm=get_algorithm(s.dllm_config), model_runner=runner)
        res = RunResult(
            kv_free_before=s.token_to_kv_pool_allocator.available_size(),
            req_slots_free_before=s.req_to_token_pool.available_size(),
        )
        by_rid: dict[str, Any] = {}
        for spec in requests:
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
                dllm_config=s.dllm_config,
            )
            by_rid[spec.rid] = req
            s.waiting_queue.append(req)
        t0 = time.perf_counter()
        while len(res.completion_round) < len(requests):
            if res.rounds >= max_rounds:
                left = len(requests) - len(res.completion_round)
                raise RuntimeError(f"{left} requests unfinished after {max_rounds} rounds")
            s.dllm_manager.filter_finished_reqs()
            for req in s.dllm_manager.staging_queue:
                s.finish_dllm_forward(req)
            s.running_batch.batch_is_full = False
            batch = s.get_new_batch_dllm(s.running_batch)
            if batch is None:
                left = len(requests) - len(res.completion_round)
                raise RuntimeError(f"round {res.rounds}: no batch with {left} requests unfinished")
            runner.reqs = batch.reqs
            prefill = [r.is_dllm_prefill() for r in batch.reqs]
            fb = SimpleNamespace(
                batch_size=len(batch.reqs),
                input_ids=batch.prefill_input_ids_cpu.clone(),
                seq_lens=batch.seq_lens,
                dllm_prompt_mask=None,
                forward_mode=batch.forward_mode,
            )
            result = TpModelWorker._forward_batch_generation_dllm(worker, fb, batch)
            result.copy_done = None
            s.process_batch_result_dllm(batch, result)
            res.rounds += 1
            res.filled_slots += len(batch.reqs)
            res.prefill_only_rounds += int(all(prefill))
            residents = len(s.dllm_manager.waiting_queue)
            res.max_residents = max(res.max_residents, residents)
            for req, pre in zip(batch.reqs, prefill):
                res.forwards[req.rid] = res.forwards.get(req.rid, 0) + 1
                res.prompt_forwards[req.rid] = res.prompt_forwards.get(req.rid, 0) + int(pre)
                if req.output_ids and req.rid not in res.first_block_round:
                    res.first_block_round[req.rid] = res.rounds
                if req.finished() and req.rid not in res.completion_round:
                    res.completion_round[req.rid] = res.rounds
                    res.output_ids[req.rid] = list(req.output_ids)
                    runner.forget(req.rid)
            res.kv_balanced_every_round &= _kv_balanced(s, by_rid.values())
        s.dllm_manager.filter_finished_reqs()
        for req in s.dllm_manager.staging_queue:
            s.finish_dllm_forward(req)
        res.wall_seconds = time.perf_counter() - t0
        res.kv_free_after = s.token_to_kv_pool_allocator.available_size()
        res.req_slots_free_after = s.req_to_token_pool.available_size()
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

    from .data import DataConfig, render_prompt

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
