"""What the plugin reads from SGLang: its version, the hook targets, the server's fingerprint.

Everything SGLang-specific that a new SGLang release could move lives here, so a version bump
is one file to re-check. Nothing imports SGLang at module import time.
"""

from __future__ import annotations

import importlib.metadata
import pkgutil
from typing import Any

from ..errors import ConfigError
from ..fingerprint import ModelFingerprint

#: the SGLang release the hooks were written and tested against
SUPPORTED_SGLANG = "0.5.23"

MIXIN = "sglang.srt.dllm.mixin.scheduler.SchedulerDllmMixin"
SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor"

#: every dotted path the plugin hooks or calls; checked before anything is registered
HOOK_TARGETS: tuple[str, ...] = (
    f"{SCHEDULER}.__init__",
    f"{MIXIN}._process_dllm_batches",
    f"{MIXIN}._fetch_waiting_reqs",
    f"{MIXIN}._process_batch_by_phase",
    f"{MIXIN}.process_batch_result_dllm",
    f"{LOGITS}._get_dllm_logits",
    "sglang.srt.dllm.mixin.req.DllmReqPhase.STAGING_DECODE",
    "sglang.srt.managers.schedule_policy.PrefillAdder.rem_dllm_tokens",
)

#: SGLang algorithm class name -> the decoding name traces and bundles record
DECODING_NAMES = {"LowConfidence": "low_confidence", "JointThreshold": "joint_threshold"}
#: each algorithm's default threshold when its config file sets none (0.5.23's sources)
DEFAULT_THRESHOLDS = {"LowConfidence": 0.95, "JointThreshold": 0.5}


class SGLangIncompatibleError(ConfigError):
    """The installed SGLang lacks something the plugin hooks: refuse to start, name it."""


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def missing_targets(targets: tuple[str, ...] = HOOK_TARGETS) -> list[str]:
    """The dotted paths that do not resolve in the installed SGLang (empty = all present).

    ``PrefillAdder.rem_dllm_tokens`` is an instance attribute, so it is checked by name in
    the class source rather than resolved.
    """
    out = []
    for target in targets:
        if target.endswith(".rem_dllm_tokens"):
            try:
                import inspect

                cls = pkgutil.resolve_name(target.rsplit(".", 1)[0])
                if "rem_dllm_tokens" not in inspect.getsource(cls):
                    out.append(target)
            except Exception:
                out.append(target)
            continue
        try:
            pkgutil.resolve_name(target)
        except Exception:  # ImportError, AttributeError, ValueError: all mean "not there"
            out.append(target)
    return out


def incompatibility_message(missing: list[str]) -> str:
    return (
        f"dwise-predict's SGLang plugin cannot hook {', '.join(missing)} in SGLang "
        f"{sglang_version() or '(not installed)'}; the plugin supports SGLang "
        f"{SUPPORTED_SGLANG}: install sglang=={SUPPORTED_SGLANG}, or unset DWISE_SGLANG_BUNDLE "
        "to serve without the plugin"
    )


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


def server_fingerprint(scheduler: Any) -> ModelFingerprint:
    """The fingerprint of what this SGLang scheduler serves, from SGLang's own config.

    model id = ``--served-model-name`` if given, else ``--model-path``; revision; block size,
    mask id, algorithm and its threshold from the dLLM config; hidden size from the model's
    config (None when unknown: the check then skips that field).
    """
    dc = scheduler.dllm_config
    sa = getattr(scheduler, "server_args", None)
    algo = str(dc.algorithm)
    algo_cfg = dict(dc.algorithm_config or {})
    threshold = float(algo_cfg.get("threshold", DEFAULT_THRESHOLDS.get(algo, float("nan"))))
    model_id = (
        getattr(sa, "served_model_name", None) or getattr(sa, "model_path", None) or "unknown"
    )
    mc = getattr(scheduler, "model_config", None)
    hidden = getattr(mc, "hidden_size", None)
    if hidden is None:
        hidden = getattr(getattr(mc, "hf_config", None), "hidden_size", None)
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
        revision=getattr(sa, "revision", None),
        extra={"sglang_algorithm_config": extra},
    )
