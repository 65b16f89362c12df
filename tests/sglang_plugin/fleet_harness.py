"""R real SGLang schedulers behind SGLang's real data-parallel controller code, in one process.

SGLang launches a ``DataParallelController`` process that spawns one scheduler process per DP
rank; each needs a GPU. Here the schedulers are the CPU harness's (``harness.CpuServer``: SGLang's
``Scheduler`` classes serving tiny-bd) and the controller is SGLang's ``DataParallelController``
built without its ``__init__`` (which would launch processes), with the attributes its dispatch
path reads. What runs is SGLang's own code: ``dispatch_batch_generate`` ->
``refresh_load_budget`` -> ``DPBudget.update_budget`` over ``ShmLoadSnapshotReader.read_all``
-> ``round_robin_scheduler`` / ``total_requests_scheduler`` / ``total_tokens_scheduler`` ->
``sock_send`` of a real ``TokenizedGenerateReqInput`` (msgpack-encoded); each scheduler
publishes with its own ``publish_load_snapshot``, ``SchedulerLoadInquirer.get_loads`` and
``ShmLoadSnapshotWriter``. The stand-ins: the sockets (an in-process inbox per rank that
decodes what ``sock_send`` wrote), the parts of the load inquirer a CPU harness lacks (pool
statistics, counters that are zero here), and the scheduler's request intake (the inbox's
requests are queued with ``CpuServer.submit``, as ``handle_generate_request`` would).

The fleet runs in lockstep: each tick every scheduler publishes its load snapshot (SGLang does
after every batch), the tick's arrivals reach the controller as one batch (one budget refresh,
then one dispatch each), and every scheduler with work runs one round. Completion is counted in
ticks from arrival, as the single-server benchmarks count rounds.
"""

from __future__ import annotations

import contextlib
import math
import os
import uuid
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
from harness import CpuServer, RequestSpec

SGLANG_METHODS = ("round_robin", "total_requests", "total_tokens")


class Inbox:
    """What a DP rank's zmq socket receives: ``sock_send`` writes to it, the rank reads it."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def send(self, data: bytes, flags: int = 0) -> None:
        from sglang.srt.managers.io_struct import msgpack_decode

        self.items.append(msgpack_decode(data))

    def send_pyobj(self, obj: Any, flags: int = 0, protocol: int = 0) -> None:
        self.items.append(obj)

    def take(self) -> list[Any]:
        out, self.items = self.items, []
        return out


def make_controller(dp_size: int, method: str, instance_id: str) -> Any:
    """SGLang's ``DataParallelController`` with what its dispatch path reads, ``__init__``'s
    values: the method, ``DPBudget``, the snapshot reader, the workers (inboxes)."""
    from sglang.srt.managers.data_parallel_controller import (
        DataParallelController,
        DPBudget,
        LoadBalanceMethod,
    )
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotReader, shm_path_for

    c = DataParallelController.__new__(DataParallelController)
    c.port_args = SimpleNamespace(instance_id=instance_id)
    c.load_balance_method = LoadBalanceMethod.from_str(method)
    c.round_robin_counter = 0
    c.health_round_robin_counter = 0
    lookup = {
        LoadBalanceMethod.ROUND_ROBIN: c.round_robin_scheduler,
        LoadBalanceMethod.TOTAL_REQUESTS: c.total_requests_scheduler,
        LoadBalanceMethod.TOTAL_TOKENS: c.total_tokens_scheduler,
    }
    c.dispatching = lookup[c.load_balance_method]
    c.refresh_load_budget_on_dispatch = c.load_balance_method in (
        LoadBalanceMethod.TOTAL_REQUESTS,
        LoadBalanceMethod.TOTAL_TOKENS,
    )
    c.dp_budget = DPBudget(dp_size)
    c.load_snapshot_reader = ShmLoadSnapshotReader(shm_path_for(instance_id), dp_size)
    c._last_refresh_time = 0.0
    c.workers = [Inbox() for _ in range(dp_size)]
    c.dp_active = [True] * dp_size
    c.status = [True] * dp_size
    c._active_workers = list(range(dp_size))
    c._active_count_cache = dp_size
    c.init_dispatcher()
    return c


def tokenized(spec: RequestSpec) -> Any:
    """The ``TokenizedGenerateReqInput`` the tokenizer manager sends for ``spec``."""
    from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=spec.rid,
        input_text=spec.text,
        input_ids=array("q", spec.input_ids),
        input_embeds=None,
        mm_inputs=None,
        token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=0.0),
        return_logprob=False,
        logprob_start_len=-1,
        top_logprobs_num=0,
        token_ids_logprob=None,
        stream=False,
        extra_key=spec.label,
    )


def equip_publisher(server: CpuServer, instance_id: str, dp_size: int, dp_rank: int) -> None:
    """Give a harness scheduler SGLang's load-snapshot writer and load inquirer, so its own
    ``publish_load_snapshot`` runs (with the plugin's hook around it)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.load_snapshot import ShmLoadSnapshotWriter, shm_path_for
    from sglang.srt.managers.scheduler_components.load_inquirer import SchedulerLoadInquirer

    s = server.scheduler
    alloc = s.token_to_kv_pool_allocator

    def kv_stats() -> tuple[int, float]:
        used = int(alloc.size - alloc.available_size())
        return used, used / alloc.size

    zero = SimpleNamespace(
        spec_accept_rate=0.0,
        gen_throughput=0.0,
        cache_hit_rate=0.0,
        utilization=0.0,
        kv_transfer_speed_gb_s=0.0,
        kv_transfer_latency_ms=0.0,
        num_grammar_queue_reqs=0,
        num_paused_reqs=0,
        num_retracted_reqs=0,
    )
    s.load_snapshot_writer = ShmLoadSnapshotWriter(shm_path_for(instance_id), dp_size, dp_rank)
    s.load_inquirer = SchedulerLoadInquirer(
        disaggregation_mode=DisaggregationMode.NULL,
        server_args=s.server_args,
        max_total_num_tokens=int(alloc.size),
        max_running_requests=server.max_running_requests,
        pool_stats_observer=SimpleNamespace(
            get_pool_stats=lambda: SimpleNamespace(get_kv_token_stats=kv_stats)
        ),
        tp_worker=SimpleNamespace(),
        token_to_kv_pool_allocator=alloc,
        spec_algorithm=s.spec_algorithm,
        get_running_batch=lambda: s.running_batch,
        get_waiting_queue=lambda: s.waiting_queue,
        waiting_queue_prefix_matched=lambda: False,
        get_recent_cache_hit_rate=lambda: 0.0,
        get_stats=lambda: zero,
        get_chunked_req=lambda: None,
        get_disagg_prefill_bootstrap_queue=lambda: None,
        get_disagg_prefill_inflight_queue=lambda: None,
        get_disagg_decode_prealloc_queue=lambda: None,
        get_disagg_decode_transfer_queue=lambda: None,
        get_spec_total_num_accept_tokens=lambda: 0,
        get_spec_total_num_forward_ct=lambda: 0,
        get_total_prefill_uncached_tokens=lambda: 0,
        get_total_prefill_busy_us=lambda: 0,
        get_decode_moment_totals=lambda: (0, 0.0, 0.0),
    )


def publish(server: CpuServer, dp_rank: int) -> Any:
    """SGLang's ``Scheduler.publish_load_snapshot`` of one rank (forced, as after a batch)."""
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(dp_rank=dp_rank):
        return server.scheduler.publish_load_snapshot(force=True)


def remove_shm(instance_id: str) -> None:
    from sglang.srt.managers.load_snapshot import shm_path_for

    from dwise_predict.sglang.load import report_path

    path = shm_path_for(instance_id)
    for p in (path, report_path(path)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


@dataclass
class FleetResult:
    """One fleet run: per request its arrival and completion tick and its rank."""

    arrival: dict[str, int] = field(default_factory=dict)
    completion: dict[str, int] = field(default_factory=dict)
    rank_of: dict[str, int] = field(default_factory=dict)
    #: rounds each request ran in (prompt blocks and denoising forwards): its true work
    work: dict[str, int] = field(default_factory=dict)
    ticks: int = 0
    kv_leaked_tokens: list[int] = field(default_factory=list)
    req_slots_leaked: list[int] = field(default_factory=list)
    fallbacks: int = 0
    dispatched_by_work: int = 0
    #: per rank, the finished requests' plugin tracks (true work, estimates)
    tracks: list[dict[str, Any]] = field(default_factory=list)

    def summary(self, dp_size: int) -> dict[str, Any]:
        lat = np.array([self.completion[r] - self.arrival[r] for r in self.completion], float)
        per = [0] * dp_size
        for r in self.rank_of.values():
            per[r] += 1
        return {
            "mean_completion_rounds": round(float(lat.mean()), 2) if lat.size else math.nan,
            "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2)
            if lat.size
            else math.nan,
            "finished": int(lat.size),
            "requests": len(self.arrival),
            "kv_leaked_tokens": int(sum(self.kv_leaked_tokens)),
            "req_slots_leaked": int(sum(self.req_slots_leaked)),
            "requests_per_replica": per,
            "ticks": self.ticks,
            "fallbacks": self.fallbacks,
            "dispatched_by_work": self.dispatched_by_work,
        }


def run_fleet(
    requests: Sequence[RequestSpec],
    arrival_ticks: Sequence[int],
    *,
    dp_size: int,
    method: str,
    runner: Any,
    max_running_requests: int,
    on_scheduler: Callable[[Any], None],
    make_dispatch: Callable[[Any, Callable[[], list[Any]]], Any] | None = None,
    true_work: dict[str, float] | None = None,
    max_ticks: int = 200_000,
    silent: Sequence[int] = (),
) -> FleetResult:
    """Serve ``requests`` (request i reaches the controller before tick ``arrival_ticks[i]``)
    on ``dp_size`` schedulers behind the controller started with SGLang's ``method``.

    ``make_dispatch(controller, true_loads)``, when given, installs the plugin's method on the
    controller (what its ``__init__`` hook does) and returns it; ``true_loads()`` gives each
    rank's true outstanding work (for the oracle), when ``true_work`` maps request ids to it.
    ``silent`` ranks never publish (a rank whose report is missing).
    """
    from dwise_predict.runtime.fleet import ReplicaLoad, WorkHistogram

    instance = "fleet-" + uuid.uuid4().hex[:10]
    controller = make_controller(dp_size, method, instance)
    specs = {s.rid: s for s in requests}
    order = sorted(range(len(requests)), key=lambda i: (arrival_ticks[i], i))
    res = FleetResult()
    true_left = [0.0] * dp_size
    with contextlib.ExitStack() as stack:
        servers = []
        for rank in range(dp_size):
            srv = CpuServer(
                max_running_requests=max_running_requests,
                runner=runner,
                on_scheduler=on_scheduler,
            )
            stack.enter_context(srv)
            equip_publisher(srv, instance, dp_size, rank)
            servers.append(srv)
        stack.callback(remove_shm, instance)

        #: each live request's true work left, by rank (the oracle's work histogram)
        true_rem: list[dict[str, float]] = [{} for _ in range(dp_size)]

        def true_loads() -> list[Any]:
            return [
                ReplicaLoad(
                    r,
                    len(servers[r].scheduler.waiting_queue)
                    + len(servers[r].scheduler.dllm_manager.waiting_queue),
                    0,
                    true_left[r],
                    true_work_rounds=true_left[r],
                    timestamp=_report_time(r),
                    true_work_hist=WorkHistogram.of(np.fromiter(true_rem[r].values(), float)),
                )
                for r in range(dp_size)
            ]

        published: dict[int, float] = {}

        def _report_time(r: int) -> float:
            return published.get(r, -math.inf)

        wd = make_dispatch(controller, true_loads) if make_dispatch is not None else None
        nxt = 0
        tick = 0
        while len(res.completion) < len(requests):
            if tick >= max_ticks:
                raise RuntimeError(f"{len(requests) - len(res.completion)} unfinished")
            for rank, srv in enumerate(servers):
                if rank in silent:
                    continue
                load = publish(srv, rank)
                if load is not None:
                    published[rank] = float(load.timestamp)
            batch = []
            while nxt < len(order) and arrival_ticks[order[nxt]] <= tick:
                spec = requests[order[nxt]]
                batch.append(tokenized(spec))
                res.arrival[spec.rid] = tick
                nxt += 1
            if batch:
                from sglang.srt.managers.io_struct import BatchTokenizedGenerateReqInput

                controller._last_refresh_time = 0.0  # a round lasts longer than its 20 ms throttle
                controller.dispatch_batch_generate(BatchTokenizedGenerateReqInput(batch=batch))
            for rank, srv in enumerate(servers):
                for msg in controller.workers[rank].take():
                    spec = specs[msg.rid]
                    srv.submit(spec)
                    res.rank_of[spec.rid] = rank
                    if true_work is not None:
                        true_left[rank] += true_work[spec.rid]
                        true_rem[rank][spec.rid] = true_work[spec.rid]
            for rank, srv in enumerate(servers):
                batch_run = srv.step()
                if batch_run is None:
                    continue
                true_left[rank] -= len(batch_run.reqs)
                for req in batch_run.reqs:
                    res.work[req.rid] = res.work.get(req.rid, 0) + 1
                    if req.rid in true_rem[rank]:
                        true_rem[rank][req.rid] -= 1.0
                    if req.finished() and req.rid not in res.completion:
                        res.completion[req.rid] = tick + 1
                        true_rem[rank].pop(req.rid, None)
            tick += 1
            done = len(res.completion) == len(requests)
            if nxt >= len(order) and not done and all(_idle(s) for s in servers):
                raise RuntimeError("the fleet is idle with requests unfinished")
        for srv in servers:
            srv.drain()
            res.kv_leaked_tokens.append(srv.kv_free_before - srv.kv_free)
            res.req_slots_leaked.append(srv.req_slots_free_before - srv.req_slots_free)
            state = getattr(srv.scheduler, "dwise_serving", None)
            res.tracks.append({str(r): tr for r, tr in state.finished} if state else {})
        res.ticks = tick
        if wd is not None:
            res.fallbacks = wd.fallbacks
            res.dispatched_by_work = wd.dispatched
    return res


def _idle(server: CpuServer) -> bool:
    s = server.scheduler
    return not s.waiting_queue and not s.dllm_manager.waiting_queue
