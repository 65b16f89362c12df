"""Refinement ensemble -> ONNX through ``torch.onnx.export``, with the survival math inside the
graph.

The exporter takes the same numpy weights the core predicts with
(:class:`dwise_predict.predictors.refinement.RefinementEnsemble`: members ``w1 (H+2, W)``, ``b1``,
``w2 (W, K)``, ``b2``, input standardization and scales), rebuilds the function as a torch module,
and exports it, so the ONNX file is self-contained: raw inputs in, estimates out.

Graph: ``hidden (n, H)``, ``prompt_tokens (n,)``, ``output_budget (n,)`` ->
standardize / scale -> one ``Linear(H+2, members*W)`` (all members' first layers, as the numpy
path does) -> GELU(tanh) -> per member ``Linear(W, K)`` hazard logits ``z`` ->
``S = exp(cumsum(-softplus(z)))`` averaged over members -> ``survival (n, K)`` and
``mean = sum_k S (n,)``. The batch axis is dynamic. The isotonic map is not in the graph: it is
two arrays applied in numpy by the loader (see :mod:`dwise_predict.predictors.calibration`).

``log(1 - sigmoid(z)) = -softplus(z)`` keeps the graph stable for large logits, as in numpy.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.errors import MissingDependencyError, ModelError
from dwise_predict.predictors.onnx_runtime import (
    REFINEMENT_INPUTS,
    REFINEMENT_OUTPUTS,
    OnnxRefinement,
)
from dwise_predict.predictors.refinement import ONNX_FILE, RefinementEnsemble

from ._onnx_files import save_model_atomic, set_metadata
from .parity import ExportCheck, OnnxExporter, Tolerance, compare, decide, time_batches

REFINEMENT_ONNX = ONNX_FILE
#: precision -> what is compared, and the bound
TOLERANCES = {
    "fp32": Tolerance(
        1e-2,
        1e-4,
        "raw mean remaining rounds; float32 cumsum over K rounds vs "
        "float64 in numpy: far below the one-round granularity of the scheduler",
    ),
    "int8": Tolerance(
        0.5,
        0.02,
        "raw mean remaining rounds; INT8 weights may move an estimate by "
        "under half a round or 2%, less than one round of the scheduler's decrement",
    ),
}
DEFAULT_OPSET = 18


def ensemble_module(ensemble: Any) -> Any:
    """A ``torch.nn.Module`` computing exactly the ensemble's survival curve and restricted mean
    (float32)."""
    try:
        import torch
    except ImportError as e:
        raise MissingDependencyError(
            "ONNX export of the refinement ensemble needs torch; pip install 'dwise-predict[train]'"
        ) from e
    members = list(ensemble.members)
    if not members:
        raise ModelError("the refinement ensemble has no members")
    width = int(members[0].w1.shape[1])
    if any(int(m.w1.shape[1]) != width for m in members):
        raise ModelError(
            "refinement members have different widths; they cannot share one first layer"
        )

    def t(a: Any) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    class SurvivalEnsemble(torch.nn.Module):
        # buffers (register_buffer): declared so the type checker knows they are tensors
        hidden_mean: torch.Tensor
        inv_std: torch.Tensor
        inv_scales: torch.Tensor

        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("hidden_mean", t(ensemble.hidden_mean))
            self.register_buffer(
                "inv_std", t(1.0 / np.asarray(ensemble.hidden_std, dtype=np.float32))
            )
            self.register_buffer(
                "inv_scales",
                t([1.0 / ensemble.prompt_tokens_scale, 1.0 / ensemble.output_budget_scale]),
            )
            self.first = torch.nn.Linear(members[0].w1.shape[0], width * len(members))
            heads = [torch.nn.Linear(width, m.w2.shape[1]) for m in members]
            with torch.no_grad():
                self.first.weight.copy_(t(np.concatenate([m.w1 for m in members], axis=1).T))
                self.first.bias.copy_(t(np.concatenate([m.b1 for m in members])))
                for head, m in zip(heads, members):
                    head.weight.copy_(t(np.asarray(m.w2).T))
                    head.bias.copy_(t(m.b2))
            self.heads = torch.nn.ModuleList(heads)
            self.width = width

        def forward(self, hidden: Any, prompt_tokens: Any, output_budget: Any) -> tuple[Any, Any]:
            h = (hidden - self.hidden_mean) * self.inv_std
            scalars = torch.stack([prompt_tokens, output_budget], dim=1) * self.inv_scales
            a = torch.nn.functional.gelu(
                self.first(torch.cat([h, scalars], dim=1)), approximate="tanh"
            )
            curves = [
                torch.exp(
                    torch.cumsum(
                        -torch.nn.functional.softplus(
                            head(a[:, i * self.width : (i + 1) * self.width])
                        ),
                        dim=1,
                    )
                )
                for i, head in enumerate(self.heads)
            ]
            survival = curves[
                0
            ]  # members' curves summed in order, then averaged (as the numpy path does)
            for s in curves[1:]:
                survival = survival + s
            survival = survival / len(curves)
            return survival, survival.sum(dim=1)

    return SurvivalEnsemble().eval()


def refinement_to_onnx(ensemble: Any, path: str | Path, *, opset: int = DEFAULT_OPSET) -> Path:
    """Export ``ensemble`` (a ``RefinementEnsemble``) to ``path``; returns the path."""
    try:
        import onnx
        import torch
    except ImportError as e:
        raise MissingDependencyError(
            f"ONNX export needs torch and onnx ({e}); pip install 'dwise-predict[train]'"
        ) from e
    module = ensemble_module(ensemble)
    hidden_size, k = int(ensemble.hidden_size), int(ensemble.K)
    n = 2  # example batch; the axis is exported as dynamic
    example = (torch.zeros(n, hidden_size), torch.ones(n), torch.ones(n))
    batch = torch.export.Dim("batch", min=1)
    with tempfile.TemporaryDirectory(prefix="dwise-onnx-") as tmp:
        raw = Path(tmp) / "refinement.onnx"
        with _quiet_exporter():
            torch.onnx.export(
                module,
                example,
                str(raw),
                input_names=list(REFINEMENT_INPUTS),
                output_names=list(REFINEMENT_OUTPUTS),
                opset_version=opset,
                dynamo=True,
                dynamic_shapes={
                    "hidden": {0: batch},
                    "prompt_tokens": {0: batch},
                    "output_budget": {0: batch},
                },
                external_data=False,
                verbose=False,
            )
        onx = onnx.load(str(raw), load_external_data=True)
    onx.graph.name = "dwise_refinement"
    set_metadata(
        onx,
        {
            "dwise.predictor": RefinementEnsemble.kind,
            "dwise.precision": "fp32",
            "dwise.hidden_size": str(hidden_size),
            "dwise.K": str(k),
            "dwise.members": str(len(ensemble.members)),
            "dwise.inputs": "hidden (n, H) float32 raw first-round "
            "hidden; prompt_tokens (n,); output_budget (n,)",
            "dwise.output": "survival (n, K): P(remaining >= k); mean (n,): raw restricted mean of "
            "remaining rounds after the first denoising round (apply the isotonic map for the "
            "calibrated estimate)",
        },
    )
    return save_model_atomic(onx, path)


class _quiet_exporter:
    """torch.onnx's dynamo exporter logs progress and torchvision notices; keep the CLI output
    clean."""

    def __enter__(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")
        self._levels = {}
        for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript"):
            lg = logging.getLogger(name)
            self._levels[name] = lg.level
            lg.setLevel(logging.ERROR)

    def __exit__(self, *exc: Any) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        self._warnings.__exit__(*exc)


def refinement_probes(
    ensemble: Any, *, n: int = 256, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hidden rows ~ N(mean, (1.5 std)^2); prompt lengths in [0, 2 scale]; budgets in [1, scale]."""
    rng = np.random.default_rng(seed)
    mean = np.asarray(ensemble.hidden_mean, dtype=np.float64)
    std = np.asarray(ensemble.hidden_std, dtype=np.float64)
    hidden = (mean + 1.5 * std * rng.standard_normal((n, mean.shape[0]))).astype(np.float32)
    prompt = np.floor(rng.random(n) * 2 * ensemble.prompt_tokens_scale)
    budget = np.maximum(1.0, np.floor(rng.random(n) * ensemble.output_budget_scale))
    return hidden, prompt, budget


def check_refinement(
    ensemble: Any,
    onnx_path: str | Path,
    *,
    probes: tuple[Any, Any, Any] | None = None,
    peer: str | Path | None = None,
    batches: tuple[int, ...] = (1, 128),
    repeats: int = 30,
    threads: int = 1,
) -> ExportCheck:
    """Parity of the raw restricted mean on probes; latency of native vs ONNX ``predict(raw=True)``.

    ``peer``: the FP32 file an INT8 file would replace, timed interleaved with it (for
    :func:`~.parity.gate_int8`).
    """
    onnx_model = OnnxRefinement(onnx_path, threads=threads)
    peer_model = OnnxRefinement(peer, threads=threads) if peer is not None else None
    h, p, b = refinement_probes(ensemble) if probes is None else probes
    check = ExportCheck(
        RefinementEnsemble.kind,
        onnx_model.precision,
        Path(onnx_path).name,
        compare(
            ensemble.predict(h, p, b, raw=True),
            onnx_model.predict(h, p, b, raw=True),
            TOLERANCES[onnx_model.precision],
        ),
    )

    def sides(n: int) -> dict[str, Any]:
        idx = np.arange(n) % len(h)
        args = (h[idx], p[idx], b[idx])
        fns = {
            "native": partial(ensemble.predict, *args, raw=True),
            "exported": partial(onnx_model.predict, *args, raw=True),
        }
        if peer_model is not None:
            fns["peer"] = partial(peer_model.predict, *args, raw=True)
        return fns

    time_batches(check, sides, batches=batches, repeats=repeats)
    return decide(check)


EXPORTER = OnnxExporter(
    file=ONNX_FILE, write=refinement_to_onnx, check=check_refinement, tolerances=TOLERANCES
)
