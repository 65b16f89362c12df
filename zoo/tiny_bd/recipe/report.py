"""Measure tiny-bd's denoising behaviour on the eval split and write docs/reference-model.*.

    python -m dwise_predict.zoo.tiny_bd.recipe.report --out docs/ [--n 1000]

Builds the default workload (the one tiny-bd's training excluded), traces its first ``--n``
eval requests with the tracing engine at each threshold (default τ = 0.95 and 0.8) and a
256-token budget, keeps the traces under ``runs/tiny-bd-eval/`` for reuse, and writes

* ``OUT/reference-model.json``: every figure below, per threshold;
* the figures section of ``OUT/reference-model.md`` (between the ``figures`` markers; the
  prose around it is kept) and the plots under ``OUT/img/``.

Figures: total denoising rounds p10/p50/p90/max and p90/p10, budget-hit share; per category
median rounds, median rounds per output block, median output tokens, budget-hit share, p90/p10
of rounds per output block; exact-match accuracy on math and mcq next to chance; tokens
committed per round on chat; rounds per block by difficulty knob inside math and mcq.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.atomic import write_text
from dwise_predict.errors import ConfigError
from dwise_predict.runtime.plots import save_figure

from ..card import MEASURED_HEADING

DEFAULT_THRESHOLDS = (0.95, 0.8)
BUDGET = 256
#: the report measures the first REPORT_REQUESTS eval requests; checkpoints are watched and
#: chosen on the eval requests after them (``probe.py``), so no figure here picks its own model
REPORT_REQUESTS = 1000
FIGURES_BEGIN = (
    "<!-- figures:begin (written by python -m dwise_predict.zoo.tiny_bd.recipe.report) -->"
)
FIGURES_END = "<!-- figures:end -->"
CATEGORY_ORDER = ("chat", "instruction", "code", "math", "mcq", "long_context")

_ANSWER_NUM = re.compile(r"answer is\s*\(?(-?\d[\d,]*)")
_ANSWER_LETTER = re.compile(r"answer is\s*\(([A-Z])\)")


@dataclass
class RequestStats:
    """One traced request, reduced to what the figures need (joined with its workload record)."""

    request_id: str
    category: str
    total_rounds: int
    output_blocks: int
    output_tokens: int
    hit_budget: bool
    output_text: str
    meta: dict[str, Any]

    @property
    def rounds_per_block(self) -> float:
        return self.total_rounds / max(1, self.output_blocks)


def _pct(values: Sequence[float], q: float) -> float:
    return (
        float(np.percentile(np.asarray(values, dtype=np.float64), q))
        if len(values)
        else float("nan")
    )


def spread(values: Sequence[float]) -> float:
    """p90 / p10 (inf when p10 is 0)."""
    p10 = _pct(values, 10)
    return float(_pct(values, 90) / p10) if p10 > 0 else float("inf")


def answer_number(text: str) -> str | None:
    """The number after "The answer is" in ``text`` (thousands commas dropped), if any."""
    m = _ANSWER_NUM.search(text)
    return None if m is None else m.group(1).replace(",", "")


def math_correct(text: str, answer: Any) -> bool:
    return answer_number(text) == str(answer)


def mcq_correct(text: str, letter: Any) -> bool:
    m = _ANSWER_LETTER.search(text)
    return m is not None and m.group(1) == str(letter)


def retrieval_correct(text: str, values: Sequence[Any]) -> bool:
    """All needle values present, in the order asked."""
    pos = 0
    for v in values:
        i = text.find(str(v), pos)
        if i < 0:
            return False
        pos = i + len(str(v))
    return True


def summarize(stats: Sequence[RequestStats], block_size: int) -> dict[str, Any]:
    """All figures for one threshold."""
    if not stats:
        raise ConfigError("no traced requests to summarize; trace at least one request (--n)")
    rounds = [s.total_rounds for s in stats]
    overall = {
        "requests": len(stats),
        "rounds_p10": _pct(rounds, 10),
        "rounds_p50": _pct(rounds, 50),
        "rounds_p90": _pct(rounds, 90),
        "rounds_max": int(max(rounds)),
        "rounds_mean": float(np.mean(rounds)),
        "rounds_p90_over_p10": spread(rounds),
        "budget_hit_share": float(np.mean([s.hit_budget for s in stats])),
    }
    by_cat: dict[str, list[RequestStats]] = defaultdict(list)
    for s in stats:
        by_cat[s.category].append(s)
    per_category = {}
    for c in sorted(
        by_cat, key=lambda c: (CATEGORY_ORDER.index(c) if c in CATEGORY_ORDER else 99, c)
    ):
        g = by_cat[c]
        rpb = [s.rounds_per_block for s in g]
        decoded = sum(s.output_blocks * block_size for s in g)
        per_category[c] = {
            "requests": len(g),
            "median_rounds": _pct([s.total_rounds for s in g], 50),
            "median_rounds_per_block": _pct(rpb, 50),
            "rounds_per_block_p10": _pct(rpb, 10),
            "rounds_per_block_p90": _pct(rpb, 90),
            "rounds_per_block_p90_over_p10": spread(rpb),
            "median_output_tokens": _pct([s.output_tokens for s in g], 50),
            "median_output_blocks": _pct([s.output_blocks for s in g], 50),
            "budget_hit_share": float(np.mean([s.hit_budget for s in g])),
            # every position of a decoded block is committed (EOS padding included)
            "tokens_committed_per_round": decoded / max(1, sum(s.total_rounds for s in g)),
            "content_tokens_per_round": sum(s.output_tokens for s in g)
            / max(1, sum(s.total_rounds for s in g)),
        }
    return {
        "overall": overall,
        "per_category": per_category,
        "accuracy": accuracy(by_cat),
        "difficulty": difficulty(by_cat),
    }


def accuracy(by_cat: dict[str, list[RequestStats]]) -> dict[str, Any]:
    """Exact match next to chance. Math chance = always answering the most frequent answer."""
    out: dict[str, Any] = {}
    if by_cat.get("math"):
        g = by_cat["math"]
        answers = [str(s.meta.get("answer")) for s in g]
        top = max(answers.count(a) for a in set(answers))
        out["math"] = {
            "requests": len(g),
            "exact_match": float(
                np.mean([math_correct(s.output_text, s.meta.get("answer")) for s in g])
            ),
            "chance": top / len(g),
            "chance_rule": "most frequent answer",
        }
        by_digits: dict[int, list[bool]] = defaultdict(list)
        for s in g:
            by_digits[int(s.meta.get("digits", 0))].append(
                math_correct(s.output_text, s.meta.get("answer"))
            )
        out["math"]["exact_match_by_digits"] = {
            str(k): float(np.mean(v)) for k, v in sorted(by_digits.items())
        }
    if by_cat.get("mcq"):
        g = by_cat["mcq"]
        out["mcq"] = {
            "requests": len(g),
            "exact_match": float(
                np.mean([mcq_correct(s.output_text, s.meta.get("answer")) for s in g])
            ),
            "chance": float(np.mean([1.0 / int(s.meta.get("n_options", 4)) for s in g])),
            "chance_rule": "1 / number of options",
        }
        by_kind: dict[str, list[bool]] = defaultdict(list)
        for s in g:
            by_kind[str(s.meta.get("kind"))].append(
                mcq_correct(s.output_text, s.meta.get("answer"))
            )
        out["mcq"]["exact_match_by_kind"] = {
            k: float(np.mean(v)) for k, v in sorted(by_kind.items())
        }
    if by_cat.get("long_context"):
        g = by_cat["long_context"]
        out["long_context"] = {
            "requests": len(g),
            "exact_match": float(
                np.mean([retrieval_correct(s.output_text, s.meta.get("answer") or []) for s in g])
            ),
            "chance": 0.0,
            "chance_rule": "4-digit values",
        }
    return out


def difficulty(by_cat: dict[str, list[RequestStats]]) -> dict[str, Any]:
    """Median rounds per output block by the generator's difficulty knob, inside a category."""
    knobs = {"math": "digits", "mcq": "kind", "long_context": "n_needles"}
    out: dict[str, Any] = {}
    for c, knob in knobs.items():
        groups: dict[str, list[float]] = defaultdict(list)
        for s in by_cat.get(c, []):
            groups[str(s.meta.get(knob))].append(s.rounds_per_block)
        if groups:
            out[c] = {
                "knob": knob,
                "median_rounds_per_block": {k: _pct(v, 50) for k, v in sorted(groups.items())},
                "requests": {k: len(v) for k, v in sorted(groups.items())},
            }
    return out


# ---------------------------------------------------------------- tracing


def trace_eval(
    model: str,
    records: Sequence[Any],
    threshold: float,
    out_dir: Path,
    batch_size: int,
    overwrite: bool,
    threads: int | None = None,
) -> Path:
    """Trace ``records`` at ``threshold`` into ``out_dir`` (resumed if it holds a partial run)."""
    import torch
    from dwise_predict.tracing.adapters import load_adapter

    if threads is not None:
        torch.set_num_threads(threads)
    from dwise_predict.tracing.runner import trace_workload

    from dwise_predict.trace_writer import existing_shards

    if overwrite and out_dir.exists():
        shutil.rmtree(out_dir)
    adapter = load_adapter(model)
    # short prompts first: a long-context prefill then never slows a batch of short requests
    ordered = sorted(records, key=lambda r: (len(r.prompt), r.id))
    t0 = time.monotonic()
    summary = trace_workload(
        adapter,
        ordered,
        out_dir,
        batch_size=batch_size,
        threshold=threshold,
        max_new_tokens=BUDGET,
        resume=bool(existing_shards(out_dir)),
    )
    print(
        f"traced {summary.traced} (skipped {summary.skipped}) "
        f"at tau={threshold} in {time.monotonic() - t0:.0f}s",
        file=sys.stderr,
    )
    return out_dir


def load_stats(
    trace_dir: Path, records_by_id: dict[str, Any]
) -> tuple[list[RequestStats], dict[str, Any]]:
    from dwise_predict.traces import read_trace_fingerprint, read_traces

    cols = [
        "request_id",
        "category",
        "total_rounds",
        "output_blocks",
        "output_tokens",
        "hit_budget",
        "output_text",
        "block_size",
    ]
    rows = read_traces(trace_dir, columns=cols, validate=False).to_pylist()
    stats = [
        RequestStats(
            r["request_id"],
            r["category"],
            int(r["total_rounds"]),
            int(r["output_blocks"]),
            int(r["output_tokens"]),
            bool(r["hit_budget"]),
            r["output_text"] or "",
            dict(records_by_id[r["request_id"]].meta) if r["request_id"] in records_by_id else {},
        )
        for r in rows
    ]
    fp = read_trace_fingerprint(trace_dir)
    return stats, fp.to_dict()


# ---------------------------------------------------------------- plots and markdown


def _stage_order(log: Path) -> tuple[int, str]:
    """``train_log_stage10.csv`` after ``train_log_stage9.csv``: stages in training order."""
    digits = re.findall(r"\d+", log.stem)
    return (int(digits[-1]) if digits else -1, log.stem)


def plot_training_loss(weights_dir: Path, img_dir: Path) -> str | None:
    """The loss curves of every ``train_log*.csv`` in the checkpoint folder, stages laid end to
    end and numbered on the plot (a legend of twenty stages would hide the curves)."""
    logs = sorted(weights_dir.glob("train_log*.csv"), key=_stage_order)
    if not logs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.6))
    offset, top = 0, 0.0
    spans = []
    for k, log in enumerate(logs):
        rows = np.genfromtxt(log, delimiter=",", names=True)
        steps, loss = np.atleast_1d(rows["step"]), np.atleast_1d(rows["loss"])
        smooth = np.convolve(loss, np.ones(10) / 10, mode="valid") if len(loss) >= 10 else loss
        color = "C0" if k % 2 == 0 else "C1"
        ax.plot(steps + offset, loss, color=color, alpha=0.2, lw=0.6)
        ax.plot(steps[len(steps) - len(smooth) :] + offset, smooth, color=color, lw=1.2)
        spans.append((offset, offset + int(steps.max()), _stage_order(log)[0]))
        top = max(top, float(np.percentile(loss, 99)))
        offset += int(steps.max())
    for lo, hi, stage in spans:
        ax.axvline(lo, color="0.8", lw=0.5, zorder=0)
        ax.text((lo + hi) / 2, top * 1.02, str(stage), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, top * 1.12)
    ax.set_xlabel("step (stages concatenated; the number above each span is its stage on the card)")
    ax.set_ylabel("masked-token CE (per batch)")
    ax.set_title(
        "tiny-bd training loss, 10-batch mean (batches are length-bucketed, so tasks alternate)"
    )
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    save_figure(fig, img_dir / "tiny-bd-train-loss.png", dpi=110, bbox_inches=None)
    plt.close(fig)
    return "tiny-bd-train-loss.png"


def plot(
    per_tau: dict[str, list[RequestStats]], img_dir: Path, weights_dir: Path | None = None
) -> list[str]:
    """Histogram of total rounds (DWISE Fig. 2 style), rounds per block by category, and the
    training loss curve when the checkpoint folder carries its ``train_log*.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img_dir.mkdir(parents=True, exist_ok=True)
    names = []
    fig, ax = plt.subplots(figsize=(7, 3.6))
    top = max(max(s.total_rounds for s in v) for v in per_tau.values())
    bins = np.unique(np.round(np.logspace(0, np.log10(top + 1), 40)).astype(int)).tolist()
    for tau, stats in per_tau.items():
        ax.hist([s.total_rounds for s in stats], bins=bins, alpha=0.55, label=f"τ = {tau}")
    ax.set_xscale("log")
    ax.set_xlabel("total denoising rounds per request (log)")
    ax.set_ylabel("requests")
    ax.set_title(
        f"tiny-bd, {len(next(iter(per_tau.values())))} eval requests, budget {BUDGET} tokens"
    )
    ax.legend()
    fig.tight_layout()
    save_figure(fig, img_dir / "tiny-bd-rounds-hist.png", dpi=110, bbox_inches=None)
    names.append("tiny-bd-rounds-hist.png")
    plt.close(fig)

    taus = list(per_tau)
    cats = [c for c in CATEGORY_ORDER if any(s.category == c for s in per_tau[taus[0]])]
    fig, ax = plt.subplots(figsize=(8, 3.8))
    width = 0.8 / len(taus)
    for k, tau in enumerate(taus):
        data = [[s.rounds_per_block for s in per_tau[tau] if s.category == c] for c in cats]
        pos = np.arange(len(cats)) + (k - (len(taus) - 1) / 2) * width
        bp = ax.boxplot(
            data, positions=pos, widths=width * 0.9, patch_artist=True, showfliers=False
        )
        for patch in bp["boxes"]:
            patch.set_facecolor(f"C{k}")
            patch.set_alpha(0.6)
        ax.plot([], [], color=f"C{k}", lw=6, alpha=0.6, label=f"τ = {tau}")
    ax.set_xticks(np.arange(len(cats)), cats)
    ax.set_ylabel("rounds per output block")
    ax.set_title("rounds per output block by category (box: p25-p75, whiskers 1.5 IQR)")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, img_dir / "tiny-bd-rounds-per-block.png", dpi=110, bbox_inches=None)
    names.append("tiny-bd-rounds-per-block.png")
    plt.close(fig)
    if weights_dir is not None and (name := plot_training_loss(weights_dir, img_dir)):
        names.append(name)
    return names


def _f(x: float, nd: int = 1) -> str:
    if x == float("inf"):
        return "inf"
    return f"{x:.{nd}f}"


def figures_markdown(report: dict[str, Any], images: Sequence[str]) -> str:
    lines = [
        FIGURES_BEGIN,
        "",
        f"Measured by `{report['command']}` on {report['requests']} eval requests "
        f"(model revision `{report['model']['revision']}`, budget {report['budget']} tokens, "
        f"block size {report['block_size']}).",
        "",
    ]
    taus = list(report["thresholds"])
    lines += [
        "### Total denoising rounds per request",
        "",
        "| τ | p10 | p50 | p90 | max | p90/p10 (goal ≥ 8) | budget-hit share (goal < 50%) |",
        "|---|---|---|---|---|---|---|",
    ]
    for tau in taus:
        o = report["thresholds"][tau]["overall"]
        lines.append(
            f"| {tau} | {_f(o['rounds_p10'])} | {_f(o['rounds_p50'])} | {_f(o['rounds_p90'])} | "
            f"{o['rounds_max']} | {_f(o['rounds_p90_over_p10'])} "
            f"| {100 * o['budget_hit_share']:.1f}% |"
        )
    for tau in taus:
        t = report["thresholds"][tau]
        lines += [
            "",
            f"### Per category, τ = {tau}",
            "",
            "| category | requests | median rounds | median rounds / block | rounds/block p10-p90 "
            "(p90/p10) | median output tokens | budget hit | tokens committed / round |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c, v in t["per_category"].items():
            lines.append(
                f"| {c} | {v['requests']} | {_f(v['median_rounds'])} | "
                f"{_f(v['median_rounds_per_block'], 2)} | "
                f"{_f(v['rounds_per_block_p10'], 1)}-{_f(v['rounds_per_block_p90'], 1)} "
                f"({_f(v['rounds_per_block_p90_over_p10'], 2)}) | "
                f"{_f(v['median_output_tokens'], 0)} | {100 * v['budget_hit_share']:.1f}% | "
                f"{_f(v['tokens_committed_per_round'], 2)} |"
            )
        acc = t["accuracy"]
        lines += ["", "| task | exact match | chance | chance rule |", "|---|---|---|---|"]
        for c, a in acc.items():
            lines.append(
                f"| {c} | {100 * a['exact_match']:.1f}% | "
                f"{100 * a['chance']:.1f}% | {a['chance_rule']} |"
            )
        if "math" in acc:
            lines.append("")
            lines.append(
                "math exact match by digits: "
                + ", ".join(
                    f"{k}: {100 * v:.0f}%" for k, v in acc["math"]["exact_match_by_digits"].items()
                )
            )
        if "mcq" in acc:
            lines.append("")
            lines.append(
                "mcq exact match by kind: "
                + ", ".join(
                    f"{k}: {100 * v:.0f}%" for k, v in acc["mcq"]["exact_match_by_kind"].items()
                )
            )
        for c, d in t["difficulty"].items():
            lines.append("")
            lines.append(
                f"{c}: median rounds per output block by {d['knob']}: "
                + ", ".join(
                    f"{k}: {_f(v, 2)} (n={d['requests'][k]})"
                    for k, v in d["median_rounds_per_block"].items()
                )
            )
    lines += [""] + [f"![{name}](img/{name})" for name in images] + ["", FIGURES_END]
    return "\n".join(lines)


def write_markdown(md_path: Path, block: str) -> None:
    """Replace the figures block of ``md_path`` (or append it), atomically."""
    text = (
        md_path.read_text(encoding="utf-8")
        if md_path.exists()
        else "# tiny-bd, the reference model\n\n"
    )
    if FIGURES_BEGIN in text and FIGURES_END in text:
        head, rest = text.split(FIGURES_BEGIN, 1)
        tail = rest.split(FIGURES_END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n## Figures\n\n" + block + "\n"
    _write_atomic(md_path, text)


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=Path("docs"),
        help="docs folder (reference-model.md/.json, img/)",
    )
    ap.add_argument(
        "--n",
        type=int,
        default=REPORT_REQUESTS,
        help="eval requests to trace (the first N of the eval split)",
    )
    ap.add_argument("--model", default="tiny-bd", help="'tiny-bd' or a checkpoint folder")
    ap.add_argument("--thresholds", default=",".join(map(str, DEFAULT_THRESHOLDS)))
    ap.add_argument(
        "--traces", type=Path, default=Path("runs/tiny-bd-eval"), help="where the traces are kept"
    )
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="thresholds traced in parallel processes (1 thread each when > 1)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads per tracing process (default: 1 when thresholds run in parallel, "
        "else torch's choice)",
    )
    ap.add_argument("--overwrite", action="store_true", help="re-trace even if traces are there")
    ap.add_argument(
        "--no-card", action="store_true", help="do not add the figures to the shipped model card"
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.n < 1:
        raise SystemExit("--n must be >= 1")
    thresholds = [float(t) for t in args.thresholds.split(",") if t]

    from dwise_predict.tracing.workload import build_workload

    from .data import DataConfig

    dc = DataConfig()
    splits = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed)
    records = splits.eval[: args.n]
    by_id = {r.id: r for r in records}
    per_tau: dict[str, list[RequestStats]] = {}
    thresholds_out: dict[str, Any] = {}
    fingerprint: dict[str, Any] = {}
    block_size = 32
    dirs = {tau: args.traces / f"tau{tau}" for tau in thresholds}
    if args.jobs > 1 and len(thresholds) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(
            min(args.jobs, len(thresholds)), mp_context=multiprocessing.get_context("spawn")
        ) as ex:
            futures = [
                ex.submit(
                    trace_eval,
                    args.model,
                    records,
                    tau,
                    dirs[tau],
                    args.batch_size,
                    args.overwrite,
                    args.threads or 1,
                )
                for tau in thresholds
            ]
            for f in futures:
                f.result()
    else:
        for tau in thresholds:
            trace_eval(
                args.model, records, tau, dirs[tau], args.batch_size, args.overwrite, args.threads
            )
    for tau in thresholds:
        tdir = dirs[tau]
        stats, fingerprint = load_stats(tdir, by_id)
        stats = [s for s in stats if s.request_id in by_id]
        block_size = int(fingerprint.get("block_size", 32))
        per_tau[str(tau)] = stats
        thresholds_out[str(tau)] = summarize(stats, block_size)
    command = "python -m dwise_predict.zoo.tiny_bd.recipe.report " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    from ..io import from_pretrained

    tb = from_pretrained(args.model)
    report = {
        "command": command.strip(),
        "model": {
            "name": args.model,
            "revision": tb.revision,
            "params": sum(p.numel() for p in tb.model.parameters()),
            "config": tb.config.to_dict(),
        },
        "requests": len(records),
        "budget": BUDGET,
        "block_size": block_size,
        "workload": {
            "train_size": dc.workload_train_size,
            "eval_size": dc.workload_eval_size,
            "seed": dc.workload_seed,
            "split": "eval",
            "first_n": args.n,
        },
        "thresholds": thresholds_out,
    }
    first = thresholds_out[str(thresholds[0])]
    report["goals"] = {
        "rounds_p90_over_p10_ge_8": first["overall"]["rounds_p90_over_p10"] >= 8,
        "budget_hit_share_lt_half": first["overall"]["budget_hit_share"] < 0.5,
        "chat_tokens_per_round_gt_1": first["per_category"]
        .get("chat", {})
        .get("tokens_committed_per_round", 0)
        > 1,
        "math_above_chance": first["accuracy"].get("math", {}).get("exact_match", 0)
        > 2 * first["accuracy"].get("math", {}).get("chance", 1),
        "mcq_above_chance": first["accuracy"].get("mcq", {}).get("exact_match", 0)
        > 1.5 * first["accuracy"].get("mcq", {}).get("chance", 1),
    }
    out: Path = args.out
    _write_atomic(
        out / "reference-model.json", json.dumps(report, indent=2, sort_keys=False) + "\n"
    )
    images = plot(per_tau, out / "img", tb.path)
    write_markdown(out / "reference-model.md", figures_markdown(report, images))
    if args.model == "tiny-bd" and not args.no_card:
        _update_card(tb.path, report)
    print(
        json.dumps(
            {
                "goals": report["goals"],
                "overall": {k: v["overall"] for k, v in thresholds_out.items()},
            },
            indent=2,
        )
    )
    return 0


def _update_card(weights_dir: Path | None, report: dict[str, Any]) -> None:
    """Put the headline figures into the shipped model card (README.md)."""
    if weights_dir is None or not (weights_dir / "README.md").exists():
        return
    card = (weights_dir / "README.md").read_text(encoding="utf-8")
    card = card.split(MEASURED_HEADING, 1)[0].rstrip("\n") + "\n\n"
    tau0 = next(iter(report["thresholds"]))
    t = report["thresholds"][tau0]
    headline = {
        "command": report["command"],
        "threshold": tau0,
        "requests": report["requests"],
        "overall": t["overall"],
        "accuracy": {
            k: {"exact_match": v["exact_match"], "chance": v["chance"]}
            for k, v in t["accuracy"].items()
        },
        "median_rounds_per_block": {
            c: v["median_rounds_per_block"] for c, v in t["per_category"].items()
        },
    }
    card += MEASURED_HEADING + "\n\n```json\n" + json.dumps(headline, indent=2) + "\n```\n"
    _write_atomic(weights_dir / "README.md", card)


if __name__ == "__main__":
    raise SystemExit(main())
