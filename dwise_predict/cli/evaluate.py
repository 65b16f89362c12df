"""`dwise-predict eval`: evaluate a bundle's predictors on traces (metrics JSON, table, plots).

Heavy modules are imported inside :func:`run` only.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..tables import format_table

if TYPE_CHECKING:
    from ..bundle import Bundle


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Evaluate a bundle's predictors on traces",
        description="Spearman ρ (overall and per category) and median predicted/actual of the "
        "admission (vs total rounds) and refined (vs rounds after the first "
        "round) estimates; writes metrics JSON and plots next to it.",
    )
    p.add_argument("--bundle", required=True, help="bundle folder (`dwise-predict train --out`)")
    p.add_argument(
        "--traces", required=True, help="evaluation traces (disjoint from the training traces)"
    )
    p.add_argument("--out", required=True, help="metrics JSON to write; plots go next to it")
    p.add_argument(
        "--holdout-category",
        help="also retrain without this category and evaluate on it (DWISE Table 7)",
    )
    p.add_argument(
        "--train-traces", help="training traces for --holdout-category (the bundle's training data)"
    )
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.add_argument(
        "--streaming",
        action="store_true",
        help="read the traces in record batches (traces larger than memory, or a URI "
        "such as s3://bucket/traces/); the same metrics as reading them whole",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="also store the metrics and plots in the bundle "
        "(manifest, plots/, README.md card), atomically",
    )
    p.set_defaults(func=run)


def _fmt(v: Any) -> Any:
    return "n/a" if v is None else float(v)


def run(args: argparse.Namespace) -> int:
    from dwise_predict.atomic import write_json
    from dwise_predict.bundle import load_bundle, record_evaluation
    from dwise_predict.bundle.modules import all_estimates
    from dwise_predict.bundle.record import json_safe
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.evaluate import (
        evaluate_arrays,
        evaluate_source,
        holdout_evaluation,
        write_plots,
    )
    from dwise_predict.trainers.streaming import ParquetSource

    if args.holdout_category and not args.train_traces:
        raise ConfigError(
            "--holdout-category retrains without that category: "
            "pass the training traces with --train-traces"
        )
    bundle = load_bundle(args.bundle)
    if args.streaming:
        metrics, preds = evaluate_source(bundle, ParquetSource(args.traces))
    else:
        arrays = trace_arrays(args.traces, need_hidden=bundle.refinement is not None)
        metrics, preds = evaluate_arrays(bundle, arrays)
        metrics["rounds_vs_tokens"], metrics["tokens_and_rounds"] = _rounds_vs_tokens(
            args.traces, arrays, preds
        )
    metrics["bundle"] = str(bundle.path)
    metrics["traces"] = Path(args.traces).resolve().name
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = [n for n in all_estimates() if n in metrics]
    if names:  # a DWS-only bundle (`train --only dws`) has no round estimates
        _print_round_tables(metrics, names)
    if "rounds_vs_tokens" in metrics:
        _print_rounds_vs_tokens(metrics["rounds_vs_tokens"], metrics["tokens_and_rounds"])
    if args.holdout_category:
        h = holdout_evaluation(
            bundle, args.train_traces, args.traces, args.holdout_category, seed=args.seed
        )
        metrics["holdout"] = h
        print()
        print(
            format_table(
                [
                    f"held out: {args.holdout_category}",
                    "ρ in training",
                    "ρ held out",
                    "ρ overall (held)",
                ],
                [
                    [
                        n,
                        _fmt(h[n]["in_training"]),
                        _fmt(h[n]["held_out"]),
                        _fmt(h[n]["overall_held_out"]),
                    ]
                    for n in names
                    if n in h
                ],
            )
        )
    plots = [] if args.no_plots or not names else write_plots(preds, out.parent, stem=out.stem)
    if bundle.dws is not None:
        plots += _evaluate_dws(bundle, args, metrics, out)
    if plots:
        metrics["plots"] = [p.name for p in plots]
    write_json(out, json_safe(metrics))
    print(f"\nmetrics written to {out}")
    if args.record:
        where = record_evaluation(args.bundle, metrics, plots)
        print(f"recorded in {where} (manifest metrics, {len(plots)} plots, README.md)")
    return 0


def _evaluate_dws(
    bundle: Bundle, args: argparse.Namespace, metrics: dict[str, Any], out: Path
) -> list[Path]:
    """metrics[DWS kind] under each profile, a table of it, and the surface heatmaps."""
    from dwise_predict.predictors.dws import DWSPredictor
    from dwise_predict.trainers.dws_data import dws_arrays
    from dwise_predict.trainers.dws_eval import evaluate_dws, write_surface_plot

    cfg = bundle.need(DWSPredictor).config
    arrays = dws_arrays(args.traces, n_blocks=cfg.n_blocks, max_steps=cfg.max_steps)
    dws, surface = evaluate_dws(bundle, arrays)
    metrics[DWSPredictor.kind] = dws
    rows = []
    for name, m in dws["profiles"].items():
        base = m.get("baselines") or {}
        kinds = ("output_length", "total_steps", "direct_cost")
        rows.append(
            [
                name,
                m["cost_mae"],
                m["cost_mape"],
                *(_fmt((base.get(k) or {}).get("cost_mae")) for k in kinds),
            ]
        )
    print()
    print(
        format_table(
            [
                "DWS cost profile",
                "cost MAE ms",
                "MAPE",
                "output-length MAE",
                "total-steps MAE",
                "direct-cost MAE",
            ],
            rows,
        )
    )
    print(f"DWS Brier {dws['brier']:.3f}, total-steps MAE {dws['total_steps_mae']:.2f}")
    if args.no_plots:
        return []
    return [write_surface_plot(surface, arrays, out.parent / f"{out.stem}_dws_surfaces.png")]


def _rounds_vs_tokens(
    traces: Path, arrays: Any, preds: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Table 12 (each score's ρ with work) and how rounds track output length."""
    from dwise_predict.traces import read_traces
    from dwise_predict.trainers.evaluate import rounds_vs_tokens, tokens_and_rounds

    tokens = read_traces(traces, columns=["output_tokens"]).column("output_tokens").to_numpy()
    return (
        rounds_vs_tokens(preds, arrays.category, tokens, arrays.total_rounds),
        tokens_and_rounds(arrays.category, tokens, arrays.total_rounds),
    )


def _score_label(name: str) -> str:
    """A score's row label: the true output length, or the estimate and, for an output-length
    baseline, the scheduler it stands for (its kind's ``paper_name``)."""
    from dwise_predict.bundle.modules import estimate_owner, registered

    if name == "output_length":
        return "true output length (any output-length ranker's best)"
    owner = estimate_owner(name)
    paper = getattr(registered().get(owner or ""), "paper_name", "")
    return f"{name}: {paper}" if paper else name


def _print_rounds_vs_tokens(
    table: dict[str, dict[str, float | None]], shape: dict[str, Any]
) -> None:
    from dwise_predict.trainers.evaluate import TRIVIAL_CATEGORIES

    print()
    print(
        format_table(
            ["ranks denoising rounds by", "ρ all", f"ρ without {', '.join(TRIVIAL_CATEGORIES)}"],
            [
                [_score_label(name), _fmt(v["rho_all"]), _fmt(v["rho_other"])]
                for name, v in table.items()
            ],
        )
    )
    rho = shape["rho_tokens_rounds"]
    print(
        f"output tokens vs rounds over {', '.join(shape['categories'])}: "
        f"ρ {'n/a' if rho is None else f'{rho:.3f}'}; median tokens per round: "
        + ", ".join(
            f"{c} {v['median_tokens_per_round']:.2f}" for c, v in shape["per_category"].items()
        )
    )


def _print_round_tables(metrics: dict[str, Any], names: list[str]) -> None:
    print(
        format_table(
            ["estimate", "spearman", "within-cat mean", "median ratio"],
            [
                [
                    n,
                    _fmt(metrics[n]["spearman"]),
                    _fmt(metrics[n]["within_category_mean_spearman"]),
                    _fmt(metrics[n]["median_ratio"]),
                ]
                for n in names
            ],
        )
    )
    cats = sorted(metrics["categories"])
    print()
    print(
        format_table(
            ["category", "n", *(f"ρ {n}" for n in names)],
            [
                [
                    c,
                    metrics["categories"][c],
                    *(_fmt(metrics[n]["per_category"][c]["spearman"]) for n in names),
                ]
                for c in cats
            ],
        )
    )
