"""DWS-SJF's share of oracle-SJF's gain in the simulator (non-preemptive SJF by a score)."""

from __future__ import annotations

import numpy as np
import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.runtime import synthetic_workload
from dwise_predict.runtime.sjf_share import ORACLE, sjf_oracle_share


def test_share_is_one_for_the_truth_and_falls_with_noise() -> None:
    w = synthetic_workload(n=200, seed=3)
    true = (w.prompt_blocks + w.total_rounds).astype(np.float64)  # work as the cost
    rng = np.random.default_rng(0)
    noisy = true * np.exp(rng.normal(0.0, 1.5, size=w.n))
    rows = {
        r.policy: r
        for r in sjf_oracle_share(
            w,
            {"dws-sjf": true.copy(), "noisy": noisy, "reverse": true.max() + 1 - true},
            true,
            slots=16,
        )
    }
    assert rows["fcfs"].share_of_oracle_gain == 0.0
    assert rows[ORACLE].share_of_oracle_gain == pytest.approx(1.0)
    assert rows[ORACLE].gain_vs_fcfs > 1.5  # SJF by true cost beats arrival order on burst
    assert rows["dws-sjf"].mean_latency == pytest.approx(rows[ORACLE].mean_latency)
    assert rows["reverse"].share_of_oracle_gain < rows["noisy"].share_of_oracle_gain < 1


def test_scores_must_cover_every_request() -> None:
    w = synthetic_workload(n=50, seed=1)
    with pytest.raises(ConfigError, match="finite"):
        sjf_oracle_share(w, {"x": np.full(50, np.nan)}, np.ones(50))
