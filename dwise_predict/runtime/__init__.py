"""The scheduler runtime (DWISE and baselines) and the trace-driven simulator. numpy only.

Drive a :class:`Scheduler` with ``add_request`` / ``plan_round`` / ``update``; replay traces or
the paper-matched synthetic workload with :func:`simulate` or :func:`compare_policies`.
See docs/runtime.md and docs/simulator.md.
"""

from ..ranking import spearman
from .arrivals import Arrivals, ArrivalSpec, make_arrivals
from .kv import KVPool
from .metrics import per_category, summarize
from .policies import DWISE, DWSSJF, FCFS, MLFQ, SRPT, OracleSRPT, Policy, ScoreSJF
from .registry import (
    DEFAULT_POLICY,
    make_policy,
    parse_policies,
    policy_names,
    register_policy,
)
from .report import SimulationReport, compare_policies
from .request import RoundPlan, RoundResult, SimRequest
from .roundtime import RoundTimeModel
from .scheduler import Scheduler
from .simulator import SimulationRun, simulate
from .synthetic import describe, synthetic_workload
from .workload import Workload, costs_from_bundle, estimates_from_bundle, requests_from_traces

__all__ = [
    "DWISE",
    "DWSSJF",
    "FCFS",
    "MLFQ",
    "SRPT",
    "DEFAULT_POLICY",
    "Arrivals",
    "ArrivalSpec",
    "KVPool",
    "OracleSRPT",
    "Policy",
    "RoundPlan",
    "RoundResult",
    "RoundTimeModel",
    "Scheduler",
    "ScoreSJF",
    "SimRequest",
    "SimulationReport",
    "SimulationRun",
    "Workload",
    "compare_policies",
    "describe",
    "costs_from_bundle",
    "estimates_from_bundle",
    "make_arrivals",
    "make_policy",
    "parse_policies",
    "per_category",
    "policy_names",
    "register_policy",
    "requests_from_traces",
    "simulate",
    "spearman",
    "summarize",
    "synthetic_workload",
]
