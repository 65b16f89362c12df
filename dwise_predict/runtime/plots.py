"""Plots of a policy comparison (matplotlib, imported only here and only when plotting).

matplotlib is no core dependency: ``pip install 'dwise-predict[plots]'`` (``train`` includes it).
:func:`pyplot` is the one way the library imports it, so a missing install is a clear error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..atomic import atomic_path
from ..errors import MissingDependencyError
from .simulator import SimulationRun


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, or :class:`MissingDependencyError`
    naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError(
            "plots need matplotlib: pip install 'dwise-predict[plots]'"
        ) from e
    return plt


def save_figure(fig: Any, path: str | Path, **savefig: Any) -> Path:
    """Save a matplotlib figure as PNG, atomically (``savefig`` options pass through)."""
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, **{"dpi": 120, "bbox_inches": "tight", **savefig, "format": "png"})
    return path


def latency_cdf(runs: Mapping[str, SimulationRun], path: str | Path, title: str = "") -> Path:
    """Empirical CDF of end-to-end latency, one line per policy (log-scale time axis)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for name, run in runs.items():
        lat = np.sort(run.finish_time - run.arrival_time)
        ax.plot(
            np.maximum(lat, 1e-3),
            np.arange(1, lat.size + 1) / lat.size,
            label=f"{name} (mean {lat.mean():.0f} s)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency (s)")
    ax.set_ylabel("fraction of requests")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or "Latency CDF per policy")
    out = save_figure(fig, path)
    plt.close(fig)
    return out


def round_composition(runs: Mapping[str, SimulationRun], path: str | Path, title: str = "") -> Path:
    """Per policy: share of rounds and of time by kind (prefill-only / mixed / denoise-only), and
    the mean filled slots per round against B."""
    plt = pyplot()
    names = list(runs)
    kinds = ("prefill-only", "mixed", "denoise-only")
    colors = ("#d95f02", "#7570b3", "#1b9e77")
    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.2))
    for panel, weight in ((0, "rounds"), (1, "time")):
        ax = axes[panel]
        bottom = np.zeros(len(names))
        for kind, color in zip(kinds, colors):
            vals = []
            for n in names:
                r = runs[n]
                p, f = r.round_prompt, r.round_filled
                mask = {"prefill-only": p == f, "mixed": (p > 0) & (p < f), "denoise-only": p == 0}[
                    kind
                ]
                w = np.ones_like(r.round_ms) if weight == "rounds" else r.round_ms
                vals.append(100.0 * w[mask].sum() / max(w.sum(), 1e-12))
            ax.bar(names, vals, bottom=bottom, color=color, label=kind)
            bottom += np.asarray(vals)
        ax.set_ylabel(f"% of {weight}")
        ax.set_title(f"round kinds by {weight}")
        ax.tick_params(axis="x", rotation=30)
    axes[0].legend(fontsize=8)
    ax = axes[2]
    slots = [runs[n].round_filled.mean() for n in names]
    ax.bar(names, slots, color="#666666")
    ax.axhline(next(iter(runs.values())).slots, color="k", ls="--", lw=1, label="B")
    ax.set_ylabel("filled slots per round")
    ax.set_title("filled slots per round")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=8)
    fig.suptitle(title or "Round composition")
    fig.tight_layout()
    out = save_figure(fig, path)
    plt.close(fig)
    return out
