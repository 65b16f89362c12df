"""Admission feature sets: the paper's three counts against the counts plus three lexical ones.

The admission model sees a prompt before anything runs. Word, newline and token counts tell a
long prompt from a short one, but not a sum from a chat question of the same length, and on the
reference model those differ several-fold in rounds. ``counts+lexical`` adds digits and code
symbols per mille of the characters and the question marks (docs/predictors.md, "Admission
features"). This benchmark trains both sets the way ``dwise-predict train`` does (seed 0, the
shipped LightGBM settings) on the reference model's train-split traces and scores them on the
eval traces:

* Spearman ρ against the traced total rounds, overall, without multiple choice (2 rounds each
  on tiny-bd 1.0.0, they rank apart by the counts alone) and per category;
* the per-arrival cost: median µs of ``model.predict_one(model.row(text, tokens))`` over the
  eval prompts (what a scheduler pays per arrival), and its ratio to the counts' in this run;
* whether the ``counts+lexical`` model is the zoo bundle's admission model byte for byte (it is
  when the zoo was trained on these traces).

    .venv/bin/python benchmarks/admission_features.py [--train-traces DIR] [--eval-traces DIR]

About 20 seconds. Prints a table, writes ``benchmarks/results/admission_features.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.features import FEATURE_SETS
from dwise_predict.ranking import spearman
from dwise_predict.tables import format_table

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "admission_features.json"


def rho3(x: np.ndarray, y: np.ndarray) -> float | None:
    rho = spearman(x, y)
    return None if rho is None else round(rho, 3)


def arrival_us(model: Any, prompts: list[str], tokens: list[int], repeats: int = 5) -> float:
    """Median µs per arrival, feature row from the text included, over ``repeats`` passes."""
    per_pass = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for p, n in zip(prompts, tokens):
            model.predict_one(model.row(p, n))
        per_pass.append((time.perf_counter() - t0) / len(prompts) * 1e6)
    return statistics.median(per_pass)


def measure(train_dir: Path, eval_dir: Path) -> dict[str, Any]:
    from dwise_predict.trainers.admission import AdmissionConfig, train_admission
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.pipeline import canonical_order

    from dwise_predict import load_bundle
    from dwise_predict.traces import read_traces

    train = canonical_order(read_traces(train_dir))  # the order `dwise-predict train` uses
    ev = read_traces(eval_dir)
    train_arrays, ev_arrays = trace_arrays(train), trace_arrays(ev)
    cats = ev_arrays.category.astype(str)
    true = ev_arrays.total_rounds.astype(float)
    prompts = [str(p) for p in ev.column("prompt").to_pylist()]
    tokens = [int(n) for n in ev.column("prompt_tokens").to_pylist()]
    zoo = load_bundle("tiny-bd")
    rows: dict[str, Any] = {}
    for name, names in FEATURE_SETS.items():
        cfg = AdmissionConfig(features=name, seed=0)
        model = train_admission(
            (train_arrays.admission_features(names), train_arrays.total_rounds), cfg
        )
        est = model.predict_features(ev_arrays.admission_features(names))
        rows[name] = {
            "features": list(names),
            "spearman": rho3(est, true),
            "spearman_without_mcq": rho3(est[cats != "mcq"], true[cats != "mcq"]),
            "per_category": {c: rho3(est[cats == c], true[cats == c]) for c in sorted(set(cats))},
            "arrival_us": round(arrival_us(model, prompts, tokens), 2),
            "is_zoo_model": model.model_text == zoo.admission.model_text,
        }
    base = rows["counts"]["arrival_us"]
    for r in rows.values():
        r["arrival_cost_vs_counts"] = round(r["arrival_us"] / base, 2)
    return {
        "train_traces": str(train_dir),
        "train_requests": train.num_rows,
        "eval_traces": str(eval_dir),
        "eval_requests": ev.num_rows,
        "zoo_bundle": zoo.manifest.get("name"),
        "feature_sets": rows,
    }


def print_table(doc: dict[str, Any]) -> None:
    sets = doc["feature_sets"]
    cats = sorted(next(iter(sets.values()))["per_category"])
    header = ["feature set", "ρ", "ρ without mcq", *cats, "µs/arrival", "vs counts", "zoo's"]
    rows = [
        [
            name,
            r["spearman"],
            r["spearman_without_mcq"],
            *(r["per_category"][c] for c in cats),
            r["arrival_us"],
            f"{r['arrival_cost_vs_counts']}x",
            "yes" if r["is_zoo_model"] else "no",
        ]
        for name, r in sets.items()
    ]
    print(
        f"admission ρ on {doc['eval_requests']} eval requests, trained on "
        f"{doc['train_requests']} train-split requests"
    )
    print(format_table(header, rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-traces", type=Path, default=ROOT / "runs/traces-train")
    p.add_argument("--eval-traces", type=Path, default=ROOT / "runs/tiny-bd-eval/tau0.95")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    for d in (args.train_traces, args.eval_traces):
        if not d.exists():
            raise SystemExit(
                f"{d} does not exist: trace it first "
                "(python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --step traces-train / report)"
            )
    doc = measure(args.train_traces, args.eval_traces)
    print_table(doc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
