"""How much of oracle-SJF's gain a predicted-cost SJF keeps (the DWS paper's headline metric).

Every policy here is non-preemptive shortest-job-first on SGLang's prefill-first batch former,
differing only in the score it sorts by: the predicted DWS cost (DWS-SJF), a scalar proxy
(predicted output length, predicted total steps) or the TRUE cost (oracle-SJF). FCFS is the
reference. For each scored policy

    share of oracle gain = (L_fcfs - L_policy) / (L_fcfs - L_oracle)

with L the mean latency: 1.0 = as good as knowing every request's cost, 0 = no better than
arrival order. The paper reports 83.8-94.3% for DWS-SJF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from .metrics import summarize
from .policies import FCFS, ScoreSJF
from .simulator import simulate
from .workload import Workload

ORACLE = "oracle-sjf"


@dataclass(frozen=True)
class SJFRow:
    policy: str
    mean_latency: float
    p99_latency: float
    gain_vs_fcfs: float  # L_fcfs / L_policy
    share_of_oracle_gain: float

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sjf_oracle_share(
    workload: Workload,
    scores: dict[str, np.ndarray],
    true_cost: np.ndarray,
    *,
    arrival: str = "burst",
    slots: int = 32,
    k: int = 8,
    round_time: Any = None,
    seed: int = 0,
) -> list[SJFRow]:
    """FCFS, one SJF per named score, and oracle-SJF by ``true_cost``, on one arrival pattern."""
    n = workload.n
    for name, s in {**scores, ORACLE: true_cost}.items():
        a = np.asarray(s, dtype=np.float64)
        if a.shape != (n,) or not np.all(np.isfinite(a)):
            raise ConfigError(f"score {name!r} must hold {n} finite numbers, one per request")

    def run(w: Workload, policy: Any) -> dict[str, float]:
        return summarize(
            simulate(
                w, policy, arrivals=arrival, slots=slots, k=k, round_time=round_time, seed=seed
            )
        )

    lat = {"fcfs": run(workload, FCFS())}
    for name, s in {**scores, ORACLE: true_cost}.items():
        a = np.asarray(s, dtype=np.float64)
        # a policy that needs "cost" reads cost, the others score
        w = workload.with_estimates(score=a, cost=a)
        lat[name] = run(w, ScoreSJF(name=name))
    base, best = lat["fcfs"]["mean_latency"], lat[ORACLE]["mean_latency"]
    rows = []
    for name, summary in lat.items():
        m = float(summary["mean_latency"])
        share = (base - m) / (base - best) if base != best else float("nan")
        rows.append(SJFRow(name, m, float(summary["p99_latency"]), base / m, share))
    return rows
