"""The shadow judge and the rollback rule (dwise_predict/bundle/promotion.py), on numbers.

Actual rounds come from a lognormal workload; a "good" estimate is the truth times a little
noise, a "stale" one runs 1.8x high with more noise, a "bad" one is the truth shuffled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dwise_predict.bundle.promotion import (
    Figures,
    Probation,
    PromotionRule,
    ShadowTrial,
    figures,
    judge,
)
from dwise_predict.errors import ConfigError


@pytest.fixture(scope="module")
def work():
    rng = np.random.default_rng(0)
    actual = np.ceil(rng.lognormal(3.0, 0.8, size=400))
    good = actual * rng.lognormal(0.0, 0.15, size=actual.size)
    stale = 1.8 * actual * rng.lognormal(0.0, 0.6, size=actual.size)
    bad = rng.permutation(actual)
    return actual, good, stale, bad


def test_figures_are_the_monitors():
    f = figures([2.0, 4.0, 9.0], [1.0, 2.0, 3.0])
    assert f == Figures(3, 2.0, 1.0)
    assert f.log_ratio == pytest.approx(math.log(2.0))
    assert figures([], []) == Figures(0, None, None)
    assert figures([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]).spearman is None  # a constant side


def test_a_candidate_fitting_the_traffic_is_promoted_over_a_stale_live(work):
    actual, good, stale, _ = work
    trial = ShadowTrial(PromotionRule(shadow_requests=128))
    for a, live, cand in zip(actual[:127], stale, good):
        trial.add(a, live, cand)
    assert not trial.done
    trial.add(actual[127], stale[127], good[127])
    assert trial.done and trial.n == 128
    ok, reason, live_f, cand_f = trial.verdict()
    assert ok and reason.startswith("promoted")
    assert cand_f.spearman > live_f.spearman + 0.05
    assert abs(cand_f.median_ratio - 1.0) < 0.1 < abs(live_f.median_ratio - 1.0)
    assert trial.candidate_pairs()[0] == (good[0], actual[0])


def test_a_worse_candidate_is_rejected_and_requests_without_both_estimates_do_not_count(work):
    actual, good, _, bad = work
    trial = ShadowTrial(PromotionRule(shadow_requests=64))
    trial.add(actual[0], good[0], None)  # arrived before the trial: the candidate never saw it
    trial.add(0.0, good[1], bad[1])  # no work measured
    trial.add(actual[2], float("nan"), bad[2])
    assert trial.n == 0
    for a, live, cand in zip(actual[3:67], good[3:], bad[3:]):
        trial.add(a, live, cand)
    ok, reason, live_f, cand_f = trial.verdict()
    assert not ok and "candidate ρ" in reason and cand_f.spearman < live_f.spearman


def test_the_margin_decides_ties_and_calibration_counts_too():
    live, cand = Figures(100, 1.0, 0.60), Figures(100, 1.0, 0.59)
    assert not judge(live, cand, 0.0)[0]
    assert judge(live, cand, 0.02)[0]
    # ranks as well, but calibrated further from 1 (ratio 1.3 against 1.05)
    ok, reason = judge(Figures(100, 1.05, 0.6), Figures(100, 1.3, 0.7), 0.02)
    assert not ok and "further from 1" in reason
    # a ratio below 1 is as far as its inverse above 1
    assert judge(Figures(100, 1.25, 0.6), Figures(100, 0.8, 0.6), 0.0)[0]
    assert not judge(live, Figures(2, None, None), 1.0)[0]


def test_probation_rolls_back_a_promoted_revision_that_degrades(work):
    actual, good, stale, bad = work
    rule = PromotionRule(shadow_requests=64, rollback_drop=0.1)
    baseline = figures(good[:64], actual[:64])
    probe = slice(64, 128)

    def probation(live, previous):
        p = Probation(rule, baseline)
        for a, x, y in zip(actual[probe], live[probe], previous[probe]):
            p.add(a, x, y)
        return p

    kept = probation(good, stale)
    assert kept.done and not kept.verdict()[0]
    back, reason, now = probation(bad, good).verdict()
    assert back and "fell more than 0.1" in reason and now.spearman < baseline.spearman - 0.1
    assert "the previous bundle does better" in reason
    # ranks as well but runs 1.8x high: calibration alone rolls it back
    back, reason, _ = probation(1.8 * good, good).verdict()
    assert back and "median ratio" in reason
    # a fall the previous bundle shares (the traffic moved again) is not rolled back
    back, reason, _ = probation(bad, 1e3 / actual).verdict()  # the previous ranks in reverse
    assert not back and "does no better" in reason
    skipped = Probation(rule, baseline)
    skipped.add(actual[0], good[0], None)  # arrived before the promotion: not on probation
    assert skipped.n == 0


def test_the_rule_refuses_settings_that_cannot_judge():
    with pytest.raises(ConfigError, match="shadow_requests"):
        PromotionRule(shadow_requests=2)
    with pytest.raises(ConfigError, match="margin"):
        PromotionRule(margin=-0.1)
    with pytest.raises(ConfigError, match="rollback_drop"):
        PromotionRule(rollback_drop=float("nan"))
