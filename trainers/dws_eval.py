"""Evaluate a bundle's DWS predictor on traces: cost error next to its scalar baselines.

Everything a scheduler would compare, per cost profile (the bundle's, and the shipped
``paper-llada2.0-mini`` example with heterogeneous step costs):

* ``cost_mae`` / ``cost_mape``: |expected cost of the predicted surface - true cost|, where the
  true cost prices the request's true activity matrix under the same profile;
* ``brier``: mean over requests of the summed squared error of the surface's cells;
* ``total_steps_mae``: |sum of the surface - true total denoising steps|;
* ``baselines``: the cost MAE of output length x per-token cost, total steps x mean step cost,
  and the direct cost regressor (trained under the bundle's training profile only: under
  another profile it is reported as trained, which is what "has to be retrained" means).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle import Bundle
from dwise_predict.cost import CostProfile, load_cost_profile
from dwise_predict.errors import BundleError
from dwise_predict.predictors.dws import BASELINE_NAMES
from dwise_predict.runtime.plots import pyplot

from .dws import true_costs
from .dws_data import DWSArrays, dws_arrays

PAPER_PROFILE = "paper-llada2.0-mini"


def surface_metrics(surface: np.ndarray, arrays: DWSArrays) -> dict[str, float]:
    err = surface.astype(np.float64) - arrays.activity
    return {
        "brier": float((err**2).sum(axis=(1, 2)).mean()),
        "total_steps_mae": float(np.mean(np.abs(surface.sum(axis=(1, 2)) - arrays.total_steps))),
    }


def cost_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    return {
        "cost_mae": float(np.mean(np.abs(pred - true))),
        "cost_mape": float(np.mean(np.abs(pred - true) / np.maximum(true, 1e-9))),
    }


def baseline_costs(
    raw: np.ndarray, m: np.ndarray, constants: dict[str, float]
) -> dict[str, np.ndarray]:
    """The three baselines' costs (ms) from their raw outputs ``(n, 3)``."""
    alpha = constants["alpha_ms"]
    return {
        "output_length": alpha * m + constants["per_token_ms"] * raw[:, 0],
        "total_steps": alpha * m + constants["per_step_ms"] * raw[:, 1],
        "direct_cost": raw[:, 2].astype(np.float64),
    }


def profile_metrics(
    surface: np.ndarray,
    raw: np.ndarray | None,
    arrays: DWSArrays,
    profile: CostProfile,
    constants: dict[str, float] | None,
) -> dict[str, Any]:
    true = true_costs(arrays, profile)
    pred = profile.expected_cost(surface, arrays.prompt_blocks)
    out: dict[str, Any] = {**cost_metrics(pred, true), "true_cost_mean_ms": float(true.mean())}
    if raw is not None and constants:
        base = baseline_costs(raw, arrays.prompt_blocks.astype(np.float64), constants)
        out["baselines"] = {k: cost_metrics(v, true) for k, v in base.items()}
        out["mae_ratio_vs_dws"] = {
            k: v["cost_mae"] / max(out["cost_mae"], 1e-12) for k, v in out["baselines"].items()
        }
    return out


def evaluate_dws(
    bundle: Bundle,
    traces: str | Path | pa.Table | DWSArrays,
    profiles: dict[str, CostProfile] | None = None,
) -> tuple[dict[str, Any], np.ndarray]:
    """``metrics["dws"]`` and the predicted surfaces ``(n, N, S)``.

    Top-level numbers are under the bundle's profile; ``profiles`` holds every profile's.
    """
    if bundle.dws is None:
        raise BundleError(f"bundle '{bundle.name}' has no DWS predictor to evaluate")
    cfg = bundle.dws.config
    arrays = (
        traces
        if isinstance(traces, DWSArrays)
        else dws_arrays(traces, n_blocks=cfg.n_blocks, max_steps=cfg.max_steps)
    )
    surface = bundle.dws.predict_surface(arrays.prompts)
    try:
        raw = bundle.dws.predict_baselines(arrays.prompts)
    except BundleError:
        raw = None
    named = dict(profiles or {})
    if "bundle" not in named and bundle.cost_profile is not None:
        named["bundle"] = bundle.cost_profile
    if PAPER_PROFILE not in named:
        named[PAPER_PROFILE] = load_cost_profile(PAPER_PROFILE)
    per = {
        name: profile_metrics(surface, raw, arrays, p, cfg.baselines.get(name))
        for name, p in named.items()
    }
    out: dict[str, Any] = {
        "n": arrays.n,
        **surface_metrics(surface, arrays),
        "baseline_names": list(BASELINE_NAMES),
        "direct_cost_trained_under": cfg.baselines.get("direct_cost_profile"),
        "profiles": per,
    }
    top = per.get("bundle") or next(iter(per.values()))
    out.update({k: v for k, v in top.items() if k in ("cost_mae", "cost_mape", "baselines")})
    return out, surface


def write_surface_plot(
    surface: np.ndarray, arrays: DWSArrays, path: str | Path, n: int = 4
) -> Path:
    """Predicted vs true surface heatmaps for ``n`` requests spread over the workload range."""
    plt = pyplot()

    order = np.argsort(arrays.total_steps, kind="stable")
    pick = order[np.linspace(0, len(order) - 1, min(n, len(order))).astype(int)]
    fig, axes = plt.subplots(2, len(pick), figsize=(3.0 * len(pick), 5.0), squeeze=False)
    for j, i in enumerate(pick):
        for row, (mat, title) in enumerate(
            ((surface[i], "predicted D"), (arrays.activity[i], "true A"))
        ):
            ax = axes[row][j]
            ax.imshow(mat, aspect="auto", vmin=0, vmax=1, cmap="viridis", origin="upper")
            ax.set_title(f"{title}, #{int(i)} ({arrays.category[i]})", fontsize=8)
            ax.set_xlabel("step s", fontsize=7)
            ax.set_ylabel("output block b", fontsize=7)
            ax.tick_params(labelsize=6)
    fig.suptitle("DWS: predicted surface vs true activity matrix (eval requests)")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
