"""Record an evaluation into a bundle: metrics in the manifest, plots under ``plots/``, card
re-rendered.

Why record it in the bundle and not only in a side JSON: the bundle is what gets pushed to the Hub
and pulled by a scheduler; its card should show how well these exact predictors ranked requests,
and the figures must be tied to these exact bytes (the plots are hashed like every other file,
so a tampered plot is refused on load). The update is atomic (:func:`update_bundle`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from ..errors import ConfigError
from .card import evaluated_estimates
from .modules import all_estimates, declared, estimate_owner
from .update import update_bundle

PLOTS_DIR = "plots"
PLOT_SUFFIXES = (".png", ".jpg", ".jpeg", ".svg", ".gif", ".webp")
#: a plot larger than this is almost certainly not a plot (the card would not render it either)
MAX_PLOT_BYTES = 20 * 1024 * 1024
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: keys of the eval JSON that describe the local run, not the bundle (a local path means nothing on
#: the Hub)
_LOCAL_KEYS = ("bundle", "plots")


def record_evaluation(
    bundle: str | Path,
    metrics: Mapping[str, Any],
    plot_files: Sequence[str | Path] = (),
    *,
    out: str | Path | None = None,
) -> Path:
    """Store ``metrics`` (the dict ``dwise-predict eval`` writes) and ``plot_files`` in bundle
    ``bundle``.

    Sets ``manifest["metrics"]`` (replacing an earlier evaluation and its plots), copies the plots
    to ``plots/NAME``, re-renders ``README.md`` and re-hashes, all atomically; returns the bundle
    folder. ``out`` writes the updated bundle to a new folder instead (needed for Hub/zoo copies).
    """
    clean = _check_metrics(metrics)
    plots = _check_plots(plot_files)
    with update_bundle(bundle, out=out) as draft:
        held = {kind for kind, _ in declared(draft.manifest)}
        missing = [e for e in evaluated_estimates(clean) if estimate_owner(e) not in held]
        if missing:
            raise ConfigError(
                f"the metrics hold {missing} but bundle {str(bundle)!r} has no "
                f"{sorted({str(estimate_owner(e)) for e in missing})} predictor: "
                "these "
                "metrics belong to another bundle; evaluate this one with "
                "`dwise-predict eval --bundle ... --record`"
            )
        for name in draft.files():
            if PurePosixPath(name).parts[0] == PLOTS_DIR:
                draft.remove_file(name)
        names = []
        for src in plots:
            name = f"{PLOTS_DIR}/{src.name}"
            draft.add_file(name, src)
            names.append(name)
        clean["plots"] = names
        draft.manifest["metrics"] = clean
    return draft.destination


def json_safe(obj: Any) -> Any:
    """``obj`` with NaN/inf as None, numpy scalars as Python numbers and keys as strings (strict
    JSON)."""
    if isinstance(obj, Mapping):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _check_metrics(metrics: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(metrics, Mapping):
        raise ConfigError(
            "metrics must be a dict (the JSON `dwise-predict eval` "
            f"writes), got {type(metrics).__name__}"
        )
    clean = {k: v for k, v in json_safe(metrics).items() if k not in _LOCAL_KEYS}
    if not evaluated_estimates(clean):
        raise ConfigError(
            f"the metrics hold none of the estimates {list(all_estimates())}; "
            "pass the dict "
            "`dwise-predict eval` writes (or evaluate_bundle returns)"
        )
    try:
        json.dumps(clean, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"the metrics are not plain JSON ({e}); pass numbers, strings, lists and dicts only"
        ) from e
    return clean


def _check_plots(plot_files: Sequence[str | Path]) -> list[Path]:
    if isinstance(plot_files, (str, Path)):
        plot_files = [plot_files]
    plots = [Path(p).expanduser() for p in plot_files]
    seen: dict[str, Path] = {}
    for p in plots:
        if not p.is_file():
            raise ConfigError(
                f"plot {p} does not exist; pass the files `dwise-predict eval` wrote (or omit them)"
            )
        if p.suffix.lower() not in PLOT_SUFFIXES:
            raise ConfigError(
                f"plot {p} is not an image the card can show ({', '.join(PLOT_SUFFIXES)})"
            )
        size = p.stat().st_size
        if size == 0 or size > MAX_PLOT_BYTES:
            raise ConfigError(
                f"plot {p} has {size} bytes (allowed 1 to {MAX_PLOT_BYTES}); regenerate it"
            )
        if p.suffix.lower() == ".png":
            with open(p, "rb") as f:
                if f.read(len(_PNG_MAGIC)) != _PNG_MAGIC:
                    raise ConfigError(
                        f"plot {p} is named .png but is not a PNG image; regenerate it"
                    )
        if p.name in seen:
            raise ConfigError(f"plots {seen[p.name]} and {p} share the name {p.name!r}; rename one")
        seen[p.name] = p
    return plots
