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


def _slowed(
    requests: list[ProfiledRequest], seed: int, spread: float = 0.2, probe_noise: float = 0.03
) -> list[ProfiledRequest]:
    """The same requests served on a machine whose speed drifts (a neighbour's load): request
    i runs ``s_i`` times slower in every phase, and the probe beside it (2.5 ms at the median
    speed) sees that slowdown with its own noise."""
    rng = np.random.default_rng(seed)
    slow = np.exp(np.cumsum(rng.normal(0.0, spread / 4, len(requests))))  # drifts, not jumps
    slow = np.clip(slow / np.median(slow), 0.6, 1.8)
    probe = 2.5 * slow * np.exp(rng.normal(0.0, probe_noise, len(requests)))
    return [
        dataclasses.replace(
            r,
            prefill_ms=r.prefill_ms * s,
            denoise_ms=r.denoise_ms * s,
            refresh_ms=r.refresh_ms * s,
            probe_ms=float(p),
        )
        for r, s, p in zip(requests, slow, probe)
    ]


@pytest.mark.parametrize("seed", [0, 1])
def test_speed_probes_take_a_drifting_machine_out_of_the_fit(seed):
    """A machine whose speed drifts by tens of percent over the run: fitted as measured, the
    drift is error the cost form cannot explain (MAPE well over 6%); with each request's
    probe the fit prices every request at the median speed, picks the exponent 1 (the
    planted slowdown is exactly the probe's) and recovers the planted profile."""
    planted = planted_paper_profile()
    clean = synthetic_requests(planted, 200, noise=0.01, seed=seed)
    slowed = _slowed(clean, seed)
    config = FitConfig(n_blocks=planted.n_blocks)
    as_measured = fit_cost_profile(
        [dataclasses.replace(r, probe_ms=None) for r in slowed],
        block_size=32,
        hardware="h",
        config=config,
    )
    assert as_measured.cv is not None and as_measured.cv["mape"] > 0.06
    assert "speed_exponent" not in as_measured.cv  # no probes, no correction
    fit = fit_cost_profile(slowed, block_size=32, hardware="h", config=config)
    assert fit.cv is not None and fit.cv["speed_exponent"] == 1.0
    assert fit.cv["mape"] < 0.035 and fit.cv["mape"] < 0.5 * as_measured.cv["mape"]
    assert fit.cv["r2"] > 0.99 and fit.cv["pairwise"] > 0.97
    for name in ("alpha_ms", "beta_ms"):  # at the median speed, which is the planted one
        got, want = getattr(fit, name), getattr(planted, name)
        assert abs(got - want) / want < 0.05, (name, got, want)
    reached = np.zeros_like(planted.K_ms)  # K where the requests ran (late cells are rare)
    for r in clean:
        for b, steps in enumerate(r.rounds_per_block):
            reached[b, :steps] += 1
    k_err = np.abs(fit.K_ms - planted.K_ms) / planted.K_ms
    assert (k_err * reached).sum() / reached.sum() < 0.03
    # exponent 0 is the fit as measured: probes recorded but not applied
    off = fit_cost_profile(
        slowed, block_size=32, hardware="h", config=dataclasses.replace(config, speed_exponent=0.0)
    )
    assert off.cv is not None and off.cv["speed_exponent"] == 0.0
    assert off.cv["mape"] == pytest.approx(as_measured.cv["mape"])
    assert off.alpha_ms == pytest.approx(as_measured.alpha_ms)


def test_probes_that_see_no_drift_leave_the_fit_as_it_was():
    """On a steady machine the probes only add noise: the fit keeps (close to) the times as
    measured and its metrics are those of the fit without probes."""
    planted = planted_paper_profile(n_blocks=16)
    clean = synthetic_requests(planted, 120, noise=0.01, seed=7)
    rng = np.random.default_rng(7)
    probed = [
        dataclasses.replace(r, probe_ms=float(2.5 * np.exp(rng.normal(0.0, 0.03)))) for r in clean
    ]
    plain = fit_cost_profile(clean, block_size=32, hardware="h")
    fit = fit_cost_profile(probed, block_size=32, hardware="h")
    assert fit.cv is not None and plain.cv is not None
    assert fit.cv["speed_exponent"] <= 0.25
    assert fit.cv["mape"] <= plain.cv["mape"] + 0.005


def test_bad_probes_or_exponents_are_refused():
    requests = synthetic_requests(planted_paper_profile(n_blocks=8), 25, seed=0)
    probed = [dataclasses.replace(r, probe_ms=2.0) for r in requests]
    with pytest.raises(TrainingError, match="speed probe"):
        fit_cost_profile(
            [*probed[:-1], dataclasses.replace(probed[-1], probe_ms=0.0)], block_size=32
        )
    with pytest.raises(TrainingError, match="speed exponent"):
        fit_cost_profile(probed, block_size=32, config=FitConfig(speed_exponent=1.5))
    # a run where some requests have no probe is fitted as measured
    mixed = [*probed[:-1], requests[-1]]
    fit = fit_cost_profile(mixed, block_size=32, hardware="h")
    assert fit.cv is not None and "speed_exponent" not in fit.cv
