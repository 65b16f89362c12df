"""The cost-profile fitter (scipy NNLS) on synthetic requests from a planted profile."""

from __future__ import annotations

import dataclasses
from importlib import resources

import numpy as np
import pytest
from dwise_predict.trainers.cost_profile import (
    FitConfig,
    ProfiledRequest,
    cost_metrics,
    fit_cost_profile,
    paper_profile_json,
    planted_paper_profile,
    prompt_coverage_warning,
    synthetic_requests,
)

from dwise_predict.cost import load_cost_profile
from dwise_predict.errors import TrainingError


def test_shipped_paper_profile_is_the_planted_one():
    shipped = resources.files("dwise_predict.cost_profiles") / "paper-llada2.0-mini.json"
    assert shipped.read_text(encoding="utf-8") == paper_profile_json()
    assert load_cost_profile("paper-llada2.0-mini").to_json() == planted_paper_profile().to_json()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fit_recovers_the_planted_paper_profile_from_200_requests(seed):
    planted = planted_paper_profile()
    requests = synthetic_requests(planted, 200, noise=0.01, seed=seed)
    fit = fit_cost_profile(
        requests,
        block_size=32,
        fingerprint={"model_id": "x"},
        hardware="synthetic",
        config=FitConfig(n_blocks=planted.n_blocks),
    )
    for name in ("alpha_ms", "beta_ms", "delta_ms"):
        got, want = getattr(fit, name), getattr(planted, name)
        assert abs(got - want) / want < 0.05, (name, got, want)
    rel = np.abs(fit.K_ms - planted.K_ms) / planted.K_ms
    assert rel.mean() < 0.05
    # the heterogeneity is recovered, not averaged away: last step dearer than the first
    assert fit.K_ms[0, 31] - fit.K_ms[0, 0] == pytest.approx(2.6, rel=0.1)
    assert fit.alpha2_ms < 1e-3 * fit.alpha_ms  # the planted prefill is linear
    assert fit.cv is not None
    assert fit.cv["r2"] > 0.99 and fit.cv["mape"] < 0.03 and fit.cv["pairwise"] > 0.97
    assert fit.hardware == "synthetic" and fit.fingerprint == {"model_id": "x"}


def test_fit_is_deterministic():
    requests = synthetic_requests(planted_paper_profile(n_blocks=8), 40, seed=3)
    a = fit_cost_profile(requests, block_size=32, hardware="h")
    b = fit_cost_profile(requests, block_size=32, hardware="h")
    assert a.to_json() == b.to_json()


def test_total_only_traces_fall_back_to_a_joint_fit():
    """Without a phase split the total is still modelled well (the documented fallback)."""
    planted = planted_paper_profile(n_blocks=16)
    split = synthetic_requests(planted, 120, seed=2)
    total = [
        ProfiledRequest(r.prompt_blocks, r.rounds_per_block, 0.0, r.total_ms, 0.0) for r in split
    ]
    fit = fit_cost_profile(total, block_size=32, hardware="h")
    assert fit.cv is not None and fit.cv["mape"] < 0.05 and fit.cv["r2"] > 0.98


def test_too_few_or_broken_requests_are_refused():
    requests = synthetic_requests(planted_paper_profile(n_blocks=8), 25, seed=0)
    with pytest.raises(TrainingError, match="at least 20"):
        fit_cost_profile(requests[:19], block_size=32)
    bad = [*requests[:-1], ProfiledRequest(3, (2, 1), float("nan"), 10.0, 1.0)]
    with pytest.raises(TrainingError, match="non-finite"):
        fit_cost_profile(bad, block_size=32)
    with pytest.raises(TrainingError, match="block size"):
        fit_cost_profile(requests, block_size=4)


def test_cost_metrics_by_hand():
    y = np.array([1.0, 2.0, 3.0, 4.0])
    p = np.array([1.0, 3.0, 2.0, 4.0])  # one of six pairs swapped
    m = cost_metrics(y, p)
    assert m["pairwise"] == pytest.approx(5 / 6)
    assert m["r2"] == pytest.approx(1 - 2 / 5)
    assert m["mape"] == pytest.approx((0 + 0.5 + 1 / 3 + 0) / 4)
    assert m["spearman"] == pytest.approx(0.8)


def test_one_far_longer_prompt_is_flagged_because_its_fold_extrapolates():
    """The demo's profile: 40 short prompts and one haystack 20x longer, whose prefill grows
    faster than linearly. Cross-validation predicts it from short prompts only, so R^2 collapses
    while MAPE and the ordering hold; the warning says so and how to fix it. With a few long
    prompts every fold has seen one, the warning goes and R^2 is back."""
    planted = planted_paper_profile(n_blocks=8)
    short = synthetic_requests(planted, 40, seed=5, max_prompt_blocks=12)

    def haystack(m: int) -> ProfiledRequest:
        prefill = planted.alpha_ms * m * (1 + m / 60)  # attention's quadratic share
        return dataclasses.replace(short[0], prompt_blocks=m, prefill_ms=prefill)

    assert prompt_coverage_warning(short) is None
    one = short + [haystack(240)]
    warning = prompt_coverage_warning(one)
    assert warning is not None and "240 blocks" in warning and "--limit" in warning
    cv = fit_cost_profile(one, block_size=32, hardware="h").cv
    assert cv is not None and cv["r2"] < 0.7 and cv["mape"] < 0.05 and cv["spearman"] > 0.99
    many = short + [haystack(m) for m in (150, 200, 240, 300)]
    assert prompt_coverage_warning(many) is None
    cv = fit_cost_profile(many, block_size=32, hardware="h").cv
    assert cv is not None and cv["r2"] > 0.99
