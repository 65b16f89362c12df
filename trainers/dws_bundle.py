"""Traces -> the DWS bundle module: train, export to ONNX (+ INT8, gated) into a folder.

The ONNX file is written at once: it is the light core's only way to run the predictor. The
export's parity probes are the first ``probes`` training prompts (the gate compares the file
with the torch model it came from, so training prompts are fair probes), and the INT8 cost gate
uses their true costs under the bundle's profile.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import ConfigError
from dwise_predict.predictors.dws import DWSPredictor

from .dws import DWSTrainConfig, DWSTrained, train_dws, true_costs
from .dws_data import dws_arrays

log = logging.getLogger(__name__)
#: the shipped example profile the DWS baselines are also calibrated for (evaluation)
PAPER_PROFILE = "paper-llada2.0-mini"


def train_dws_module(
    table: pa.Table,
    profile: CostProfile,
    folder: str | Path,
    *,
    config: DWSTrainConfig | None = None,
    seed: int = 0,
    int8: bool = True,
    probes: int = 64,
) -> tuple[DWSPredictor, DWSTrained]:
    """Train DWS on ``table`` and export it into ``folder`` (which must outlive the predictor
    until it is saved into a bundle); returns (the bundle module, the torch model)."""
    config = replace(config or DWSTrainConfig(), seed=seed)
    arrays = dws_arrays(table)
    N, S = arrays.shape  # noqa: N806
    if profile.max_steps != S or profile.block_size != arrays.block_size:
        raise ConfigError(
            f"the cost profile is for block size {profile.block_size} with "
            f"{profile.max_steps} steps per block, the traces for block size "
            f"{arrays.block_size} with S = {S}: profile this decoder"
        )
    extra: dict[str, Any] = {}
    try:
        extra[PAPER_PROFILE] = load_cost_profile(PAPER_PROFILE)
    except ConfigError:  # the example is optional for training
        log.warning(
            "shipped profile %s not found; baselines calibrated for the bundle's only",
            PAPER_PROFILE,
        )
    trained = train_dws(arrays, profile if config.baselines else None, config, profiles=extra)
    sub = arrays.subset(np.arange(arrays.n) < min(probes, arrays.n))
    from dwise_predict.export.onnx_dws import export_dws

    fp32, q, checks = export_dws(
        trained,
        folder,
        sub.prompts,
        int8=int8,
        profile=profile,
        true_cost=true_costs(sub, profile),
        prompt_blocks=sub.prompt_blocks,
        int8_embeddings=config.int8_only,
    )
    exports = [c.to_json() for c in checks]
    if config.int8_only and q is not None:
        only = DWSPredictor(q, trained.tokenizer, trained.config, exports=exports, ship_fp32=False)
        return only, trained
    if config.int8_only:
        log.warning("the DWS INT8 export failed its gate; the bundle ships the FP32 file")
    fp32.int8_path = q
    fp32.exports = exports
    return fp32, trained
