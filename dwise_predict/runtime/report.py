"""Compare policies on one workload: a table, a JSON summary and plots.

``compare_policies`` is the Python face of ``dwise-predict simulate`` (and the demo's last
stage): every policy replays the identical arrival trace (same seed), and the report sets the
DWISE-vs-FCFS gain beside the paper's LLaDA2.1-mini figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_json
from ..errors import ConfigError
from .arrivals import ArrivalSpec
from .costtime import ProfileRoundTime
from .metrics import per_category, summarize
from .policies import Policy
from .registry import parse_policies
from .request import SimRequest
from .roundtime import RoundTimeModel
from .simulator import DEFAULT_KV_POOL_TOKENS, SimulationRun, simulate
from .workload import Workload, as_workload

#: The DWISE paper's LLaDA2.1-mini figures (Tables 2, 3, 10 and §6.3) the report compares against.
PAPER_LLADA21 = {
    "fcfs_mean_latency_burst": 545.5,
    "dwise_mean_latency_burst": 76.9,
    "fcfs_mean_latency_burst_poisson": 535.9,
    "dwise_mean_latency_burst_poisson": 48.5,
    "gain_burst": 7.1,
    "gain_burst_poisson": 10.7,
    "fcfs_makespan": 1050.0,
    "dwise_makespan": 510.0,
    "dwise_median_round_ms": 95.0,
    "fcfs_rounds": 63926,
    "fcfs_prefill_only_round_frac": 0.946,
    "fcfs_filled_slots_per_round": 5.0,
    "dwise_rounds": 2819,
    "dwise_prefill_only_round_frac": 0.030,
    "dwise_filled_slots_per_round": 113.2,
    "dwise_preemptions_per_request": 0.34,
}


@dataclass
class SimulationReport:
    """Results of :func:`compare_policies`: ``summary[name]`` holds each policy's figures."""

    arrival: str
    slots: int
    k: int
    seed: int
    round_time: RoundTimeModel | ProfileRoundTime
    runs: dict[str, SimulationRun]
    summary: dict[str, dict[str, float]]
    workload: dict[str, float | None] = field(default_factory=dict)

    def gain(self, num: str = "fcfs", den: str = "dwise", metric: str = "mean_latency") -> float:
        """``summary[num][metric] / summary[den][metric]`` (NaN when either policy is absent)."""
        if num not in self.summary or den not in self.summary:
            return math.nan
        return self.summary[num][metric] / self.summary[den][metric]

    def table(self) -> str:
        from ..tables import format_table

        base = self.summary.get("fcfs")
        headers = [
            "policy",
            "mean_s",
            "p50_s",
            "p99_s",
            "ttft_s",
            "req/s",
            "makespan_s",
            "rounds",
            "prefill_only_%",
            "slots/round",
            "idle_%",
            "preempt/req",
            "sched_us/round",
            "vs_fcfs",
        ]
        rows = []
        for name, s in self.summary.items():
            rows.append(
                [
                    name,
                    f"{s['mean_latency']:.1f}",
                    f"{s['p50_latency']:.1f}",
                    f"{s['p99_latency']:.1f}",
                    f"{s['mean_ttft']:.1f}",
                    f"{s['throughput']:.2f}",
                    f"{s['makespan']:.1f}",
                    int(s["rounds"]),
                    f"{100 * s['prefill_only_round_frac']:.1f}",
                    f"{s['filled_slots_per_round']:.1f}",
                    f"{s['idle_slots_pct']:.1f}",
                    f"{s['preemptions_per_request']:.2f}",
                    f"{s['scheduler_us_per_round_mean']:.1f}",
                    f"{base['mean_latency'] / s['mean_latency']:.2f}x" if base else "-",
                ]
            )
        out = format_table(headers, rows)
        g = self.gain()
        if not math.isnan(g):
            out += (
                f"\nDWISE mean-latency gain over FCFS: {g:.2f}x under {self.arrival} "
                f"(paper, LLaDA2.1-mini: {PAPER_LLADA21['gain_burst']}x burst, "
                f"{PAPER_LLADA21['gain_burst_poisson']}x burst+Poisson)"
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "arrival": self.arrival,
            "slots": self.slots,
            "k": self.k,
            "seed": self.seed,
            "round_time": self.round_time.to_dict(),
            "workload": self.workload,
            "policies": self.summary,
            "per_category": {n: per_category(r) for n, r in self.runs.items()},
            "gain_vs_fcfs": {n: self.gain("fcfs", n) for n in self.summary}
            if "fcfs" in self.summary
            else {},
            "paper_llada2.1_mini": PAPER_LLADA21,
        }

    def to_json(self, path: str | Path) -> Path:
        """Write the summary as JSON (to a temp name, then renamed: never half-written)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        return write_json(p, self.to_dict(), sort_keys=False, allow_nan=True)

    def plot(self, out_dir: str | Path) -> list[Path]:
        """``latency_cdf.png`` and ``round_composition.png`` in ``out_dir``."""
        from . import plots

        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        sub = f"{self.arrival}, B={self.slots}, k={self.k}"
        return [
            plots.latency_cdf(self.runs, d / "latency_cdf.png", f"Latency CDF ({sub})"),
            plots.round_composition(
                self.runs, d / "round_composition.png", f"Round composition ({sub})"
            ),
        ]


def compare_policies(
    requests: Workload | Sequence[SimRequest],
    policies: str | Sequence[str | Policy] = "fcfs,dwise,oracle",
    arrival: str | ArrivalSpec = "burst",
    slots: int = 128,
    k: int = 8,
    seed: int = 0,
    *,
    kv_pool_tokens: int = DEFAULT_KV_POOL_TOKENS,
    round_time: RoundTimeModel | ProfileRoundTime | None = None,
    progress: Any = None,
) -> SimulationReport:
    """Replay ``requests`` under each policy with the identical arrival trace; returns a report."""
    from .synthetic import describe

    w = as_workload(requests)
    spec = arrival if isinstance(arrival, ArrivalSpec) else ArrivalSpec.parse(arrival)
    pols = parse_policies(policies)
    rt = round_time or RoundTimeModel()
    runs: dict[str, SimulationRun] = {}
    for p in pols:
        name = p.name if p.name not in runs else f"{p.name}[{p.batch_former}]"
        if name in runs:
            raise ConfigError(f"policy {name!r} is listed twice")
        runs[name] = simulate(
            w,
            p,
            arrivals=spec,
            slots=slots,
            k=k,
            kv_pool_tokens=kv_pool_tokens,
            round_time=rt,
            seed=seed,
        )
        if progress is not None:
            progress(name)
    summary = {n: summarize(r) for n, r in runs.items()}
    return SimulationReport(str(spec), slots, k, seed, rt, runs, summary, describe(w))
