"""The simulator timing rounds with a cost profile instead of the round-time defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dwise_predict.cli import main
from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import ConfigError
from dwise_predict.runtime import compare_policies, synthetic_workload
from dwise_predict.runtime.costtime import ProfileRoundTime, RoundSlots


def _flat(k_ms=2.0, **kw) -> CostProfile:
    args = dict(
        alpha_ms=0.0,
        beta_ms=0.0,
        K_ms=np.full((4, 32), k_ms),
        delta_ms=0.0,
        block_size=32,
        max_steps=32,
    )
    args.update(kw)
    return CostProfile(**args)


def test_slot_costs_by_hand():
    K = np.arange(4 * 32, dtype=float).reshape(4, 32) / 10
    p = _flat(alpha_ms=1.0, alpha2_ms=0.5, beta_ms=3.0, delta_ms=0.25, K_ms=K)
    slots = RoundSlots(
        prompt=np.array([True, False, False]),
        context=np.zeros(3),
        prompt_blocks=np.array([4, 2, 8]),
        prompt_index=np.array([2, 0, 0]),
        block=np.array([0, 1, 9]),
        step=np.array([0, 5, 40]),
        commits=np.array([False, True, False]),
    )
    rt = ProfileRoundTime(p, batch_share=0.5)
    c = rt.slot_ms(slots)
    # prompt block 2: alpha + alpha2*(2*2+1); (b=1, s=5) + delta*2 + beta; (b, s) past K: last cell
    assert c.tolist() == pytest.approx([1.0 + 0.5 * 5, K[1, 5] + 0.5 + 3.0, K[3, 31] + 2.0])
    assert rt.time_round(slots) == pytest.approx(c.max() + 0.5 * (c.sum() - c.max()))
    with pytest.raises(ConfigError):
        ProfileRoundTime(p, batch_share=1.5)


def test_serial_flat_profile_makes_the_makespan_the_total_denoising_work():
    """batch_share=1, K flat, no prefill/refresh cost: every policy's makespan = K x all steps."""
    w = synthetic_workload(n=64, seed=1)
    rt = ProfileRoundTime(_flat(2.0), batch_share=1.0)
    report = compare_policies(w, "fcfs,dwise", "burst", 16, 4, round_time=rt)
    work_s = 2.0 * float(w.total_rounds.sum()) / 1000
    for name in ("fcfs", "dwise"):
        assert report.summary[name]["makespan"] == pytest.approx(work_s, rel=1e-9)
    # with batching gains (share < 1) the same schedule is faster
    fast = compare_policies(w, "fcfs", "burst", 16, 4, round_time=ProfileRoundTime(_flat(2.0)))
    assert fast.summary["fcfs"]["makespan"] < 0.5 * work_s


def test_simulate_cli_with_the_paper_profile(tmp_path, capsys):
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--synthetic",
                "paper-llada2.1-mini",
                "--requests",
                "64",
                "--slots",
                "16",
                "--policies",
                "fcfs,dwise",
                "--cost-profile",
                "paper-llada2.0-mini",
                "--no-plots",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    rt = summary["round_time"]
    assert rt["kind"] == "cost_profile" and rt["profile"] == "paper-llada2.0-mini"
    assert rt["K_ms_max"] == pytest.approx(load_cost_profile("paper-llada2.0-mini").K_ms.max())
    pol = summary["policies"]
    assert pol["dwise"]["mean_latency"] < pol["fcfs"]["mean_latency"]
    capsys.readouterr()
    assert (
        main(
            [
                "simulate",
                "--synthetic",
                "paper-llada2.1-mini",
                "--requests",
                "64",
                "--cost-profile",
                "nope",
                "--out",
                str(tmp_path / "x"),
            ]
        )
        == 1
    )
    assert "shipped" in capsys.readouterr().err
