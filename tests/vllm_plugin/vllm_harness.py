"""tiny-bd's denoising served by vLLM 0.33.0's real diffusion scheduler classes, on CPU.

vLLM's model runner needs a GPU (and DiffusionGemma's own config needs torchvision's CUDA
build), so this module swaps only the model runner, the way vLLM's own scheduler tests do
(``tests/v1/core/utils.py::create_scheduler``): a real ``VllmConfig`` (``ModelConfig`` of a
config-only local model whose HF config has ``canvas_length``, so vLLM selects its diffusion
scheduler; ``SchedulerConfig``; ``CacheConfig``; ``DiffusionConfig``), a ``KVCacheConfig`` with
one full-attention group and ``num_gpu_blocks`` set by hand, the class from
``scheduler_config.get_scheduler_cls()``, real ``Request`` objects with vLLM's block hasher,
``SamplingParams`` (stop token, ``max_tokens``, ``extra_args``), and vLLM's own
``schedule`` / ``update_from_output`` / ``update_draft_token_ids`` / ``finish_requests``.

:class:`CanvasRunner` answers each ``schedule()`` as vLLM's diffusion model runner does:
nothing for a prompt chunk or a denoising step, the canvas's tokens on the commit step after
the block converged, then a fresh canvas (``update_draft_token_ids``) for the live requests.
How many denoising steps each block takes, and the tokens it commits, come from tiny-bd
itself: :func:`tiny_bd_traces` decodes eval-split prompts with tiny-bd's reference decoder
(LowConfidence, threshold 0.95, 32-token blocks, 256-token budget) and records the rounds per
block and the tokens, so the bundle's estimates have real work to predict.

Used by ``tests/vllm_plugin/`` and ``benchmarks/vllm_scheduler.py``; test equipment, in no
wheel. Needs the ``.venv-vllm`` environment (``make test-vllm``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")

CANVAS = 32  # tiny-bd's block = the served canvas
KV_BLOCK = 16  # vLLM's KV page size in tokens
MAX_NEW_TOKENS = 256
THRESHOLD = 0.95
EOS, MASK = 2, 1  # tiny-bd's special tokens
DWISE_CLS = "dwise_predict.vllm.DWISEDiffusionScheduler"


# -- tiny-bd traces -------------------------------------------------------------------------------
@dataclass
class TraceRequest:
    """One request as tiny-bd served it: its prompt, and per output block the denoising steps it
    took and the tokens it committed."""

    rid: str
    category: str
    prompt: str
    prompt_ids: list[int]
    rounds_per_block: list[int]
    tokens: list[int]
    finished_eos: bool

    @property
    def total_rounds(self) -> int:
        return sum(self.rounds_per_block)


def tiny_bd_traces(
    n: int, *, max_prompt_tokens: int | None = None, cache: str | Path | None = None
) -> list[TraceRequest]:
    """``n`` eval-split requests (stratified over categories) decoded by tiny-bd.

    ``cache``: a JSON file to read them from, or to write them to (decoding takes about a
    second per request on one CPU core; long contexts dominate). It is read only when it was
    written from the same weights (their revision), so a zoo release re-decodes."""
    from dwise_predict.zoo.tiny_bd.io import WEIGHTS_DIR, weights_revision

    # hashing the weights is only needed to key a cache
    revision = None if cache is None else weights_revision(WEIGHTS_DIR / "model.safetensors")
    if cache is not None and Path(cache).is_file():
        rows = json.loads(Path(cache).read_text(encoding="utf-8"))
        if (rows.get("n"), rows.get("max_prompt_tokens"), rows.get("model_revision")) == (
            n,
            max_prompt_tokens,
            revision,
        ):
            return [TraceRequest(**r) for r in rows["requests"]]
    import torch
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.zoo.tiny_bd.generate import generate
    from dwise_predict.zoo.tiny_bd.io import from_pretrained
    from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig, render_prompt

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tb = from_pretrained("tiny-bd")
        dc = DataConfig()
        records = build_workload(
            dc.workload_train_size, dc.workload_eval_size, dc.workload_seed
        ).eval
        by_cat: dict[str, list[Any]] = {}
        for r in records:
            ids = tb.tokenizer.encode(render_prompt(r.prompt)).ids
            if max_prompt_tokens is None or len(ids) <= max_prompt_tokens:
                by_cat.setdefault(r.category, []).append((r, ids))
        cats = sorted(by_cat)
        picked: list[tuple[Any, list[int]]] = []
        i = 0
        while len(picked) < n and any(i < len(by_cat[c]) for c in cats):
            picked += [by_cat[c][i] for c in cats if i < len(by_cat[c])]
            i += 1
        out = []
        for r, ids in picked[:n]:
            g = generate(
                tb.model, ids, threshold=THRESHOLD, max_new_tokens=MAX_NEW_TOKENS, block_size=CANVAS
            )
            out.append(
                TraceRequest(
                    r.id, r.category, r.prompt, ids, g.rounds_per_block, g.tokens, g.finished_eos
                )
            )
    finally:
        torch.set_num_threads(threads)
    if cache is not None:
        Path(cache).parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "n": n,
            "max_prompt_tokens": max_prompt_tokens,
            "model_revision": revision,
            "requests": [asdict(t) for t in out],
        }
        Path(cache).write_text(json.dumps(payload), encoding="utf-8")
    return out


# -- the served model and the scheduler -----------------------------------------------------------
def make_model_dir(out: str | Path) -> Path:
    """A config-only local model vLLM reads as a dLLM (``canvas_length`` in its HF config):
    tiny-bd's sizes (vocabulary 264, hidden 128, mask id 1), served as ``tiny-bd``, with the
    decoding setting in its generation config."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 264,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "max_position_embeddings": 16384,
        "canvas_length": CANVAS,
        "mask_token_id": MASK,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    gen = {"confidence_threshold": THRESHOLD, "max_denoising_steps": CANVAS, "eos_token_id": EOS}
    (out / "generation_config.json").write_text(json.dumps(gen), encoding="utf-8")
    return out


@contextmanager
def environ(values: dict[str, str | None]) -> Iterator[None]:
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


def dwise_env(bundle: str | None = "tiny-bd", **settings: Any) -> dict[str, str | None]:
    """The DWISE scheduler's settings. tiny-bd's bundle was traced with absolute-position
    blocks and vLLM's canvas starts at the prompt's end (response-aligned), so the fingerprint
    check would refuse it: the harness serves it with ``allow_mismatch`` unless told not to."""
    env: dict[str, str | None] = {
        "DWISE_VLLM_BUNDLE": bundle,
        "DWISE_VLLM_ALLOW_MISMATCH": "1",
        "DWISE_VLLM_POLICY": None,
    }
    env.update(
        {f"DWISE_VLLM_{k.upper()}": None if v is None else str(v) for k, v in settings.items()}
    )
    return env


def make_scheduler(
    model_dir: str | Path,
    *,
    scheduler_cls: str | None = None,
    max_num_seqs: int = 8,
    num_blocks: int = 4096,
    policy: str = "fcfs",
    max_num_batched_tokens: int = 4096,
    max_model_len: int = 16384,
    env: dict[str, str | None] | None = None,
) -> Any:
    """vLLM's scheduler for ``model_dir``, built as vLLM's own tests build it."""
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.config.diffusion import DiffusionConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    sc = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=True,
        is_encoder_decoder=False,
        policy=policy,
        scheduler_cls=scheduler_cls,
    )
    mc = ModelConfig(
        model=str(model_dir),
        skip_tokenizer_init=True,
        served_model_name="tiny-bd",
        dtype="float32",
        max_model_len=max_model_len,
    )
    cc = CacheConfig(block_size=KV_BLOCK)
    vc = VllmConfig(
        scheduler_config=sc,
        model_config=mc,
        cache_config=cc,
        diffusion_config=DiffusionConfig(canvas_length=CANVAS, max_denoising_steps=CANVAS),
    )
    kvc = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=KV_BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cc.num_gpu_blocks = num_blocks
    cls = vc.scheduler_config.get_scheduler_cls()
    with environ(env or {}):
        return cls(
            vllm_config=vc,
            kv_cache_config=kvc,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(vc),
            block_size=KV_BLOCK,
        )


_HASHER: list[Any] = []


def make_request(
    t: TraceRequest,
    *,
    arrival_time: float = 0.0,
    priority: int = 0,
    extra: dict[str, Any] | None = None,
    max_tokens: int = MAX_NEW_TOKENS,
) -> Any:
    """vLLM's ``Request`` for a traced request (stop at tiny-bd's EOS, ``extra_args`` as a
    client's ``vllm_xargs``: the category, plus whatever ``extra`` adds)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    if not _HASHER:
        init_none_hash(sha256)
        _HASHER.append(get_request_block_hasher(KV_BLOCK, sha256))
    sp = SamplingParams(
        max_tokens=max_tokens,
        stop_token_ids=[EOS],
        extra_args={"category": t.category, **(extra or {})},
    )
    return Request(
        request_id=t.rid,
        prompt_token_ids=list(t.prompt_ids),
        sampling_params=sp,
        pooling_params=None,
        arrival_time=arrival_time,
        priority=priority,
        block_hasher=_HASHER[0],
    )


# -- the model runner ------------------------------------------------------------------------------
class CanvasRunner:
    """Answers vLLM's iterations the way its diffusion model runner does, from tiny-bd traces.

    Per request: after the prompt, each block takes ``rounds_per_block[b]`` denoising steps
    (iterations that schedule a canvas and emit nothing), then one commit step that emits the
    block's tokens. A preempted request loses its block in progress: vLLM recomputes its
    context, and the runner starts the block's steps again.
    """

    def __init__(self, traces: list[TraceRequest]) -> None:
        self.trace = {t.rid: t for t in traces}
        self.block: dict[str, int] = {}
        self.steps: dict[str, int] = {}
        self.forwards = 0

    def run(self, sched: Any, out: Any) -> Any:
        from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

        ids = list(out.num_scheduled_tokens)
        spec = out.scheduled_spec_decode_tokens
        sampled: list[list[int]] = []
        for rid in ids:
            t = self.trace[rid]
            b = self.block.setdefault(rid, 0)
            if rid not in spec:  # a prompt (or recomputed context) chunk: the block restarts
                self.steps[rid] = 0
                sampled.append([])
            elif self.steps.get(rid, 0) < t.rounds_per_block[b]:
                self.steps[rid] = self.steps.get(rid, 0) + 1
                sampled.append([])
            else:  # converged last step: commit the canvas
                sampled.append(list(t.tokens[b * CANVAS : (b + 1) * CANVAS]))
                self.block[rid] = b + 1
                self.steps[rid] = 0
        self.forwards += 1 if ids else 0
        runner_out = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        engine_out = sched.update_from_output(out, runner_out)
        live = [r for r in ids if r in sched.requests and not sched.requests[r].is_finished()]
        if live:
            sched.update_draft_token_ids(DraftTokenIds(live, [[MASK] * CANVAS for _ in live]))
        return engine_out

    def forget(self, rid: str) -> None:
        self.block.pop(rid, None)
        self.steps.pop(rid, None)


# -- a serving run ---------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What one run did, iteration by iteration and request by request."""

    iterations: int = 0
    idle_iterations: int = 0
    arrival: dict[str, int] = field(default_factory=dict)
    completion: dict[str, int] = field(default_factory=dict)  # iterations in the system
    finish_order: list[str] = field(default_factory=list)
    finish_reason: dict[str, str] = field(default_factory=dict)
    output_tokens: dict[str, list[int]] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    preemptions: int = 0
    kv_free_before: int = 0
    kv_free_after: int = 0
    kv_balanced_every_iteration: bool = True
    max_running: int = 0
    wall_seconds: float = 0.0

    @property
    def kv_blocks_leaked(self) -> int:
        return self.kv_free_before - self.kv_free_after


def _free_blocks(sched: Any) -> int:
    return int(sched.kv_cache_manager.block_pool.get_num_free_blocks())


def _kv_balanced(sched: Any, before: int) -> bool:
    """Free blocks + blocks held by live requests (each counted once) == the pool."""
    held: set[int] = set()
    for rid in sched.requests:
        for group in sched.kv_cache_manager.get_block_ids(rid):
            held.update(group)
    return _free_blocks(sched) + len(held) == before


def serve(
    sched: Any,
    traces: list[TraceRequest],
    *,
    arrivals: dict[str, int] | None = None,
    aborts: dict[int, list[str]] | None = None,
    priorities: dict[str, int] | None = None,
    extras: dict[str, dict[str, Any]] | None = None,
    before_iteration: Callable[[int, Any, CanvasRunner], list[str]] | None = None,
    check_kv_every: int = 1,
    max_iterations: int = 200_000,
) -> RunResult:
    """Serve ``traces`` through ``sched`` with :class:`CanvasRunner`.

    ``arrivals``: request id -> the iteration before which it reaches vLLM (default: all at 0);
    ``aborts``: iteration -> request ids the client aborts before that iteration's
    ``schedule()`` (``finish_requests(..., FINISHED_ABORTED)``, as the engine does);
    ``before_iteration(iteration, sched, runner)``: called before each ``schedule()``, returns
    more request ids to abort (tests pick them from the live state, and check invariants).
    Iterations with nothing to run while requests are still to arrive are skipped (idle).
    """
    from vllm.v1.request import RequestStatus

    arrivals = arrivals or {t.rid: 0 for t in traces}
    aborts = dict(aborts or {})
    runner = CanvasRunner(traces)
    pending = sorted(traces, key=lambda t: (arrivals[t.rid], t.rid))
    res = RunResult(kv_free_before=_free_blocks(sched))
    t0 = time.perf_counter()
    it = 0
    nxt = 0
    while it < max_iterations:
        while nxt < len(pending) and arrivals[pending[nxt].rid] <= it:
            t = pending[nxt]
            sched.add_request(
                make_request(
                    t,
                    arrival_time=float(arrivals[t.rid]),
                    priority=(priorities or {}).get(t.rid, 0),
                    extra=(extras or {}).get(t.rid),
                )
            )
            res.arrival[t.rid] = it
            nxt += 1
        doomed = aborts.pop(it, [])
        if before_iteration is not None:
            doomed = doomed + before_iteration(it, sched, runner)
        for rid in doomed:
            ended = sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            res.aborted += [r.request_id for r in ended]
            runner.forget(rid)
        if not sched.has_unfinished_requests():
            if nxt >= len(pending) and not aborts:
                break
            it = max(it + 1, arrivals[pending[nxt].rid] if nxt < len(pending) else it + 1)
            res.idle_iterations += 1
            continue
        out = sched.schedule()
        res.preemptions += len(out.preempted_req_ids or ())
        res.max_running = max(res.max_running, len(sched.running))
        engine_out = runner.run(sched, out)
        it += 1
        res.iterations += 1
        for eco in engine_out.values():
            for o in eco.outputs:
                res.output_tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
                if o.finish_reason is not None and o.request_id not in res.completion:
                    res.completion[o.request_id] = it - res.arrival[o.request_id]
                    res.finish_order.append(o.request_id)
                    res.finish_reason[o.request_id] = str(o.finish_reason)
        if check_kv_every and it % check_kv_every == 0:
            res.kv_balanced_every_iteration &= _kv_balanced(sched, res.kv_free_before)
    res.kv_free_after = _free_blocks(sched)
    res.wall_seconds = time.perf_counter() - t0
    return res
