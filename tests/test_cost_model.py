"""The light-core cost profile: pricing, shapes, files, bad input (numpy only, fast)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dwise_predict.cost import CostProfile, load_cost_profile, named_cost_profiles
from dwise_predict.errors import ConfigError, FingerprintMismatchError, PredictorInputError


def _profile(**kw) -> CostProfile:
    K = np.arange(12, dtype=float).reshape(3, 4) + 1.0  # K[b, s] = 4b + s + 1
    args = dict(
        alpha_ms=2.0,
        beta_ms=3.0,
        K_ms=K,
        delta_ms=0.5,
        block_size=4,
        max_steps=4,
        fingerprint={
            "model_id": "m",
            "block_size": 4,
            "decoding": "low_confidence",
            "threshold": 0.9,
        },
        hardware="test",
    )
    args.update(kw)
    return CostProfile(**args)


def test_request_cost_is_the_cost_model_by_hand():
    p = _profile()
    # blocks ran 2 and 1 steps, 3 prompt blocks: alpha*3 + beta*2 + (K00+K01+K10) + delta*3*3
    expect = 2.0 * 3 + 3.0 * 2 + (1 + 2 + 5) + 0.5 * 3 * 3
    assert p.request_cost([2, 1], 3) == pytest.approx(expect)


def test_expected_cost_of_a_surface_is_linear_in_it():
    p = _profile()
    a = np.zeros((3, 4))
    a[0, :2] = 1
    a[1, :1] = 1  # noqa: E702
    b = np.zeros((3, 4))
    b[0, :4] = 1  # noqa: E702
    mix = 0.25 * a + 0.75 * b  # a surface: the expectation of two activity matrices
    got = p.expected_cost(np.stack([a, b, mix]), np.array([3, 3, 3]))
    assert got[2] == pytest.approx(0.25 * got[0] + 0.75 * got[1])
    assert got[0] == pytest.approx(p.request_cost([2, 1], 3))


def test_wider_surface_repeats_the_last_row_and_narrower_pads():
    p = _profile()
    five_blocks = np.zeros((5, 4))
    five_blocks[:, 0] = 1  # noqa: E702
    # rows 3 and 4 are priced like row 2 (K[2, 0] = 9)
    expect = 3.0 * 5 + (1 + 5 + 9 + 9 + 9)
    assert p.expected_cost(five_blocks, 0)[0] == pytest.approx(expect)
    assert p.expected_cost(np.ones((1, 1, 2)), [0])[0] == pytest.approx(3.0 + 1 + 2)
    with pytest.raises(PredictorInputError, match="another decoder"):
        p.expected_cost(np.ones((1, 2, 5)), [0])


@pytest.mark.parametrize("bad", [np.nan, -0.1, 1.5])
def test_bad_surfaces_are_refused(bad):
    D = np.full((1, 3, 4), 0.5)
    D[0, 1, 2] = bad  # noqa: E702
    with pytest.raises(PredictorInputError):
        _profile().expected_cost(D, [1])


def test_nan_or_negative_profile_is_refused_at_construction_and_on_load(tmp_path):
    K = np.ones((3, 4))
    K[1, 1] = np.nan  # noqa: E702
    with pytest.raises(ConfigError, match="NaN"):
        _profile(K_ms=K)
    with pytest.raises(ConfigError, match="finite"):
        _profile(alpha_ms=float("nan"))
    with pytest.raises(ConfigError, match="negative"):
        _profile(beta_ms=-1.0)
    with pytest.raises(ConfigError, match="step columns"):
        _profile(max_steps=5)
    d = _profile().to_json()
    d["delta_ms"] = float("nan")
    f = tmp_path / "cost_profile.json"
    f.write_text(json.dumps(d))  # Python writes the NaN literal
    with pytest.raises(ConfigError, match="delta_ms"):
        CostProfile.load(f)


def test_save_load_round_trip_is_exact(tmp_path):
    p = _profile(cv={"r2": 0.99, "mape": 0.03, "spearman": 0.98, "pairwise": 0.95})
    assert p.save(tmp_path) == ["cost_profile.json"]
    path = tmp_path / "cost_profile.json"
    d = json.loads(path.read_text())
    assert set(d) >= {
        "alpha_ms",
        "beta_ms",
        "K_ms",
        "delta_ms",
        "cv",
        "fingerprint",
        "hardware",
        "block_size",
        "max_steps",
    }
    q = load_cost_profile(path)
    assert q.to_json() == p.to_json()
    assert not list(tmp_path.glob(".*tmp"))  # the atomic write left no temporary file


def test_another_block_size_or_decoder_is_refused():
    p = _profile()
    p.check_compatible({"model_id": "m", "block_size": 4, "threshold": 0.9})
    with pytest.raises(FingerprintMismatchError, match="block_size"):
        p.check_compatible({"model_id": "m", "block_size": 32})
    with pytest.raises(FingerprintMismatchError, match="threshold"):
        p.check_compatible({"model_id": "m", "threshold": 0.95})


def test_paper_profile_ships_and_has_the_papers_heterogeneity():
    assert "paper-llada2.0-mini" in named_cost_profiles()
    p = load_cost_profile("paper-llada2.0-mini")
    assert (p.block_size, p.max_steps) == (32, 32)
    # forward 6.0 ms at the first step rising to 8.6 ms at the last (attention at 256 tokens)
    m = 8  # 256 prompt tokens: context 256 at the first output block
    assert p.cell_cost(0, 0, m) == pytest.approx(6.0, abs=1e-3)
    assert p.cell_cost(0, 31, m) == pytest.approx(8.6, abs=1e-3)
    # attention grows 0.80 ms from 256 to 32K context tokens
    assert p.cell_cost(0, 0, 1024) - p.cell_cost(0, 0, 8) == pytest.approx(0.80, abs=1e-3)
    with pytest.raises(ConfigError, match="shipped"):
        load_cost_profile("no-such-profile")


def test_a_speed_corrected_profile_and_an_older_one_both_load(tmp_path):
    """A profile fitted with speed probes records the exponent it chose in ``cv``; the bundle
    card still reads its R² and MAPE, and a profile from before probes (no exponent) loads
    and prices the same."""
    cv = {"r2": 0.9915, "mape": 0.0438, "spearman": 0.9974, "pairwise": 0.9805}
    new = _profile(cv={**cv, "speed_exponent": 0.75})
    new.save(tmp_path)
    back = load_cost_profile(tmp_path)
    assert back.cv == {**cv, "speed_exponent": 0.75}
    card = CostProfile.card_summary(back.entry(), {})
    assert "R² 0.9915, MAPE 4.4%" in card
    old = _profile(cv=cv).to_json()
    (tmp_path / "old.json").write_text(json.dumps(old))
    before = load_cost_profile(tmp_path / "old.json")
    assert before.cv == cv and "speed_exponent" not in before.cv
    assert before.request_cost([2, 1], 3) == back.request_cost([2, 1], 3)
