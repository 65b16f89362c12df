"""Evaluate a bundle on traces: Spearman ρ overall and per category, median predicted/actual.

Targets (each kind's ``estimates`` in the kind registry, its evaluator beside its trainer;
metrics in docs/concepts.md): ``admission`` is compared with TOTAL denoising rounds;
``refined_raw`` and ``refined`` with rounds still to go after the first denoising round
(``total_rounds - 1``). ``median_ratio`` is the median of predicted / actual over requests
whose actual is > 0 (a request done in its first round has nothing left; it is counted in ρ only).
Held-out mode (DWISE Table 7) retrains both predictors without category C and evaluates on C.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dwise_predict.bundle import Bundle
from dwise_predict.bundle.modules import all_estimates
from dwise_predict.errors import ConfigError, TrainingError
from dwise_predict.predictors import AdmissionModel, RefinementEnsemble
from dwise_predict.ranking import spearman
from dwise_predict.runtime.plots import pyplot, save_figure

from .admission import AdmissionConfig
from .dataset import TraceArrays, category_counts, trace_arrays
from .kind import evaluator_for
from .refinement import RefinementConfig
from .streaming import ArraySource, RowSource, chunks


def median_ratio(pred: np.ndarray, actual: np.ndarray) -> float | None:
    keep = actual > 0
    return float(np.median(pred[keep] / actual[keep])) if keep.any() else None


def estimate_metrics(
    pred: np.ndarray, actual: np.ndarray, categories: np.ndarray
) -> dict[str, Any]:
    per_cat = {}
    for c in sorted(set(categories.tolist())):
        m = categories == c
        per_cat[str(c)] = {
            "spearman": spearman(pred[m], actual[m]),
            "median_ratio": median_ratio(pred[m], actual[m]),
            "n": int(m.sum()),
        }
    within = [v["spearman"] for v in per_cat.values() if v["spearman"] is not None]
    return {
        "spearman": spearman(pred, actual),
        "median_ratio": median_ratio(pred, actual),
        "n": len(pred),
        "within_category_mean_spearman": float(np.mean(within)) if within else None,
        "per_category": per_cat,
    }


def predictions(bundle: Bundle, arrays: TraceArrays) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """estimate name -> (predicted, actual) for what the bundle holds: each module's kind
    names its evaluator in the kind registry (kinds without one are evaluated elsewhere, e.g.
    DWS by :mod:`.dws_eval`)."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for kind in bundle.modules:
        evaluator = evaluator_for(kind)
        if evaluator is not None:
            out.update(evaluator(bundle, arrays))
    return out


def evaluate_arrays(
    bundle: Bundle, arrays: TraceArrays, chunk_rows: int = 4096
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Metrics and (predicted, actual) per estimate; predicted ``chunk_rows`` requests at a time.

    The chunking is the streaming evaluator's (:func:`evaluate_source`), so traces read whole
    and traces read in pieces give the same numbers to the last bit (a float32 matrix product's
    rounding depends on how many rows it multiplies at once).
    """
    return evaluate_source(bundle, ArraySource(arrays), chunk_rows)


def _metrics(
    preds: dict[str, tuple[np.ndarray, np.ndarray]], category: np.ndarray
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    metrics: dict[str, Any] = {"n_requests": len(category), "categories": category_counts(category)}
    for name, (p, a) in preds.items():
        metrics[name] = estimate_metrics(p, a, category)
    return metrics, preds


def evaluate_source(
    bundle: Bundle, source: RowSource, chunk_rows: int = 4096
) -> tuple[dict[str, Any], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """:func:`evaluate_arrays` on traces read ``chunk_rows`` at a time (larger than memory).

    Only the estimates, the targets and a category code per request are kept: a few bytes per
    request, not the hidden states.
    """
    parts: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    codes: list[np.ndarray] = []
    names: dict[str, int] = {}
    for start, stop in chunks(source.n, chunk_rows):
        part = source.read(start, stop)
        for name, (p, a) in predictions(bundle, part).items():
            parts.setdefault(name, ([], []))
            parts[name][0].append(p)
            parts[name][1].append(a)
        codes.append(
            np.array([names.setdefault(str(c), len(names)) for c in part.category], dtype=np.int32)
        )
    lookup = np.empty(len(names), dtype=object)
    for name, code in names.items():
        lookup[code] = name
    preds = {k: (np.concatenate(p), np.concatenate(a)) for k, (p, a) in parts.items()}
    return _metrics(preds, lookup[np.concatenate(codes)])


def evaluate_bundle(bundle: Bundle, traces: str | Path | pa.Table) -> dict[str, Any]:
    """The metrics JSON for ``bundle`` on ``traces`` (see the module doc for each estimate's
    target)."""
    arrays = trace_arrays(traces, need_hidden=bundle.refinement is not None)
    return evaluate_arrays(bundle, arrays)[0]


def holdout_evaluation(
    bundle: Bundle,
    train_traces: str | Path | pa.Table,
    eval_traces: str | Path | pa.Table,
    category: str,
    *,
    seed: int = 0,
    admission_config: AdmissionConfig | None = None,
    refinement_config: RefinementConfig | None = None,
    workdir: str | Path | None = None,
) -> dict[str, Any]:
    """DWISE Table 7: ρ within ``category`` with it in training (``bundle``) -> held out (retrained
    without it)."""
    import tempfile

    from dwise_predict.bundle import load_bundle

    from .kind import trainable
    from .pipeline import train_bundle

    train = trace_arrays(train_traces, need_hidden=bundle.refinement is not None)
    evals = trace_arrays(eval_traces, need_hidden=bundle.refinement is not None)
    cats = set(train.category.tolist())
    if category not in cats:
        raise ConfigError(
            f"category {category!r} is not in the training traces (they hold {sorted(cats)})"
        )
    if len(cats) < 2:
        raise TrainingError(
            "held-out evaluation needs at least two categories; "
            f"the training traces hold only {category!r}"
        )
    in_cat = evals.category == category
    if not in_cat.any():
        raise ConfigError(
            f"category {category!r} is not in the evaluation traces; pass traces that contain it"
        )
    only = [
        kind for kind in bundle.modules if kind in trainable() and evaluator_for(kind) is not None
    ]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        keep = train.category != category
        table = _table_without(train_traces, category)
        path = train_bundle(
            table,
            Path(tmp) / "holdout",
            only=only,
            seed=seed,
            configs=_holdout_configs(bundle, admission_config, refinement_config, seed),
            allow_single_category=len(cats) == 2,
        )
        held = load_bundle(path)
        in_training, _ = evaluate_arrays(bundle, evals.subset(in_cat))
        held_out, _ = evaluate_arrays(held, evals.subset(in_cat))
        overall_held, _ = evaluate_arrays(held, evals)
    result: dict[str, Any] = {
        "category": category,
        "n_train_without": int(keep.sum()),
        "n_eval": int(in_cat.sum()),
    }
    for name in all_estimates():
        if name in in_training:
            result[name] = {
                "in_training": in_training[name]["spearman"],
                "held_out": held_out[name]["spearman"],
                "overall_held_out": overall_held[name]["spearman"],
                "median_ratio_held_out": held_out[name]["median_ratio"],
            }
    return result


def _holdout_configs(
    bundle: Bundle,
    admission_config: AdmissionConfig | None,
    refinement_config: RefinementConfig | None,
    seed: int,
) -> dict[str, object]:
    """The retraining's configs: those given, else the bundle's own refinement config."""
    cfg_r = refinement_config
    if cfg_r is None and bundle.refinement is not None:
        saved = dict(bundle.refinement.info.get("config", {}))
        cfg_r = RefinementConfig(
            **{k: v for k, v in saved.items() if k in RefinementConfig.__dataclass_fields__}
        )
    given = {
        AdmissionModel.kind: admission_config,
        RefinementEnsemble.kind: cfg_r and replace(cfg_r, seed=seed),
    }
    return {kind: cfg for kind, cfg in given.items() if cfg is not None}


def _table_without(traces: str | Path | pa.Table, category: str) -> pa.Table:
    import pyarrow.compute as pc

    from .dataset import as_table

    table = as_table(traces)
    return table.filter(pc.not_equal(table.column("category"), category))


def write_plots(
    preds: dict[str, tuple[np.ndarray, np.ndarray]], out_dir: str | Path, stem: str = "eval"
) -> list[Path]:
    """Predicted-vs-actual scatter per estimate and a calibration curve, as PNG files in
    ``out_dir``."""
    plt = pyplot()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in all_estimates() if n in preds]
    paths = []
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 4), squeeze=False)
    for ax, n in zip(axes[0], names):
        p, a = preds[n]
        ax.scatter(a + 1, p + 1, s=4, alpha=0.35)
        lo, hi = 1, max(float(a.max()), float(p.max())) + 1
        ax.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="actual + 1",
            ylabel="predicted + 1",
            title=f"{n} (ρ={spearman(p, a) or float('nan'):.3f})",
        )
    fig.tight_layout()
    paths.append(
        save_figure(fig, out_dir / f"{stem}_pred_vs_actual.png", dpi=110, bbox_inches=None)
    )
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4.2))
    for n in names:
        p, a = preds[n]
        edges = np.unique(np.quantile(p, np.linspace(0, 1, 11)))
        if len(edges) < 2:
            continue
        b = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, len(edges) - 2)
        mp = [np.median(p[b == k]) for k in range(len(edges) - 1) if (b == k).any()]
        ma = [np.median(a[b == k]) for k in range(len(edges) - 1) if (b == k).any()]
        ax.plot(mp, ma, "o-", label=n)
    top = max(float(max(p.max(), a.max())) for p, a in preds.values())
    ax.plot([0, top], [0, top], "k--", lw=1, label="ideal")
    ax.set(xlabel="predicted (decile median)", ylabel="actual (decile median)", title="calibration")
    ax.legend()
    fig.tight_layout()
    paths.append(save_figure(fig, out_dir / f"{stem}_calibration.png", dpi=110, bbox_inches=None))
    plt.close(fig)
    return paths


#: categories whose work is near-constant and tiny (a multiple-choice answer is one block):
#: ranking them is trivial, so "rounds or tokens" is also reported without them
TRIVIAL_CATEGORIES = ("mcq",)


def rounds_vs_tokens(
    preds: dict[str, tuple[np.ndarray, np.ndarray]],
    categories: np.ndarray,
    output_tokens: np.ndarray,
    total_rounds: np.ndarray,
) -> dict[str, dict[str, float | None]]:
    """Why rounds, not tokens: Spearman ρ with the denoising rounds each score ranks, over all
    requests (``rho_all``) and without :data:`TRIVIAL_CATEGORIES` (``rho_other``).

    ``output_length`` is each request's TRUE output length: the best score any output-length
    ranker (SSJF, S³, LTR, TRAIL) can reach, since they all predict it. Each of the bundle's
    estimates is set against what it predicts (total rounds, or rounds still to go); a bundle
    trained with the output-length baselines (``--only ...,ssjf,s3,ltr,trail``) adds their
    scores, each against the work a scheduler ranks by it (total rounds; TRAIL's re-estimate
    against the rounds still to go): the paper's Table 12 on the bundle's own traces."""
    other = ~np.isin(categories.astype(str), TRIVIAL_CATEGORIES)
    scores = {"output_length": (output_tokens.astype(np.float64), total_rounds)}
    scores.update(preds)
    return {
        name: {
            "rho_all": spearman(pred, actual),
            "rho_other": spearman(pred[other], actual[other]),
        }
        for name, (pred, actual) in scores.items()
    }


#: the categories whose rounds and output length the issue's reference-model goal compares (open
#: text and structured text; multiple choice and long context left out)
TEXT_CATEGORIES = ("code", "math", "chat", "instruction")


def tokens_and_rounds(
    categories: np.ndarray, output_tokens: np.ndarray, total_rounds: np.ndarray
) -> dict[str, Any]:
    """How the model's rounds track its output length: Spearman ρ of output tokens with total
    denoising rounds over :data:`TEXT_CATEGORIES` (``rho_tokens_rounds``; the paper's
    LLaDA2.1-mini has them part ways), and each category's median output tokens per round and
    median rounds. When ρ is high, an output-length ranker (:func:`rounds_vs_tokens`'s
    ``ssjf``, ``s3``, ``ltr``, ``trail``) ranks work almost as well as a rounds estimate."""
    cats = categories.astype(str)
    tokens = output_tokens.astype(np.float64)
    rounds = total_rounds.astype(np.float64)
    text = np.isin(cats, TEXT_CATEGORIES)
    per_cat: dict[str, dict[str, float | int]] = {}
    for c in sorted(set(cats.tolist())):
        m = cats == c
        per_cat[c] = {
            "n": int(m.sum()),
            "median_tokens_per_round": float(np.median(tokens[m] / np.maximum(rounds[m], 1))),
            "median_rounds": float(np.median(rounds[m])),
            "median_tokens": float(np.median(tokens[m])),
        }
    return {
        "rho_tokens_rounds": spearman(tokens[text], rounds[text]) if text.any() else None,
        "categories": list(TEXT_CATEGORIES),
        "per_category": per_cat,
    }
