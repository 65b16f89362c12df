"""The policy registry: one class plus one registration is a policy every driver can run.

A new policy registered here must reach the simulator, ``compare_policies``, the CLI and the
SGLang plugin's settings by name, fed by what it declares in ``needs`` and never by its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.runtime import (
    DEFAULT_POLICY,
    DWISE,
    Policy,
    compare_policies,
    make_policy,
    parse_policies,
    policy_names,
    register_policy,
    simulate,
    summarize,
    synthetic_workload,
)
from dwise_predict.runtime.registry import TUNABLES, policy_entries, unregister_policy
from dwise_predict.runtime.table import RequestTable
from dwise_predict.sglang.config import load_config, planned_policies


@dataclass(frozen=True)
class LongestFirst:
    """A deliberately bad policy: most estimated work first (the opposite of DWISE)."""

    batch_former: str = "mixed"
    name: str = "longest-first"
    preemptive: ClassVar[bool] = True
    needs: ClassVar[frozenset[str]] = frozenset({"estimate"})

    def key(self, table: RequestTable, rows: np.ndarray, round_index: int) -> np.ndarray:
        return -(table.prompt_blocks[rows] + table.r_hat[rows])


@pytest.fixture
def longest_first():
    register_policy("longest-first", LongestFirst, "most estimated work first (a test)")
    yield
    unregister_policy("longest-first")


def test_every_registered_name_builds_a_policy_of_that_name():
    for name, entry in policy_entries().items():
        policy = make_policy(name)
        assert isinstance(policy, Policy), name
        assert policy.name == name and entry.summary
    assert DEFAULT_POLICY in policy_names() and "dwise-uncapped" in policy_names()


def test_a_registered_policy_runs_everywhere_by_name(longest_first):
    w = synthetic_workload("paper-llada2.1-mini", n=300, seed=3)
    report = compare_policies(w, "fcfs-mixed,dwise-uncapped,longest-first", slots=16, k=4)
    mean = {n: s["mean_latency"] for n, s in report.summary.items()}
    # ranking by most work first must lose to FCFS, which must lose to DWISE: real runs
    assert mean["dwise-uncapped"] < mean["fcfs-mixed"] < mean["longest-first"]
    # the plugin can serve it (it needs only the admission estimate) and its settings accept it
    assert "longest-first" in planned_policies()
    cfg = load_config({"DWISE_SGLANG_BUNDLE": "tiny-bd", "DWISE_SGLANG_POLICY": "longest-first"})
    assert cfg is not None and isinstance(cfg.make_policy(), LongestFirst)


def test_a_policy_is_fed_by_its_needs_not_its_name():
    """dws-sjf's score is the DWS cost (it needs "cost"); plain SJF reads the workload's score,
    so the two rank in opposite orders when cost and score disagree."""
    w = synthetic_workload("paper-llada2.1-mini", n=200, seed=1)
    work = w.total_rounds.astype(np.float64)
    w = w.with_estimates(score=work.max() - work, cost=work)  # score: longest first
    by_cost = summarize(simulate(w, make_policy("dws-sjf"), slots=2, k=4))["mean_latency"]
    by_score = summarize(simulate(w, make_policy("sjf"), slots=2, k=4))["mean_latency"]
    assert by_cost < 0.7 * by_score  # shortest work first against longest first (0.59)
    assert "cost" in make_policy("dws-sjf").needs and "refined" in make_policy("dwise").needs
    assert "refined" not in make_policy("dwise-admission").needs


def test_a_taken_name_and_bad_options_are_refused(longest_first):
    with pytest.raises(ConfigError, match="already registered"):
        register_policy("dwise", LongestFirst, "an impostor")
    with pytest.raises(ConfigError, match="lower case"):
        register_policy("Shouty", LongestFirst, "no")
    with pytest.raises(ConfigError, match="unknown policy 'nope'; choose from fcfs"):
        make_policy("nope")
    with pytest.raises(ConfigError, match="unknown policy options"):
        make_policy("dwise", agin=1.0)
    with pytest.raises(ConfigError, match="no policies given"):
        parse_policies(" , ")


def test_tunables_reach_the_policies_that_have_them_and_none_keeps_their_own():
    assert set(TUNABLES) == {"aging", "starvation_cap", "starvation_clock", "starvation_slack"}
    dw, fc, tg = parse_policies("dwise-uncapped,fcfs-mixed,dwise", aging=0.25, starvation_cap=None)
    assert isinstance(dw, DWISE) and dw.aging == 0.25
    assert dw.starvation_cap == make_policy("dwise-uncapped").starvation_cap  # None: its own
    assert (fc.name, tg) == ("fcfs-mixed", make_policy("dwise"))  # no such field: left alone
    with pytest.raises(ConfigError, match="aging"):
        make_policy("dwise-uncapped", aging=-1.0)
    # a setting no listed policy has is refused, not dropped
    with pytest.raises(ConfigError, match="no listed policy has the setting starvation_slack"):
        parse_policies("fcfs-mixed,dwise", starvation_slack=1.0)
    with pytest.raises(ConfigError, match="policy 'dwise' has no setting aging"):
        make_policy("dwise", aging=0.5)


def test_the_plugin_names_the_variable_a_policy_refuses():
    env = {"DWISE_SGLANG_BUNDLE": "tiny-bd", "DWISE_SGLANG_POLICY": "dwise-uncapped"}
    with pytest.raises(ConfigError, match="DWISE_SGLANG_STARVATION_SLACK=-1.0"):
        load_config({**env, "DWISE_SGLANG_STARVATION_SLACK": "-1"})
    with pytest.raises(ConfigError, match="cannot compute in SGLang's loop"):
        load_config({**env, "DWISE_SGLANG_POLICY": "sjf"})  # a score from outside
    assert "sjf" not in planned_policies() and "dws-sjf" in planned_policies()
