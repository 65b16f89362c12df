"""How many traces the admission estimate needs: a learning curve on tiny-bd, scored where it acts.

Under a burst every request is ranked before any has run, so the admission estimate sets most
of the order. The zoo bundle's admission model (and its DWS predictor) are trained on the whole
train split of tiny-bd (zoo 1.0; 0.9.0's on its first 600 requests). This benchmark trains them
on the first N requests of that split, in the order the recipe's ``--limit`` takes them (N =
150, 300, 600, 1,200 and all 1,757; seed 0 and the shipped settings, so the whole split must
reproduce the zoo bundle's admission model byte for byte, which is checked), and scores each on
the 516 category-stratified eval requests of ``admission_sources.py`` (none seen in training):

* Spearman ρ of the estimate against the traced total rounds, overall and averaged within
  category;
* under a burst, B = 16, k = 8, SGLang's r + 1 forwards per block (the replay that matches the
  served ladder exactly): the share of the gap from ``dwise-r0`` to the oracle that
  ``dwise-admission`` closes (the estimate alone, never refined) and that ``dwise`` closes
  (the zoo bundle's refinement after each request's first denoising round), per sample: the
  ladder's 256, the next 260, all 516;
* at ``--dws-sizes`` (default 600 and all): the DWS predictor trained on the same requests
  (about 3 and 7 minutes on 2 cores), and the ``lightgbm+dws`` source, their mean. DWS draws
  its batches by row position and these rows are in the split's order, not the order the
  tracer wrote the zoo's training traces, so the 600 row's DWS is a sibling of the shipped
  one (docs/training-at-scale.md, "Determinism"), not the same file.

    .venv/bin/python benchmarks/training_size.py [--train-traces DIR] [--eval-traces DIR]

Without ``--train-traces`` it traces the whole train split into ``runs/training-size/train``
(about 6 minutes on 2 idle cores); without ``--eval-traces`` the stratified eval requests as
``admission_sources.py`` does (``runs/admission-sources/traces`` is reused when it is there).
Prints a table, writes ``benchmarks/results/training_size.json`` and
``docs/img/training_size.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIZES = (150, 300, 600, 1200, None)  # None: the whole train split
ZOO_SIZE = None  # the recipe's --train-requests: the whole split (zoo/tiny_bd/recipe/rebuild.py)
SAMPLES = {"ladder's 256": (0, 256), "the next 260": (256, 516), "all 516": (0, 516)}
GOAL = 0.70  # issue 42's bar for the share of the gap closed


def train_split_traces(traces: Path | None, workdir: Path) -> Path:
    """The whole train split traced as the recipe traces it (``--batch-size 16``)."""
    if traces is not None:
        return traces
    from dwise_predict.cli import main as cli

    workload, out = workdir / "workload", workdir / "train"
    if not (workload / "train.jsonl").exists() and cli(["workload", "--out", str(workload)]):
        raise SystemExit("building the tiny-bd workload failed")
    argv = ["trace", "--model", "tiny-bd", "--workload", str(workload), "--split", "train"]
    argv += ["--batch-size", "16", "--out", str(out)]
    t0 = time.perf_counter()
    if cli([*argv, "--resume"] if out.exists() else argv) != 0:
        raise SystemExit(f"tracing the train split into {out} failed")
    print(f"traced the train split in {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def in_split_order(table: Any) -> Any:
    """The traces in the train split's own order (the recipe's ``--limit N`` takes its first N)."""
    from block_alignment import tiny_bd_workload

    ids = [r.id for r in tiny_bd_workload().train]
    pos = {r: i for i, r in enumerate(table.column("request_id").to_pylist())}
    missing = [r for r in ids if r not in pos]
    if missing:
        raise SystemExit(
            f"{len(missing)} train-split requests are not in the traces (e.g. {missing[0]}); "
            "trace the whole split (drop --train-traces) or pass a folder that holds it"
        )
    return table.take([pos[r] for r in ids])


def dws_rounds(train: Any, prompts: list[str], profile: Any) -> tuple[np.ndarray, float]:
    """Train DWS as the recipe does (INT8 only, seed 0) and its expected rounds per prompt."""
    from dwise_predict.trainers.dws import DWSTrainConfig
    from dwise_predict.trainers.pipeline import train_bundle

    from dwise_predict import load_bundle

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dwise-training-size-") as tmp:
        out = Path(tmp) / "bundle"
        train_bundle(
            train,
            out,
            only="dws",
            cost_profile=profile,
            seed=0,
            configs={"dws": DWSTrainConfig(int8_only=True)},
        )
        rounds = load_bundle(out).predict_dws_rounds(prompts)
    return np.asarray(rounds, dtype=np.float64), time.perf_counter() - t0


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["sizes"]
    n = [r["train_requests"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    a.plot(n, [r["spearman"]["lightgbm"] for r in rows], "o-", label="ρ, all requests")
    a.plot(
        n,
        [r["within_category_spearman"]["lightgbm"] for r in rows],
        "s-",
        label="ρ, mean within category",
    )
    with_dws = [r for r in rows if "lightgbm+dws" in r["spearman"]]
    if with_dws:
        a.plot(
            [r["train_requests"] for r in with_dws],
            [r["spearman"]["lightgbm+dws"] for r in with_dws],
            "D--",
            label="ρ, lightgbm+dws, all",
        )
    a.set(
        xscale="log",
        xlabel="training requests (first N of the train split)",
        ylabel="Spearman ρ vs traced rounds",
        title="admission estimate, 516 stratified eval",
    )
    zoo_x = max(r["train_requests"] for r in rows) if ZOO_SIZE is None else ZOO_SIZE
    a.axvline(zoo_x, color="grey", lw=0.8, ls=":")
    a.legend(fontsize=8)
    for label, key, style in (
        ("dwise-admission (lightgbm)", ("dwise-admission", "lightgbm"), "o-"),
        ("dwise (lightgbm), zoo refinement", ("dwise", "lightgbm"), "s-"),
        ("dwise (lightgbm+dws), zoo refinement", ("dwise", "lightgbm+dws"), "D--"),
    ):
        pts = [(r["train_requests"], r["gap_closed"]["all 516"][key[0]].get(key[1])) for r in rows]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            b.plot(*zip(*pts), style, label=label)
    b.axhline(GOAL, color="red", lw=0.8, ls="--", label=f"goal {GOAL:.0%}")
    b.axvline(zoo_x, color="grey", lw=0.8, ls=":", label=f"zoo bundle ({zoo_x})")
    b.set(
        xscale="log",
        xlabel="training requests (first N of the train split)",
        ylabel="gap closed, dwise-r0 → oracle",
        title="burst, B = 16, k = 8, all 516",
    )
    b.set_ylim(top=max(0.78, b.get_ylim()[1]))
    b.legend(fontsize=8, loc="upper left")
    for ax in (a, b):  # the sizes themselves as ticks, not powers of ten
        ax.set_xticks(n, [str(x) for x in n], minor=False)
        ax.set_xticks([], minor=True)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--train-traces", type=Path, help="the train split traced before")
    ap.add_argument("--eval-traces", type=Path, help="the stratified eval requests traced before")
    ap.add_argument("--workdir", type=Path, default=Path("runs/training-size"))
    ap.add_argument(
        "--dws-sizes",
        default="600,all",
        help="comma list of sizes (or 'all') that also train DWS; '' for none",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/training_size.json")
    ap.add_argument("--plot", type=Path, default=ROOT / "docs/img/training_size.png")
    ap.add_argument("--from-json", type=Path, help="print and plot a run written before")
    args = ap.parse_args(argv)

    if args.from_json is not None:
        doc = json.loads(args.from_json.read_text(encoding="utf-8"))
    else:
        doc = measure(args, argv)
        from dwise_predict.atomic import write_json

        write_json(args.out, doc)
    report(doc)
    plot(doc, args.plot)
    print(f"wrote {args.plot}" if args.from_json else f"wrote {args.out} and {args.plot}")
    return 0


def measure(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """Train at every size and score each on the stratified eval requests (the JSON's shape)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from admission_sources import burst_requests, rho3, run_sample, stratified_traces
    from dwise_predict.trainers.admission import AdmissionConfig, train_admission
    from dwise_predict.trainers.dataset import category_counts, trace_arrays

    from dwise_predict import load_bundle
    from dwise_predict.features import DEFAULT_FEATURE_SET, feature_set
    from dwise_predict.ranking import spearman
    from dwise_predict.runtime import estimates_from_bundle
    from dwise_predict.traces import read_traces

    eval_traces = args.eval_traces
    if eval_traces is None and (ROOT / "runs/admission-sources/traces").exists():
        eval_traces = ROOT / "runs/admission-sources/traces"
    ev = stratified_traces(516, eval_traces, ROOT / "runs/admission-sources")
    train_all = in_split_order(read_traces(train_split_traces(args.train_traces, args.workdir)))
    zoo = load_bundle("tiny-bd")
    reqs, true = burst_requests(ev)
    _, refined = estimates_from_bundle(zoo, ev)  # the zoo's refinement, fixed across sizes
    ev_arrays = trace_arrays(ev)
    prompts = ev.column("prompt").to_pylist()
    cats = np.array(ev.column("category").to_pylist())
    dws_at = {s.strip() for s in args.dws_sizes.split(",") if s.strip()}

    def quality(est: np.ndarray) -> tuple[float, float]:
        # a small training set can leave the estimate constant within a category: it ranks
        # nothing there, so its undefined ρ counts as 0
        within = [spearman(est[cats == c], true[cats == c]) for c in sorted(set(cats))]
        mean_within = float(np.mean([0.0 if r is None else r for r in within]))
        return rho3(est, true), round(mean_within, 3)

    rows: list[dict[str, Any]] = []
    for size in SIZES:
        n = train_all.num_rows if size is None else min(size, train_all.num_rows)
        train = train_all.slice(0, n)
        arrays = trace_arrays(train)
        cfg = AdmissionConfig(seed=0, features=DEFAULT_FEATURE_SET)  # what the zoo's traces pick
        X = arrays.admission_features(feature_set(DEFAULT_FEATURE_SET))
        model = train_admission((X, arrays.total_rounds), cfg)
        if size == ZOO_SIZE and model.model_text != zoo.admission.model_text:
            raise SystemExit(
                "the train-split traces do not reproduce the zoo bundle's admission model: "
                "these traces are not the ones it was trained on (re-trace the split)"
            )
        X_ev = ev_arrays.admission_features(model.feature_names)
        sources = {"lightgbm": np.asarray(model.predict_features(X_ev), float)}
        row: dict[str, Any] = {"train_requests": n, "categories": category_counts(arrays.category)}
        if ("all" if size is None else str(size)) in dws_at:
            dws, seconds = dws_rounds(train, prompts, zoo.cost_profile)
            sources["lightgbm+dws"] = 0.5 * (sources["lightgbm"] + dws)
            row["dws_train_seconds"] = round(seconds, 1)
        row["spearman"], row["within_category_spearman"] = {}, {}
        for s, est in sources.items():
            row["spearman"][s], row["within_category_spearman"][s] = quality(est)
        row["gap_closed"], row["mean_completion_rounds"] = {}, {}
        for sample, (lo, hi) in SAMPLES.items():
            sub = {s: (est[lo:hi], refined[lo:hi]) for s, est in sources.items()}
            r = run_sample(reqs[lo:hi], sub, tuple(sources), ("dwise-admission", "dwise"))
            row["gap_closed"][sample] = r["gap_closed"]
            row["mean_completion_rounds"][sample] = r["mean_completion_rounds"]
        rows.append(row)
        print(
            f"N = {n}: ρ {row['spearman']}, closed (all) {row['gap_closed']['all 516']}", flush=True
        )

    return {
        "command": "python benchmarks/training_size.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "model": zoo.fingerprint.short(),
        "refinement": f"zoo bundle {zoo.name} (trained on the whole train split)",
        "eval_requests": len(reqs),
        "slots": 16,
        "k": 8,
        "goal_gap_closed": GOAL,
        "sizes": rows,
    }


def report(doc: dict[str, Any]) -> None:
    from dwise_predict.tables import format_table

    rows = doc["sizes"]
    rungs = (
        ("dwise-admission", "lightgbm"),
        ("dwise", "lightgbm"),
        ("dwise-admission", "lightgbm+dws"),
        ("dwise", "lightgbm+dws"),
    )

    def closed(r: dict[str, Any], sample: str, policy: str, source: str) -> str:
        v = r["gap_closed"][sample][policy].get(source)
        return "—" if v is None else f"{v:.0%}"

    def rho(r: dict[str, Any], key: str, source: str) -> str:
        return f"{r[key][source]:.3f}" if source in r[key] else "—"

    print("\nadmission estimate by training requests (first N of the train split), 516 eval")
    print("requests; share of the gap from dwise-r0 to the oracle closed under a burst, all 516")
    head = ["train requests", "ρ", "ρ within", "ρ, +dws", *(f"{p} ({s})" for p, s in rungs)]
    table = [
        [
            str(r["train_requests"]),
            rho(r, "spearman", "lightgbm"),
            rho(r, "within_category_spearman", "lightgbm"),
            rho(r, "spearman", "lightgbm+dws"),
            *(closed(r, "all 516", p, s) for p, s in rungs),
        ]
        for r in rows
    ]
    print(format_table(head, table))
    print("\nthe same by sample (the ladder's 256 / the next 260)")
    table = [
        [str(r["train_requests"])]
        + [" / ".join(closed(r, smp, p, s) for smp in list(SAMPLES)[:2]) for p, s in rungs]
        for r in rows
    ]
    print(format_table(["train requests", *(f"{p} ({s})" for p, s in rungs)], table))


if __name__ == "__main__":
    raise SystemExit(main())
