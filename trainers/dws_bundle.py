"""Traces -> the DWS module of a bundle: train, export to ONNX (+ INT8, gated), add to the bundle.

The ONNX file is written at once: it is the light core's only way to run the predictor. The
export's parity probes are the first ``probes`` training prompts (the gate compares the file
with the torch model it came from, so training prompts are fair probes), and the INT8 cost gate
uses their true costs under the bundle's profile.
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle.dws import write_bundle_dws
from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import ConfigError

from .dws import DWSTrainConfig, DWSTrained, train_dws, true_costs
from .dws_data import dws_arrays

log = logging.getLogger(__name__)
#: the shipped example profile the DWS baselines are also calibrated for (evaluation)
PAPER_PROFILE = "paper-llada2.0-mini"


def train_dws_module(table: pa.Table, bundle: str | Path, profile: CostProfile, *,
                     config: DWSTrainConfig | None = None, seed: int = 0, int8: bool = True,
                     probes: int = 64) -> tuple[Path, DWSTrained]:
    """Train DWS on ``table``, export it and add it to ``bundle``; returns (bundle, trained)."""
    config = replace(config or DWSTrainConfig(), seed=seed)
    arrays = dws_arrays(table)
    N, S = arrays.shape  # noqa: N806
    if profile.max_steps != S or profile.block_size != arrays.block_size:
        raise ConfigError(f"the cost profile is for block size {profile.block_size} with "
                          f"{profile.max_steps} steps per block, the traces for block size "
                          f"{arrays.block_size} with S = {S}: profile this decoder")
    extra: dict[str, Any] = {}
    try:
        extra[PAPER_PROFILE] = load_cost_profile(PAPER_PROFILE)
    except ConfigError:  # the example is optional for training
        log.warning("shipped profile %s not found; baselines calibrated for the bundle's only",
                    PAPER_PROFILE)
    trained = train_dws(arrays, profile if config.baselines else None, config, profiles=extra)
    k = min(probes, arrays.n)
    sub = arrays.subset(np.arange(arrays.n) < k)
    from dwise_predict.export.onnx_dws import export_dws

    with tempfile.TemporaryDirectory(prefix="dwise-dws-") as tmp:
        fp32, q, checks = export_dws(trained, tmp, sub.prompts, int8=int8, profile=profile,
                                     true_cost=true_costs(sub, profile),
                                     prompt_blocks=sub.prompt_blocks)
        out = write_bundle_dws(bundle, fp32, int8_path=q,
                               exports=[c.to_json() for c in checks], training=trained.info)
    return out, trained
