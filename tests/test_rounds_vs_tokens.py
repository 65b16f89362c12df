"""`rounds_vs_tokens`: how well a score ranks denoising rounds, with and without mcq."""

from __future__ import annotations

import numpy as np
import pytest
from dwise_predict.trainers.evaluate import rounds_vs_tokens

from dwise_predict.ranking import spearman


def test_output_length_can_rank_rounds_backwards_outside_mcq():
    # the DWISE paper's pattern: code writes more tokens than chat in far fewer rounds
    cats = np.array(["code"] * 4 + ["chat"] * 4 + ["mcq"] * 4)
    tokens = np.array([240, 250, 260, 270, 200, 205, 210, 215, 5, 6, 7, 8])
    rounds = np.array([40, 42, 44, 46, 110, 112, 115, 118, 2, 2, 3, 3])
    estimate = rounds + np.array([1, -1, 2, 0, 3, -2, 1, 0, 0, 1, 0, 1])
    got = rounds_vs_tokens({"admission": (estimate.astype(float), rounds)}, cats, tokens, rounds)
    other = cats != "mcq"
    assert got["output_length"]["rho_all"] == pytest.approx(spearman(tokens, rounds))
    assert got["output_length"]["rho_other"] == pytest.approx(
        spearman(tokens[other], rounds[other])
    )
    assert got["output_length"]["rho_other"] < -0.5  # more tokens, fewer rounds
    assert got["admission"]["rho_other"] > 0.9
    assert got["output_length"]["rho_all"] > got["output_length"]["rho_other"]  # mcq flatters
