"""The vLLM scheduler's settings (no vLLM needed: the config module imports none)."""

from __future__ import annotations

import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.runtime import make_policy
from dwise_predict.vllm.config import load_config


def test_defaults_rank_by_the_runtimes_default_dwise_policy():
    cfg = load_config({"DWISE_VLLM_BUNDLE": "tiny-bd"})
    assert (cfg.bundle, cfg.policy, cfg.allow_mismatch) == ("tiny-bd", "dwise", False)
    # unset tunables leave the policy as the runtime registers it (its tail rule included)
    assert cfg.make_policy() == make_policy("dwise")


def test_set_tunables_reach_the_policy():
    cfg = load_config(
        {
            "DWISE_VLLM_BUNDLE": "b",
            "DWISE_VLLM_POLICY": "dwise-uncapped",
            "DWISE_VLLM_STARVATION_SLACK": "1.5",
            "DWISE_VLLM_STARVATION_CLOCK": "projected",
            "DWISE_VLLM_ALLOW_MISMATCH": "yes",
        }
    )
    pol = cfg.make_policy()
    assert (pol.starvation_slack, pol.starvation_clock, cfg.allow_mismatch) == (
        1.5,
        "projected",
        True,
    )


@pytest.mark.parametrize(
    "env, match",
    [
        ({}, "DWISE_VLLM_BUNDLE"),
        ({"DWISE_VLLM_BUNDLE": "b", "DWISE_VLLM_POLICY": "nope"}, "DWISE_VLLM_POLICY=nope"),
        ({"DWISE_VLLM_BUNDLE": "b", "DWISE_VLLM_POLICY": "sjf"}, "cannot compute"),
        ({"DWISE_VLLM_BUNDLE": "b", "DWISE_VLLM_AGING": "soon"}, "DWISE_VLLM_AGING"),
        ({"DWISE_VLLM_BUNDLE": "b", "DWISE_VLLM_STARVATION_CAP": "-3"}, "starvation_cap"),
        ({"DWISE_VLLM_BUNDLE": "b", "DWISE_VLLM_ALLOW_MISMATCH": "maybe"}, "ALLOW_MISMATCH"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(env, match):
    with pytest.raises(ConfigError, match=match):
        load_config(env)


def test_fcfs_and_oracle_need_no_bundle():
    assert load_config({"DWISE_VLLM_POLICY": "fcfs"}).bundle is None
    assert load_config({"DWISE_VLLM_POLICY": "oracle"}).make_policy().name == "oracle"
