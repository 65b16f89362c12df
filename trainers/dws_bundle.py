"""Traces -> the DWS bundle module: train, export to ONNX (+ INT8, gated) into a folder.

The ONNX file is written at once: it is the light core's only way to run the predictor. The
export's parity probes are the first ``probes`` training prompts (the gate compares the file
with the torch model it came from, so training prompts are fair probes), and the INT8 cost gate
uses their true costs under the bundle's profile. The exporter is the one the kind names
(``DWSPredictor.onnx_exporter``), found through the kind registry like every other kind's.

:data:`TRAINER` is the DWS kind's trainer (``DWSPredictor.trainer``): it reads the prompt text
and needs the bundle's cost profile. Under several processes (``--devices 2 --strategy ddp``)
every process trains and only global rank 0 exports.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from dwise_predict.bundle.modules import hook
from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.predictors.dws import DWSPredictor

from .devices import DeviceConfig, is_global_zero
from .dws import DWSTrainConfig, DWSTrained, train_dws, true_costs
from .dws_data import DWSArrays, dws_arrays
from .kind import KindTrainer, TrainedPart, TrainSettings

if TYPE_CHECKING:
    from dwise_predict.export.onnx_dws import DWSExportCheck

    from .dataset import TraceArrays

log = logging.getLogger(__name__)


@runtime_checkable
class TrainedModelExporter(Protocol):
    """What the DWS kind's ``onnx_exporter`` must do besides reporting at ``export`` time:
    write and gate the files of a freshly trained torch model (``export/onnx_dws.py``)."""

    def export_trained(
        self, trained: DWSTrained, folder: str | Path, probes: list[str], **kwargs: Any
    ) -> tuple[DWSPredictor, Path | None, list[DWSExportCheck]]: ...


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
    devices: DeviceConfig | None = None,
) -> tuple[DWSPredictor, DWSTrained]:
    """Train DWS on ``table`` and export it into ``folder`` (which must outlive the predictor
    until it is saved into a bundle); returns (the bundle module, the torch model)."""
    config = replace(config or DWSTrainConfig(), seed=seed)
    arrays, trained = fit_dws(table, profile, config, devices=devices)
    return export_trained(arrays, trained, profile, folder, config, int8=int8, probes=probes)


def fit_dws(
    table: pa.Table,
    profile: CostProfile,
    config: DWSTrainConfig,
    *,
    devices: DeviceConfig | None = None,
) -> tuple[DWSArrays, DWSTrained]:
    """Check the traces against ``profile`` and train the torch model (every process)."""
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
    trained = train_dws(
        arrays, profile if config.baselines else None, config, profiles=extra, devices=devices
    )
    return arrays, trained


def export_trained(
    arrays: DWSArrays,
    trained: DWSTrained,
    profile: CostProfile,
    folder: str | Path,
    config: DWSTrainConfig,
    *,
    int8: bool = True,
    probes: int = 64,
) -> tuple[DWSPredictor, DWSTrained]:
    """Export ``trained`` with the kind's exporter into ``folder``; the bundle module."""
    sub = arrays.subset(np.arange(arrays.n) < min(probes, arrays.n))
    exporter = hook(DWSPredictor, "onnx_exporter")
    if exporter is None:  # ONNX is its only runtime form: the kind must name its exporter
        raise ConfigError("DWSPredictor names no onnx_exporter; restore its exporter's name")
    if not isinstance(exporter, TrainedModelExporter):
        raise ConfigError(
            f"DWSPredictor.onnx_exporter names a {type(exporter).__name__}, which cannot export "
            "a trained model (no export_trained); point it at export.onnx_dws:EXPORTER"
        )
    fp32, q, checks = exporter.export_trained(
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


def _train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
    if s.cost_profile is None or s.table is None or s.workdir is None:
        raise TrainingError(
            "training DWS needs a cost profile (its baselines and evaluation are in ms): "
            "pass --cost-profile FILE (from `dwise-predict profile`)"
        )
    config = replace(s.config(DWSPredictor.kind, DWSTrainConfig), seed=s.seed)
    data, trained = fit_dws(s.table, s.cost_profile, config, devices=s.devices)
    if not is_global_zero():
        return TrainedPart(None, trained.info)  # rank 0 exports and writes the bundle
    module, _ = export_trained(data, trained, s.cost_profile, s.workdir, config)
    return TrainedPart(module, trained.info)


#: the DWS kind's trainer (named by ``DWSPredictor.trainer``)
TRAINER = KindTrainer(
    train=_train, config_type=DWSTrainConfig, needs_cost_profile=True, reads_text=True
)
