"""The one seam between the plugin and SGLang: every SGLang name it reads, writes, calls or hooks.

SGLang's dLLM scheduler has no public API for a scheduling plugin, so the plugin touches
internals: private methods, instance attributes, an enum, the hidden-state layout. All of them
are listed in :data:`SURFACE` and used only through the functions of this module, which is the
only module of the plugin that imports SGLang or looks inside an SGLang object. So a new SGLang
release is one file to re-check, and a renamed field cannot go unnoticed:

* :func:`missing_names` resolves every entry of :data:`SURFACE` when the plugin registers (a
  class member must resolve; an instance attribute must be declared by its class: a dataclass
  or struct field, an annotation, or an ``self.<name> =`` assignment in the class source);
* :func:`check_scheduler` checks the live scheduler's own attributes when the plugin attaches;
* either failure refuses to start the server with a message naming each missing name;
* no read here falls back to a default: a value SGLang does not provide is an error, not a
  guess (``tests/test_sglang_seam.py`` checks that every name used in this module is listed).

Hot paths take and return whole lists (a round's requests), not one request per call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from .. import engine_names
from ..engine_names import Name, package_version
from ..errors import ConfigError
from ..fingerprint import ABSOLUTE, RESPONSE, ModelFingerprint

#: the SGLang release the plugin was written and tested against
SUPPORTED_SGLANG = "0.5.23"

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
MIXIN = "sglang.srt.dllm.mixin.scheduler.SchedulerDllmMixin"
MANAGER = "sglang.srt.dllm.mixin.scheduler.DllmManager"
DLLM_CONFIG = "sglang.srt.dllm.config.DllmConfig"
PHASE = "sglang.srt.dllm.mixin.req.DllmReqPhase"
REQ = "sglang.srt.managers.schedule_batch.Req"
BATCH = "sglang.srt.managers.schedule_batch.ScheduleBatch"
FINISH = "sglang.srt.managers.schedule_batch"
ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
RESULT = "sglang.srt.managers.utils.GenerationBatchResult"
LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor"
LOGITS_OUT = "sglang.srt.layers.logits_processor.LogitsProcessorOutput"
ABORT = "sglang.srt.managers.io_struct.AbortReq"
MODE = "sglang.srt.model_executor.forward_batch_info.ForwardMode"
SAMPLING = "sglang.srt.sampling.sampling_params.SamplingParams"
ALLOCATOR = "sglang.srt.mem_cache.allocator.base.BaseTokenToKVPoolAllocator"
REQ_POOL = "sglang.srt.mem_cache.memory_pool.ReqToTokenPool"
PARALLEL_CTX = "sglang.srt.runtime_context.ParallelContext"
HOOKS = "sglang.srt.plugins.hook_registry"
PARALLEL = "sglang.srt.runtime_context.get_parallel"
SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
MODEL_CONFIG = "sglang.srt.configs.model_config.ModelConfig"
REPORTER = "sglang.srt.managers.scheduler_components.metrics_reporter.SchedulerMetricsReporter"
COLLECTOR = "sglang.srt.observability.metrics_collector.SchedulerMetricsCollector"
DP_CONTROLLER = "sglang.srt.managers.data_parallel_controller.DataParallelController"
TOKENIZED = "sglang.srt.managers.io_struct.TokenizedGenerateReqInput"
SNAPSHOTS = "sglang.srt.managers.load_snapshot"
PORT_ARGS = "sglang.srt.server_args.PortArgs"


def _n(path: str, use: str, instance: bool = False) -> Name:
    return Name(path, use, instance)


#: every SGLang name the plugin touches (docs/sglang.md lists them with what each is for)
SURFACE: tuple[Name, ...] = (
    # hooks
    _n(f"{SCHEDULER}.__init__", "hook"),
    _n(f"{SCHEDULER}.abort_request", "hook"),
    _n(f"{MIXIN}._process_dllm_batches", "hook"),
    _n(f"{MIXIN}._fetch_waiting_reqs", "hook"),
    _n(f"{MIXIN}.process_batch_result_dllm", "hook"),
    _n(f"{LOGITS}._get_dllm_logits", "hook"),
    _n(f"{HOOKS}.HookRegistry.register", "call"),
    _n(f"{HOOKS}.HookType.BEFORE", "value"),
    _n(f"{HOOKS}.HookType.AFTER", "value"),
    _n(f"{HOOKS}.HookType.AROUND", "value"),
    # the scheduler and its dLLM queues
    _n(f"{MIXIN}._process_batch_by_phase", "call"),
    _n(f"{SCHEDULER}.waiting_queue", "write", True),  # read, and replaced on admission
    _n(f"{SCHEDULER}.dllm_manager", "read", True),
    _n(f"{SCHEDULER}.dllm_config", "read", True),
    _n(f"{SCHEDULER}.token_to_kv_pool_allocator", "read", True),
    _n(f"{SCHEDULER}.req_to_token_pool", "read", True),
    _n(f"{SCHEDULER}.tokenizer", "read", True),
    _n(f"{SCHEDULER}.server_args", "read", True),
    _n(f"{SCHEDULER}.model_config", "read", True),
    _n(f"{SCHEDULER}.metrics_reporter", "read", True),
    _n(PARALLEL, "call"),
    _n(f"{PARALLEL_CTX}.tp_rank", "read", True),
    _n(f"{PARALLEL_CTX}.dp_rank", "read", True),
    _n(f"{ALLOCATOR}.size", "read", True),
    _n(f"{REQ_POOL}.size", "read", True),
    _n(f"{SERVER_ARGS}.served_model_name", "read", True),
    _n(f"{SERVER_ARGS}.model_path", "read", True),
    _n(f"{SERVER_ARGS}.revision", "read", True),
    _n(f"{MODEL_CONFIG}.hidden_size", "read", True),
    _n(f"{REPORTER}.enable_metrics", "read", True),
    _n(f"{REPORTER}.metrics_collector", "read", True),
    _n(f"{COLLECTOR}.labels", "read", True),
    _n(f"{MANAGER}.waiting_queue", "read", True),
    _n(f"{MANAGER}.add_waiting_reqs", "call"),
    _n(f"{DLLM_CONFIG}.block_size", "read", True),
    _n(f"{DLLM_CONFIG}.mask_id", "read", True),
    _n(f"{DLLM_CONFIG}.algorithm", "read", True),
    _n(f"{DLLM_CONFIG}.algorithm_config", "read", True),
    _n(f"{DLLM_CONFIG}.first_done_first_out_mode", "read", True),
    _n(f"{DLLM_CONFIG}.requires_separate_context_encoding", "read", True),
    _n(f"{PHASE}.STAGING_DECODE", "value"),
    _n(f"{PHASE}.INCOMING_DECODE", "value"),
    _n(f"{PHASE}.STAGING_PREFILL", "value"),
    _n(f"{PHASE}.INCOMING_PREFILL", "value"),
    _n(f"{MODE}.DLLM_EXTEND", "value"),
    # a round: the adder, the batch, its result
    _n(f"{ADDER}.rem_dllm_tokens", "write", True),
    _n(f"{ADDER}.can_run_list", "read", True),
    _n(f"{BATCH}.reqs", "read", True),
    _n(f"{RESULT}.accept_length_per_req_cpu", "read", True),
    _n(f"{RESULT}.logits_output", "read", True),
    _n(f"{LOGITS_OUT}.hidden_states", "write", True),
    # a request
    _n(f"{REQ}.rid", "read", True),
    _n(f"{REQ}.origin_input_ids", "read", True),
    _n(f"{REQ}.sampling_params", "read", True),
    _n(f"{SAMPLING}.max_new_tokens", "read", True),
    _n(f"{REQ}.output_ids", "read", True),
    _n(f"{REQ}.finished_reason", "read", True),
    _n(f"{REQ}.extra_key", "read", True),
    _n(f"{REQ}.finished", "call"),
    _n(f"{REQ}.is_dllm_prefill", "call"),
    _n(f"{FINISH}.FINISH_ABORT", "value"),
    _n(f"{FINISH}.FINISH_LENGTH", "value"),
    _n(f"{FINISH}.FINISH_MATCHED_TOKEN", "value"),
    _n(f"{ABORT}.rid", "read", True),
    _n(f"{ABORT}.abort_all", "read", True),
    # the fleet: the work report beside SGLang's load snapshot, the controller's dwise method
    _n(f"{SCHEDULER}.publish_load_snapshot", "hook"),
    _n(f"{SCHEDULER}.load_snapshot_writer", "read", True),
    _n(f"{SNAPSHOTS}.ShmLoadSnapshotWriter", "value"),
    _n(f"{SNAPSHOTS}.ShmLoadSnapshotWriter.path", "read", True),
    _n(f"{SNAPSHOTS}.ShmLoadSnapshotWriter.dp_size", "read", True),
    _n(f"{SNAPSHOTS}.ShmLoadSnapshotWriter.dp_rank", "read", True),
    _n(f"{SNAPSHOTS}.LoadSnapshot.timestamp", "read", True),
    _n(f"{SNAPSHOTS}.shm_path_for", "call"),
    _n(f"{DP_CONTROLLER}.__init__", "hook"),
    _n(f"{DP_CONTROLLER}.refresh_load_budget", "hook"),
    _n(f"{DP_CONTROLLER}.dispatching", "write", True),
    _n(f"{DP_CONTROLLER}.refresh_load_budget_on_dispatch", "write", True),
    _n(f"{DP_CONTROLLER}.load_balance_method", "read", True),
    _n(f"{DP_CONTROLLER}.workers", "read", True),
    _n(f"{DP_CONTROLLER}._active_workers", "read", True),
    _n(f"{DP_CONTROLLER}._last_refresh_time", "read", True),
    _n(f"{DP_CONTROLLER}.port_args", "read", True),
    _n(f"{DP_CONTROLLER}.maybe_external_dp_rank_routing", "call"),
    _n(f"{PORT_ARGS}.instance_id", "read", True),
    _n("sglang.srt.managers.io_struct.sock_send", "call"),
    _n(f"{TOKENIZED}.rid", "read", True),
    _n(f"{TOKENIZED}.input_ids", "read", True),
    _n(f"{TOKENIZED}.input_text", "read", True),
)


def _instance_attrs(owner: str) -> tuple[str, ...]:
    return tuple(
        n.path.rsplit(".", 1)[1] for n in SURFACE if n.instance and n.path.startswith(owner + ".")
    )


#: what the live scheduler object, and its dLLM manager, must carry when the plugin attaches
SCHEDULER_ATTRS = _instance_attrs(SCHEDULER)
MANAGER_ATTRS = _instance_attrs(MANAGER)

#: SGLang algorithm class name -> the decoding name traces and bundles record
DECODING_NAMES = {"LowConfidence": "low_confidence", "JointThreshold": "joint_threshold"}
#: each algorithm's default threshold when its config file sets none (0.5.23's sources)
DEFAULT_THRESHOLDS = {"LowConfidence": 0.95, "JointThreshold": 0.5}


class SGLangIncompatibleError(ConfigError):
    """The installed SGLang lacks something the plugin uses: refuse to start, name it."""


# -- verification ---------------------------------------------------------------------------------
def sglang_version() -> str | None:
    return package_version("sglang")


def missing_names(surface: Iterable[Name] = SURFACE) -> list[str]:
    """The entries of ``surface`` the installed SGLang does not provide (empty = all there)."""
    return engine_names.missing_names(surface)


def incompatibility_message(missing: list[str]) -> str:
    return (
        f"dwise-predict's SGLang plugin needs {', '.join(missing)}, which SGLang "
        f"{sglang_version() or '(not installed)'} does not provide; the plugin supports SGLang "
        f"{SUPPORTED_SGLANG}: install sglang=={SUPPORTED_SGLANG}, or unset DWISE_SGLANG_BUNDLE "
        "to serve without the plugin"
    )


def check_scheduler(sched: Any) -> None:
    """Refuse a live scheduler that lacks an attribute the plugin reads (named in the error)."""
    missing = [f"{SCHEDULER}.{a}" for a in SCHEDULER_ATTRS if not hasattr(sched, a)]
    if not missing and sched.dllm_config is not None:
        mgr = sched.dllm_manager
        missing += [f"{MANAGER}.{a}" for a in MANAGER_ATTRS if not hasattr(mgr, a)]
    if missing:
        raise SGLangIncompatibleError(incompatibility_message(missing))


def register_hook(target: str, fn: Callable[..., Any], kind: str) -> None:
    """``HookRegistry.register(target, fn, HookType.<kind>)``; kind: BEFORE, AFTER, AROUND."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {"BEFORE": HookType.BEFORE, "AFTER": HookType.AFTER, "AROUND": HookType.AROUND}
    HookRegistry.register(target, fn, kinds[kind])


# -- the scheduler --------------------------------------------------------------------------------
def dllm_config(sched: Any) -> Any:
    """The server's dLLM config, or None when it serves no dLLM."""
    return sched.dllm_config


def block_size(sched: Any) -> int:
    return int(sched.dllm_config.block_size)


def fdfo(sched: Any) -> bool:
    return bool(sched.dllm_config.first_done_first_out_mode)


def separate_context_encoding(sched: Any) -> bool:
    return bool(sched.dllm_config.requires_separate_context_encoding)


def algorithm(sched: Any) -> str:
    return str(sched.dllm_config.algorithm)


def kv_pool_tokens(sched: Any) -> int:
    return int(sched.token_to_kv_pool_allocator.size)


def request_slots(sched: Any) -> int:
    return int(sched.req_to_token_pool.size)


def tokenizer(sched: Any) -> Any:
    """The server's tokenizer; None when it runs with ``--skip-tokenizer-init``."""
    return sched.tokenizer


def ranks() -> tuple[int, int]:
    """(TP rank, DP rank) of this scheduler process; DP rank 0 without data parallelism."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    dp = parallel.dp_rank
    return int(parallel.tp_rank), 0 if dp is None else int(dp)


def metrics_labels(sched: Any) -> dict[str, str] | None:
    """SGLang's Prometheus labels when it exports metrics (``--enable-metrics``), else None."""
    reporter = sched.metrics_reporter
    if not reporter.enable_metrics:
        return None
    labels = dict(reporter.metrics_collector.labels)
    return {str(k): str(v) for k, v in labels.items()}


def waiting(sched: Any) -> list[Any]:
    """SGLang's waiting queue: requests not yet admitted (arrivals are appended)."""
    return sched.waiting_queue  # type: ignore[no-any-return]


def set_waiting(sched: Any, queue: list[Any]) -> None:
    sched.waiting_queue = queue


def residents(sched: Any) -> list[Any]:
    """The dLLM resident set: admitted requests, each holding a request slot and KV."""
    return sched.dllm_manager.waiting_queue  # type: ignore[no-any-return]


def admit(sched: Any, reqs: list[Any]) -> None:
    sched.dllm_manager.add_waiting_reqs(reqs)


#: SGLang constants looked up once, on first use (a lookup per round costs microseconds)
_CONSTANTS: dict[str, Any] = {}


def run_phase(
    sched: Any, adder: Any, reqs: list[Any], *, prefill: bool, running_batch: Any
) -> None:
    """Hand ``reqs`` (all decode, or all prefill) to SGLang's own per-phase batch building."""
    if "prefill" not in _CONSTANTS:
        from sglang.srt.dllm.mixin.req import DllmReqPhase

        _CONSTANTS["prefill"] = (DllmReqPhase.STAGING_PREFILL, DllmReqPhase.INCOMING_PREFILL)
        _CONSTANTS["decode"] = (DllmReqPhase.STAGING_DECODE, DllmReqPhase.INCOMING_DECODE)
    staging, incoming = _CONSTANTS["prefill" if prefill else "decode"]
    sched._process_batch_by_phase(adder, reqs, staging, incoming, running_batch=running_batch)


def mixed_forward_mode() -> Any:
    """The forward mode of a round whose rows are each one block, prompt or output alike."""
    if "mode" not in _CONSTANTS:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        _CONSTANTS["mode"] = ForwardMode.DLLM_EXTEND
    return _CONSTANTS["mode"]


def set_round_budget(adder: Any, tokens: int) -> None:
    adder.rem_dllm_tokens = int(tokens)


def planned(adder: Any) -> list[Any]:
    """The requests SGLang's adder accepted into the round."""
    return adder.can_run_list  # type: ignore[no-any-return]


def abort_target(recv_req: Any) -> tuple[bool, str]:
    """(abort_all, rid prefix) of an ``AbortReq``; SGLang ends every request whose rid starts
    with the prefix."""
    return bool(recv_req.abort_all), str(recv_req.rid or "")


# -- a round's result -----------------------------------------------------------------------------
def batch_requests(batch: Any) -> list[Any]:
    return batch.reqs  # type: ignore[no-any-return]


def accept_lengths(result: Any) -> list[int]:
    """Per request of the batch: tokens accepted (0 = its block is still unresolved).

    SGLang's FDFO path asserts these exist; a result without them is a broken invariant."""
    acc = result.accept_length_per_req_cpu
    if acc is None:
        raise SGLangIncompatibleError(
            "SGLang's FDFO dLLM result carries no accept_length_per_req_cpu: the plugin cannot "
            "tell which blocks resolved (sync mode is refused at start-up)"
        )
    return acc  # type: ignore[no-any-return]


def round_hidden(result: Any) -> Any:
    """The round's final-norm hidden rows, [batch * block, hidden], kept by the logits hook;
    None when the forward ran without the hook (refinement off)."""
    out = result.logits_output
    return None if out is None else out.hidden_states


def pool_block_rows(
    hidden: Any, idx: list[int], tails: list[int], block_size: int, batch_size: int
) -> np.ndarray:
    """Mean of each listed request's output-block rows of ``hidden``, one host copy in all.

    SGLang's dLLM forward lays the batch out as ``batch_size`` blocks of ``block_size`` rows
    (one block per request, in batch order); request ``idx[j]``'s block shares its first
    ``tails[j]`` rows with the prompt, which are left out. The pooling runs on the tensor's
    own device (the GPU), so only the pooled [len(idx), hidden] rows cross to the host.
    """
    rows, width = int(hidden.shape[0]), int(hidden.shape[-1])
    if rows != batch_size * block_size:
        raise SGLangIncompatibleError(
            f"the dLLM forward returned {rows} hidden rows for {batch_size} requests of "
            f"{block_size}-token blocks; the plugin expects one block of rows per request"
        )
    import torch  # present wherever SGLang runs; imported here so the core stays light

    dev = hidden.device
    blocks = hidden.view(batch_size, block_size, width)[torch.as_tensor(idx, device=dev)]
    pos = torch.arange(block_size, device=dev)
    keep = (pos[None, :] >= torch.as_tensor(tails, device=dev)[:, None]).float()
    pooled = (blocks.float() * keep[:, :, None]).sum(dim=1) / keep.sum(dim=1, keepdim=True)
    return pooled.cpu().numpy().astype(np.float32, copy=False)


def keep_hidden(logits_output: Any, hidden: Any) -> None:
    logits_output.hidden_states = hidden


# -- a request ------------------------------------------------------------------------------------
def rid(req: Any) -> Any:
    return req.rid


def prompt_ids(req: Any) -> Any:
    return req.origin_input_ids


def max_new_tokens(req: Any) -> int:
    return int(req.sampling_params.max_new_tokens)


def output_ids(req: Any) -> list[int]:
    return list(req.output_ids)


def label(req: Any) -> str | None:
    """The client's ``extra_key`` (a classification SGLang also keys its prefix cache on)."""
    key = req.extra_key
    return None if key is None else str(key)


def finished(req: Any) -> bool:
    return bool(req.finished())


def in_prefill(req: Any) -> bool:
    return bool(req.is_dllm_prefill())


def end_kind(req: Any) -> str:
    """How a finished request ended: ``eos``, ``length``, ``abort`` or ``other``."""
    return _END_KINDS.get(type(req.finished_reason).__name__, "other")


#: SGLang's finish-reason classes (schedule_batch.FINISH_*) by name, and what each means
_END_KINDS = {"FINISH_MATCHED_TOKEN": "eos", "FINISH_LENGTH": "length", "FINISH_ABORT": "abort"}


# -- the fingerprint ------------------------------------------------------------------------------
def max_steps_per_block(decoding: str, block_size: int, algo_cfg: dict[str, Any]) -> int | None:
    """``S`` of SGLang's decoder: LowConfidence unmasks at least one token a step, so a block
    takes at most ``block_size`` steps; JointThreshold may then edit for up to
    ``max_post_edit_steps`` more, plus the step that finds nothing left to change (the rule
    the tracer records, docs/tracing.md). None for an algorithm we do not know: unchecked."""
    if decoding == "low_confidence":
        return block_size
    if decoding == "joint_threshold":
        return block_size + int(algo_cfg.get("max_post_edit_steps", 16)) + 1
    return None


def server_fingerprint(sched: Any) -> ModelFingerprint:
    """The fingerprint of what this SGLang scheduler serves, from SGLang's own config.

    model id = ``--served-model-name`` if given, else ``--model-path``; revision; block size,
    mask id, algorithm and its threshold from the dLLM config; hidden size from the model's
    config (None when the config states none: the check then skips that field). Block
    alignment: SGLang's dLLM loop places blocks at absolute positions (floor(L / block) prompt
    blocks, the prompt's tail in the first output block) unless the algorithm encodes the
    context in a separate pass, which starts the first block at the prompt's end (response).
    """
    dc = sched.dllm_config
    sa = sched.server_args
    algo = str(dc.algorithm)
    algo_cfg = dict(dc.algorithm_config or {})
    # the algorithm's own default when its config file sets no threshold (SGLang's rule)
    threshold = float(algo_cfg.get("threshold", DEFAULT_THRESHOLDS.get(algo, float("nan"))))
    model_id = sa.served_model_name or sa.model_path
    hidden = sched.model_config.hidden_size
    extra = {k: v for k, v in algo_cfg.items() if k != "threshold"}
    decoding = DECODING_NAMES.get(algo, algo)
    return ModelFingerprint(
        model_id=str(model_id),
        block_size=int(dc.block_size),
        threshold=threshold,
        decoding=decoding,
        mask_token_id=int(dc.mask_id),
        max_steps_per_block=max_steps_per_block(decoding, int(dc.block_size), algo_cfg),
        hidden_size=int(hidden) if hidden is not None else None,
        revision=sa.revision,
        extra={"sglang_algorithm_config": extra},
        block_alignment=RESPONSE if separate_context_encoding(sched) else ABSOLUTE,
    )


# -- the fleet: load reports and the data-parallel controller ------------------------------------
def load_snapshot_file(sched: Any) -> tuple[str, int, int] | None:
    """(path, DP size, DP rank) of the shared-memory file SGLang writes this scheduler's load
    snapshots to; None when it sends them over zmq (multi-node) or writes none (not rank 0)."""
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotWriter

    writer = sched.load_snapshot_writer
    if not isinstance(writer, ShmLoadSnapshotWriter):
        return None
    return str(writer.path), int(writer.dp_size), int(writer.dp_rank)


def snapshot_time(load: Any) -> float:
    """When SGLang took a ``LoadSnapshot`` (``time.time()`` seconds)."""
    return float(load.timestamp)


def controller_snapshot_file(controller: Any) -> str:
    """The shared-memory file the controller reads the schedulers' load snapshots from."""
    from sglang.srt.managers.load_snapshot import shm_path_for

    return str(shm_path_for(controller.port_args.instance_id))


def dp_ranks(controller: Any) -> int:
    return len(controller.workers)


def active_ranks(controller: Any) -> list[int]:
    """The ranks the controller may route to now (all of them unless elastic EP changed it)."""
    return list(controller._active_workers)


def sglang_method(controller: Any) -> tuple[str, Callable[[Any], None]]:
    """(name, dispatch function) of the method SGLang's controller was started with."""
    return str(controller.load_balance_method.name).lower(), controller.dispatching


def install_dispatch(controller: Any, fn: Callable[[Any], None]) -> None:
    """Route every request through ``fn``, with SGLang's load budget refreshed before each
    dispatch (the refresh the plugin's own reports are read in)."""
    controller.dispatching = fn
    controller.refresh_load_budget_on_dispatch = True


def current_dispatch(controller: Any) -> Any:
    return controller.dispatching


def last_refresh(controller: Any) -> float:
    """When the controller last read the load snapshots (its 20 ms throttle's clock)."""
    return float(controller._last_refresh_time)


def route_pinned(controller: Any, tokenized: Any) -> bool:
    """SGLang's own routing of a request that names its rank (``routed_dp_rank``); True when
    it sent the request."""
    return bool(controller.maybe_external_dp_rank_routing(tokenized))


def send_to_rank(controller: Any, rank: int, tokenized: Any) -> None:
    from sglang.srt.managers.io_struct import sock_send

    sock_send(controller.workers[rank], tokenized)


def tokenized_prompt(tokenized: Any) -> tuple[Any, str, Any]:
    """(request id, prompt text or "", prompt token ids) of a tokenized generate request."""
    text = tokenized.input_text
    return tokenized.rid, text if isinstance(text, str) else "", tokenized.input_ids
