"""The SGLang plugin entry point: :func:`register`, loaded by ``sglang.srt.plugins.load_plugins``.

SGLang calls :func:`register` in every process it starts (server, scheduler, detokenizer),
inside the spawned scheduler process before CUDA-graph capture. It only registers hooks by
dotted path; the bundle is loaded and checked in :func:`attach`, which the hook on the end of
``Scheduler.__init__`` runs, so a wrong bundle or an unsupported setting stops the scheduler
(and so the server) at start-up with a message that names both sides.

Hooks (each translates SGLang objects into the core runtime's plan/update calls):

* ``Scheduler.__init__`` (AFTER): :func:`attach`: fingerprint check, pool sizes, state;
* ``SchedulerDllmMixin._fetch_waiting_reqs`` (AROUND): under ``dwise`` admission is the
  plan's, so SGLang's own FIFO top-up is skipped;
* ``SchedulerDllmMixin._process_dllm_batches`` (AROUND): the round composition;
* ``Scheduler.abort_request`` (AROUND): after SGLang ended the requests a client aborted,
  the core forgets them too (their KV reservations and rows come back);
* ``SchedulerDllmMixin.process_batch_result_dllm`` (AROUND): resolved blocks, refinement;
* ``Scheduler.publish_load_snapshot`` (AROUND): the outstanding predicted work, as gauges and
  a report beside SGLang's load snapshot (:mod:`.load`);
* ``DataParallelController.__init__`` (AFTER) and ``.refresh_load_budget`` (AROUND), with
  ``DWISE_SGLANG_DISPATCH=dwise``: the controller dispatches by predicted work (:mod:`.dispatch`);
* ``LogitsProcessor._get_dllm_logits`` (AROUND, refinement on): keeps the final-norm rows on
  the returned ``LogitsProcessorOutput.hidden_states``. Registered before CUDA-graph capture,
  so the captured decode graph returns them too and its replay slices them to the batch;
  they live in the graph's static output buffer, so the plugin pools them (on the device, one
  host copy a round) in ``process_batch_result_dllm`` before the next forward overwrites them.

Every SGLang name used here goes through :mod:`.seam`, which checks them all at start-up.

SGLang's ``load_plugins`` logs and swallows exceptions raised here, so a failure that must
stop the server (a hook target missing from this SGLang version, a bad setting) is turned into
a hook on ``Scheduler.__init__`` that raises it there.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..errors import BundleError, ConfigError, DwisePredictError
from . import seam
from .config import OBSERVED, PluginConfig, load_config
from .metrics import gauges_for
from .seam import (
    DP_CONTROLLER,
    LOGITS,
    MIXIN,
    SCHEDULER,
    SGLangIncompatibleError,
    incompatibility_message,
    missing_names,
    server_fingerprint,
)

if TYPE_CHECKING:
    from ..bundle import Bundle
    from .observe import ObserveServing
    from .serving import DwiseServing

log = logging.getLogger(__name__)

#: the attribute that holds the plugin's state on an SGLang Scheduler
STATE_ATTR = "dwise_serving"


def attach(scheduler: Any, config: PluginConfig) -> Any:
    """Load and check the bundle against this scheduler, and hang the plugin's state on it.

    Refuses (raises) a bundle trained for another model/block size/threshold, sync (non-FDFO)
    mode, and algorithms that cannot share a round between prompt and denoising blocks.
    """
    from ..bundle import load_bundle

    seam.check_scheduler(scheduler)
    if seam.dllm_config(scheduler) is None:
        raise ConfigError(
            "the dwise plugin is on but this SGLang server runs no dLLM "
            "(--dllm-algorithm is unset): unset DWISE_SGLANG_BUNDLE and "
            "DWISE_SGLANG_POLICY, or serve a dLLM"
        )
    if not seam.fdfo(scheduler):
        raise ConfigError(
            "the dwise plugin needs SGLang's FDFO dLLM mode (one denoising step "
            "per round); sync mode runs a whole block inside one round, so "
            "remaining work cannot be counted per round: enable --dllm-fdfo, or "
            "unset DWISE_SGLANG_BUNDLE"
        )
    if seam.separate_context_encoding(scheduler):
        raise ConfigError(
            f"the {seam.algorithm(scheduler)} algorithm encodes the context in a separate "
            "variable-length EXTEND pass, so prompt and denoising blocks cannot share a round "
            "and its rounds are not counted per block the way traces count them: the plugin "
            "does not support it yet; unset DWISE_SGLANG_BUNDLE and DWISE_SGLANG_POLICY"
        )
    bundle = None
    if config.bundle:
        bundle = load_bundle(config.bundle)
        bundle.check(server_fingerprint(scheduler), allow_mismatch=config.allow_mismatch)
    if config.planned and "cost" in config.make_policy().needs and bundle is not None:
        _check_priced(bundle, config.policy)
    if bundle is not None:
        try:
            bundle.check_admission_source(config.admission)
        except BundleError as e:
            raise ConfigError(f"DWISE_SGLANG_ADMISSION={config.admission}: {e}") from None
    refine = config.refine and bundle is not None and bundle.refinement is not None
    if config.refine and bundle is not None and not refine:
        log.warning(
            "bundle '%s' has no refinement predictor: ranking by the admission estimate "
            "only (train one with `dwise-predict train --only refine`)",
            bundle.name,
        )
    tokenizer = seam.tokenizer(scheduler)
    state = (
        _planned_state(scheduler, config, bundle, refine)
        if config.planned
        else _observed_state(scheduler, config, bundle, tokenizer)
    )
    state.set_tokenizer(tokenizer)
    tp_rank, dp_rank = seam.ranks()
    if config.trace_dir and tp_rank == 0:
        from .traces import ServingTraceSink

        state.trace_sink = ServingTraceSink(
            config.trace_dir,
            server_fingerprint(scheduler),
            dp_rank=dp_rank,
            prompt_text=config.trace_prompt_text,
            tokenizer=tokenizer,
            featurizer=state.featurizer,
        )
    state.gauges = gauges_for(scheduler)
    if config.watch_seconds and bundle is not None:  # hot swap (docs/refresh.md)
        from .lifecycle import start_lifecycle

        state.lifecycle = start_lifecycle(scheduler, state, config)
    setattr(scheduler, STATE_ATTR, state)
    log.info(
        "dwise plugin: %s, policy %s, B=%d, k=%d, refinement %s, bundle %s",
        server_fingerprint(scheduler).short(),
        config.policy,
        config.slots,
        config.k,
        "on" if refine else "off",
        "none" if bundle is None else bundle.name,
    )
    return state


def _check_priced(bundle: Bundle, policy: str) -> None:
    if bundle.dws is None or bundle.cost_profile is None:
        raise ConfigError(
            f"DWISE_SGLANG_POLICY={policy} ranks by the DWS cost estimate, but bundle "
            f"'{bundle.name}' has no "
            f"{'DWS predictor' if bundle.dws is None else 'cost profile'}: train one with "
            "`dwise-predict train --only dws --cost-profile ...` (and profile the "
            "deployment with `dwise-predict profile`), or use DWISE_SGLANG_POLICY=dwise"
        )


def _planned_state(
    scheduler: Any, config: PluginConfig, bundle: Bundle | None, refine: bool
) -> DwiseServing:
    from .serving import DwiseServing

    if bundle is None:  # PluginConfig refuses a composing policy without a bundle
        raise ConfigError(f"DWISE_SGLANG_POLICY={config.policy} needs DWISE_SGLANG_BUNDLE")
    state = DwiseServing(
        config,
        bundle,
        block_size=seam.block_size(scheduler),
        kv_pool_tokens=seam.kv_pool_tokens(scheduler),
        req_slots=seam.request_slots(scheduler),
        refine=refine,
    )
    if config.oracle and state.oracle_used:
        from .oracle import load_oracle

        state.oracle = load_oracle(config.oracle)
    return state


def _observed_state(
    scheduler: Any, config: PluginConfig, bundle: Bundle | None, tokenizer: Any
) -> ObserveServing:
    from .observe import ObserveServing
    from .prompt import featurizer_of

    admission = None if bundle is None else bundle.admission
    featurizer = getattr(admission, "featurizer", None)
    if featurizer is None:  # no bundle's template: the server tokenizer's own
        featurizer = featurizer_of(tokenizer)
    return ObserveServing(
        config,
        bundle,
        block_size=seam.block_size(scheduler),
        featurizer=featurizer,
        pool_hidden=bool(config.trace_dir),
    )


def _state(scheduler: Any, config: PluginConfig) -> Any:
    state = getattr(scheduler, STATE_ATTR, None)
    return state if state is not None else attach(scheduler, config)


def _refuse_at_startup(error: Exception) -> None:
    """Make ``Scheduler.__init__`` raise ``error``: the one failure SGLang does not swallow."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise error

    seam.register_hook(f"{SCHEDULER}.__init__", refuse, "BEFORE")


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: install the hooks the settings ask for."""
    try:
        config = load_config()
    except DwisePredictError as e:
        _refuse_at_startup(e)
        return
    if config is None:
        return  # not configured: SGLang runs exactly as stock
    missing = missing_names()
    if missing:
        error = SGLangIncompatibleError(incompatibility_message(missing))
        log.error("%s", error)
        _refuse_at_startup(error)
        return

    def after_init(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
        attach(scheduler, config)

    seam.register_hook(f"{SCHEDULER}.__init__", after_init, "AFTER")

    def abort_request(original_fn: Any, scheduler: Any, recv_req: Any, *a: Any, **kw: Any) -> Any:
        out = original_fn(scheduler, recv_req, *a, **kw)
        _state(scheduler, config).abort(*seam.abort_target(recv_req))
        return out

    seam.register_hook(f"{SCHEDULER}.abort_request", abort_request, "AROUND")

    def batch_result(
        original_fn: Any, scheduler: Any, batch: Any, result: Any, *args: Any, **kwargs: Any
    ) -> Any:
        state = _state(scheduler, config)
        state.observe_result(batch, result)
        out = original_fn(scheduler, batch, result, *args, **kwargs)
        state.after_result(batch)
        return out

    seam.register_hook(f"{MIXIN}.process_batch_result_dllm", batch_result, "AROUND")

    if config.planned:

        def fetch_waiting(original_fn: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            return None  # admission is the plan's (compose_round), not SGLang's FIFO top-up

        def process_batches(
            original_fn: Any, scheduler: Any, adder: Any, running_batch: Any = None, **kwargs: Any
        ) -> Any:
            rb = running_batch if running_batch is not None else kwargs.get("running_batch")
            return _state(scheduler, config).compose_round(scheduler, adder, rb)

        seam.register_hook(f"{MIXIN}._fetch_waiting_reqs", fetch_waiting, "AROUND")
        seam.register_hook(f"{MIXIN}._process_dllm_batches", process_batches, "AROUND")

        def publish_load_snapshot(original_fn: Any, scheduler: Any, *a: Any, **kw: Any) -> Any:
            load = original_fn(scheduler, *a, **kw)  # SGLang's snapshot, or None (throttled)
            state = getattr(scheduler, STATE_ATTR, None)
            if state is not None:
                from .load import publish

                publish(scheduler, state, load)  # the outstanding work, beside it (docs/fleet.md)
            return load

        seam.register_hook(f"{SCHEDULER}.publish_load_snapshot", publish_load_snapshot, "AROUND")

    if config.dispatch == "dwise":  # in the data-parallel controller's process (--dp-size N)

        def controller_init(result: Any, controller: Any, *args: Any, **kwargs: Any) -> None:
            from .dispatch import install

            install(controller, config)

        def refresh_load_budget(original_fn: Any, controller: Any, *a: Any, **kw: Any) -> Any:
            from .dispatch import after_refresh

            before = seam.last_refresh(controller)
            out = original_fn(controller, *a, **kw)
            after_refresh(controller, before)
            return out

        seam.register_hook(f"{DP_CONTROLLER}.__init__", controller_init, "AFTER")
        seam.register_hook(f"{DP_CONTROLLER}.refresh_load_budget", refresh_load_budget, "AROUND")

    if config.refine or (config.policy in OBSERVED and config.trace_dir):

        def keep_hidden(
            original_fn: Any,
            processor: Any,
            hidden_states: Any,
            lm_head: Any,
            logits_metadata: Any,
            *args: Any,
            **kwargs: Any,
        ) -> Any:
            out = original_fn(processor, hidden_states, lm_head, logits_metadata, *args, **kwargs)
            seam.keep_hidden(out, hidden_states)
            return out

        seam.register_hook(f"{LOGITS}._get_dllm_logits", keep_hidden, "AROUND")
