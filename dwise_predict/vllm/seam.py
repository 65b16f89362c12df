"""The one seam between the integration and vLLM: every vLLM name it subclasses, reads or calls.

vLLM loads a custom scheduler by qualified name (``--scheduler-cls``) and warns that the
interface is not public, so the integration depends on internals: the diffusion scheduler
classes, the base scheduler's queues and methods, fields of ``Request``, ``SchedulerOutput``
and ``ModelRunnerOutput``, the diffusion config. All of them are listed in :data:`SURFACE`
and read only through the functions here, the only module of the integration that imports
vLLM or looks inside a vLLM object (``dwise_predict.vllm.scheduler`` subclasses the classes
this module resolves). So a new vLLM release is one file to re-check:

* :func:`missing_names` resolves every entry when the scheduler is built (a class member must
  resolve; an instance attribute must be declared by its class: a dataclass field, an
  annotation, or an ``self.<name> =`` assignment in the class source);
* :func:`check_scheduler` checks the live scheduler's own attributes;
* either failure refuses to start with :class:`VLLMIncompatibleError` naming each dotted path;
* no read falls back to a default: a value vLLM does not provide is an error, not a guess.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Iterable
from typing import Any

from .. import engine_names
from ..engine_names import Name, package_version
from ..errors import ConfigError
from ..fingerprint import RESPONSE, ModelFingerprint

#: the vLLM release the integration was written and tested against
SUPPORTED_VLLM = "0.33.0"

DIFFUSION = "vllm.v1.core.sched.diffusion_scheduler"
SCHEDULER = "vllm.v1.core.sched.scheduler.Scheduler"
QUEUE = "vllm.v1.core.sched.request_queue"
REQUEST = "vllm.v1.request.Request"
STATUS = "vllm.v1.request.RequestStatus"
SAMPLING = "vllm.sampling_params.SamplingParams"
SCHED_OUT = "vllm.v1.core.sched.output.SchedulerOutput"
RUNNER_OUT = "vllm.v1.outputs.ModelRunnerOutput"
VLLM_CONFIG = "vllm.config.VllmConfig"
SCHED_CONFIG = "vllm.config.SchedulerConfig"
MODEL_CONFIG = "vllm.config.ModelConfig"
DIFF_CONFIG = "vllm.config.diffusion.DiffusionConfig"
KV_MANAGER = "vllm.v1.core.kv_cache_manager.KVCacheManager"
BLOCK_POOL = "vllm.v1.core.block_pool.BlockPool"


def _n(path: str, use: str, instance: bool = False) -> Name:
    return Name(path, use, instance)


#: every vLLM name the integration touches (docs/vllm.md lists them with what each is for)
SURFACE: tuple[Name, ...] = (
    # the classes subclassed, and the methods overridden (each calls vLLM's own)
    _n(f"{DIFFUSION}.DiffusionScheduler", "subclass"),
    _n(f"{DIFFUSION}.DiffusionAsyncScheduler", "subclass"),
    _n(f"{SCHEDULER}.__init__", "override"),
    _n(f"{SCHEDULER}.add_request", "override"),
    _n(f"{SCHEDULER}.schedule", "override"),
    _n(f"{SCHEDULER}.update_from_output", "override"),
    _n(f"{SCHEDULER}.finish_requests", "override"),
    # the scheduler's state
    _n(f"{SCHEDULER}.waiting", "write", True),  # reordered in place, same queue object
    _n(f"{SCHEDULER}.running", "write", True),  # reordered (a new list, same requests)
    _n(f"{SCHEDULER}.requests", "read", True),
    _n(f"{SCHEDULER}.policy", "read", True),
    _n(f"{SCHEDULER}.vllm_config", "read", True),
    _n(f"{SCHEDULER}.max_num_running_reqs", "read", True),
    _n(f"{SCHEDULER}.num_spec_tokens", "read", True),
    _n(f"{SCHEDULER}.kv_cache_manager", "read", True),
    _n(f"{KV_MANAGER}.block_pool", "read", True),
    _n(f"{BLOCK_POOL}.get_num_free_blocks", "call"),
    _n(f"{QUEUE}.SchedulingPolicy.FCFS", "value"),
    _n(f"{QUEUE}.FCFSRequestQueue", "call"),
    # configs
    _n(f"{VLLM_CONFIG}.model_config", "read", True),
    _n(f"{VLLM_CONFIG}.scheduler_config", "read", True),
    _n(f"{VLLM_CONFIG}.diffusion_config", "read", True),
    _n(f"{SCHED_CONFIG}.policy", "read", True),
    _n(f"{SCHED_CONFIG}.max_num_batched_tokens", "read", True),
    _n(f"{DIFF_CONFIG}.canvas_length", "read", True),
    _n(f"{DIFF_CONFIG}.max_denoising_steps", "read", True),
    _n(f"{MODEL_CONFIG}.model", "read", True),
    _n(f"{MODEL_CONFIG}.served_model_name", "read", True),
    _n(f"{MODEL_CONFIG}.revision", "read", True),
    _n(f"{MODEL_CONFIG}.hf_config", "read", True),
    _n(f"{MODEL_CONFIG}.get_hidden_size", "call"),
    _n(f"{MODEL_CONFIG}.try_get_generation_config", "call"),
    # a request
    _n(f"{REQUEST}.request_id", "read", True),
    _n(f"{REQUEST}.prompt_token_ids", "read", True),
    _n(f"{REQUEST}.num_prompt_tokens", "read", True),
    _n(f"{REQUEST}.num_computed_tokens", "read", True),
    _n(f"{REQUEST}.num_tokens", "read"),
    _n(f"{REQUEST}.sampling_params", "read", True),
    _n(f"{REQUEST}.arrival_time", "read", True),
    _n(f"{REQUEST}.status", "read", True),
    _n(f"{REQUEST}.is_finished", "call"),
    _n(f"{STATUS}.RUNNING", "value"),
    _n(f"{SAMPLING}.max_tokens", "read", True),
    _n(f"{SAMPLING}.extra_args", "read", True),
    # an iteration: what ran, and what came back
    _n(f"{SCHED_OUT}.num_scheduled_tokens", "read", True),
    _n(f"{SCHED_OUT}.scheduled_spec_decode_tokens", "read", True),
    _n(f"{SCHED_OUT}.preempted_req_ids", "read", True),
    _n(f"{RUNNER_OUT}.req_ids", "read", True),
    _n(f"{RUNNER_OUT}.req_id_to_index", "read", True),
    _n(f"{RUNNER_OUT}.sampled_token_ids", "read", True),
)

#: what the live scheduler object must carry once built
SCHEDULER_ATTRS = tuple(
    n.path.rsplit(".", 1)[1] for n in SURFACE if n.instance and n.path.startswith(SCHEDULER + ".")
)

#: ``SamplingParams.extra_args`` keys the integration reads (clients send them as
#: ``vllm_xargs``): the request's category (recorded, shown in stats), and for benchmarks and
#: tests the true denoising steps the ``oracle`` policy ranks by
EXTRA_CATEGORY = "category"
EXTRA_TRUE_ROUNDS = "dwise_true_rounds"


class VLLMIncompatibleError(ConfigError):
    """The installed vLLM lacks something the integration uses: refuse to start, name it."""


# -- verification ---------------------------------------------------------------------------------
def vllm_version() -> str | None:
    return package_version("vllm")


def missing_names(surface: Iterable[Name] = SURFACE) -> list[str]:
    """The entries of ``surface`` the installed vLLM does not provide (empty = all there)."""
    return engine_names.missing_names(surface)


def incompatibility_message(missing: list[str]) -> str:
    return (
        f"dwise-predict's vLLM scheduler needs {', '.join(missing)}, which vLLM "
        f"{vllm_version() or '(not installed)'} does not provide; it supports vLLM "
        f"{SUPPORTED_VLLM}: install vllm=={SUPPORTED_VLLM}, or drop --scheduler-cls to serve "
        "with vLLM's own diffusion scheduler"
    )


def require(surface: Iterable[Name] = SURFACE) -> None:
    missing = missing_names(surface)
    if missing:
        raise VLLMIncompatibleError(incompatibility_message(missing))


def resolve(path: str) -> Any:
    """The vLLM object at ``path``; :class:`VLLMIncompatibleError` naming it when absent."""
    try:
        return pkgutil.resolve_name(path)
    except Exception:
        raise VLLMIncompatibleError(incompatibility_message([path])) from None


def base_classes() -> tuple[type, type]:
    """(``DiffusionScheduler``, ``DiffusionAsyncScheduler``): what the DWISE classes extend."""
    return resolve(f"{DIFFUSION}.DiffusionScheduler"), resolve(
        f"{DIFFUSION}.DiffusionAsyncScheduler"
    )


def check_scheduler(sched: Any) -> None:
    """Refuse a live scheduler that lacks an attribute the integration reads."""
    missing = [f"{SCHEDULER}.{a}" for a in SCHEDULER_ATTRS if not hasattr(sched, a)]
    if missing:
        raise VLLMIncompatibleError(incompatibility_message(missing))


# -- the scheduler ------------------------------------------------------------------------------
def canvas_length(sched: Any) -> int:
    dc = sched.vllm_config.diffusion_config
    if dc is None or dc.canvas_length is None:
        raise ConfigError(
            "the DWISE scheduler is for dLLMs, but this vLLM server has no diffusion config "
            "(the model's config has no canvas_length): drop --scheduler-cls, or serve a dLLM"
        )
    return int(dc.canvas_length)


def uses_fcfs_queue(sched: Any) -> bool:
    """Whether vLLM's waiting queue is the FCFS deque (``--scheduling-policy fcfs``)."""
    from vllm.v1.core.sched.request_queue import SchedulingPolicy

    return bool(sched.policy == SchedulingPolicy.FCFS)


def scheduling_policy(sched: Any) -> str:
    return str(sched.vllm_config.scheduler_config.policy)


def prompt_chunk(sched: Any) -> int:
    """Prompt tokens one iteration can compute for a request: the token budget
    (``--max-num-batched-tokens``), the unit DWISE's prompt work is counted in here."""
    return int(sched.vllm_config.scheduler_config.max_num_batched_tokens)


def max_running(sched: Any) -> int:
    return int(sched.max_num_running_reqs)


def waiting(sched: Any) -> Any:
    """vLLM's waiting queue (an ``FCFSRequestQueue``, a deque, under the FCFS policy)."""
    return sched.waiting


def reorder_waiting(sched: Any, ordered: list[Any]) -> None:
    """Put the waiting queue's requests in ``ordered``'s order (the same queue object)."""
    queue = sched.waiting
    queue.clear()
    queue.extend(ordered)


def running(sched: Any) -> list[Any]:
    return sched.running  # type: ignore[no-any-return]


def set_running(sched: Any, ordered: list[Any]) -> None:
    sched.running = ordered


def live_requests(sched: Any) -> dict[str, Any]:
    """vLLM's ``requests`` map: every request it holds (waiting, running, or being freed)."""
    return sched.requests  # type: ignore[no-any-return]


def free_kv_blocks(sched: Any) -> int:
    return int(sched.kv_cache_manager.block_pool.get_num_free_blocks())


# -- a request ------------------------------------------------------------------------------------
def rid(req: Any) -> str:
    return str(req.request_id)


def prompt_ids(req: Any) -> list[int]:
    ids = req.prompt_token_ids
    return [] if ids is None else ids  # type: ignore[no-any-return]


def prompt_tokens(req: Any) -> int:
    return int(req.num_prompt_tokens)


def prompt_left(req: Any) -> int:
    """Prompt tokens not yet computed (0 once the prompt is in the KV cache)."""
    return max(0, int(req.num_prompt_tokens) - int(req.num_computed_tokens))


def context_left(req: Any) -> int:
    """Tokens of the committed context (prompt and committed canvases) not yet computed: after
    a preemption vLLM computes them all again."""
    return max(0, int(req.num_tokens) - int(req.num_computed_tokens))


def max_tokens(req: Any) -> int:
    sp = req.sampling_params
    return int(sp.max_tokens) if sp is not None and sp.max_tokens is not None else 0


def extra_args(req: Any) -> dict[str, Any]:
    sp = req.sampling_params
    extra = None if sp is None else sp.extra_args
    return dict(extra) if extra else {}


def arrival_time(req: Any) -> float:
    return float(req.arrival_time)


def finished(req: Any) -> bool:
    return bool(req.is_finished())


def is_running(req: Any) -> bool:
    from vllm.v1.request import RequestStatus

    return bool(req.status == RequestStatus.RUNNING)


# -- an iteration -------------------------------------------------------------------------------
def scheduled(out: Any) -> dict[str, int]:
    """Request id -> tokens scheduled this iteration."""
    return out.num_scheduled_tokens  # type: ignore[no-any-return]


def spec_scheduled(out: Any) -> dict[str, list[int]]:
    """Request id -> canvas tokens scheduled (a denoising or commit step), else absent."""
    return out.scheduled_spec_decode_tokens  # type: ignore[no-any-return]


def preempted(out: Any) -> set[str]:
    return set(out.preempted_req_ids or ())


def sampled(runner_out: Any) -> dict[str, int]:
    """Request id -> tokens the model runner emitted this iteration (a commit emits the
    canvas; a prompt chunk or a denoising step emits none)."""
    ids = runner_out.req_ids
    toks = runner_out.sampled_token_ids
    if not toks:
        return dict.fromkeys(ids, 0)
    idx = runner_out.req_id_to_index
    return {r: len(toks[idx[r]]) for r in ids}


# -- the fingerprint ------------------------------------------------------------------------------
def server_fingerprint(sched: Any) -> ModelFingerprint:
    """The fingerprint of what this vLLM scheduler serves, from vLLM's own configs.

    model id = ``--served-model-name`` if given, else the model path; block size = the canvas
    length; at most ``max_denoising_steps`` steps a block (the diffusion config's, else the
    generation config's, else DiffusionGemma's default of 48); the decoder from the generation
    config: a ``confidence_threshold`` alone reads as ``low_confidence`` at that threshold,
    with an ``entropy_bound`` as DiffusionGemma's ``entropy_bounded`` sampler (threshold = the
    confidence threshold, the bound in ``extra``). Hidden size from the model config; mask id
    from the HF config when it states one. vLLM's canvas starts at the prompt's end, so blocks
    are ``response``-aligned.
    """
    vc = sched.vllm_config
    mc = vc.model_config
    dc = vc.diffusion_config
    gen = dict(mc.try_get_generation_config() or {})
    served = mc.served_model_name
    if isinstance(served, (list, tuple)):
        served = served[0] if served else None
    model_id = served or mc.model
    steps = (dc.max_denoising_steps if dc is not None else None) or gen.get(
        "max_denoising_steps", 48
    )
    if "confidence_threshold" not in gen:
        raise ConfigError(
            f"the generation config of {model_id} states no confidence_threshold, so the "
            "decoding setting the bundle must match is unknown: add it to the model's "
            "generation_config.json"
        )
    threshold = float(gen["confidence_threshold"])
    bound = gen.get("entropy_bound")
    decoding = "low_confidence" if bound is None else "entropy_bounded"
    extra = {} if bound is None else {"entropy_bound": float(bound)}
    mask = getattr(mc.hf_config, "mask_token_id", None)
    return ModelFingerprint(
        model_id=str(model_id),
        block_size=canvas_length(sched),
        threshold=threshold,
        decoding=decoding,
        mask_token_id=None if mask is None else int(mask),
        max_steps_per_block=int(steps),
        hidden_size=int(mc.get_hidden_size()),
        revision=mc.revision,
        extra=extra,
        block_alignment=RESPONSE,
    )
