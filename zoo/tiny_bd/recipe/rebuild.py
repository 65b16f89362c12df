"""Rebuild every figure the docs quote about tiny-bd from its shipped weights, step by step.

    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild            # all steps, ~11 min on 2 cores
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --dry-run  # print the commands only
    # then replace zoo/bundles/tiny-bd with the rebuilt bundle (a zoo release, docs/zoo.md):
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --install-bundle

Why: shipping new weights (a new training stage) changes every tiny-bd figure in the docs: the
report, the zoo bundle trained on the weights' own traces, its ONNX exports and evaluation, the
cost profile and the simulator. Those are nine commands whose outputs feed one another; run by
hand, one forgotten, or run on the old weights' traces, gives pages that mix two models. This
runs them in order, each exactly the command ``docs/predictors.md`` prints, and records every
finished step with the weights' revision in ``RUNS/rebuild/``. A rerun after an interruption
resumes at the first unfinished step; new weights start over. A step without a record has its
outputs removed before it runs, so nothing half-written from an earlier try is reused.

Doc prose is not rewritten: the report updates its own figures section, ``eval --record`` the
bundle's card, and the printed tables are what the pages quote.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dwise_predict.atomic import staged_folder, write_json
from dwise_predict.errors import TrainingError

#: the programs a step can run: the project's CLI and the reference model's report
PROGRAMS = ("dwise-predict", "report")


@dataclass(frozen=True)
class Step:
    """One command of the rebuild and the paths it writes (removed before it reruns)."""

    name: str
    program: str
    argv: tuple[str, ...]
    outputs: tuple[Path, ...]

    def command(self) -> str:
        head = (
            "python -m dwise_predict.zoo.tiny_bd.recipe.report"
            if self.program == "report"
            else "dwise-predict"
        )
        return " ".join([head, shlex.join(self.argv)])


def plan(runs: Path, docs: Path, n_eval: int = 1000, n_train: int = 600) -> list[Step]:
    """The rebuild's steps, in order (the commands of docs/predictors.md and docs/simulator.md).

    ``export`` writes the ONNX and INT8 files the packaged bundle ships next to the native ones.
    """
    r = str(runs)
    eval_traces = f"{r}/tiny-bd-eval/tau0.95"
    bundle = f"{r}/bundle-tiny-bd"
    return [
        Step("workload", "dwise-predict", ("workload", "--out", f"{r}/workload"),
             (runs / "workload",)),
        Step(
            "report",
            "report",
            ("--out", str(docs), "--n", str(n_eval), "--traces", f"{r}/tiny-bd-eval",
             "--overwrite"),
            (runs / "tiny-bd-eval",),
        ),
        Step(
            "traces-train",
            "dwise-predict",
            ("trace", "--model", "tiny-bd", "--workload", f"{r}/workload", "--split", "train",
             "--limit", str(n_train), "--batch-size", "16", "--out", f"{r}/traces-train"),
            (runs / "traces-train",),
        ),
        Step(
            "profile",
            "dwise-predict",
            ("profile", "--model", "tiny-bd", "--workload", f"{r}/workload", "--limit", "160",
             "--threads", "1", "--clock", "cpu", "--out", f"{r}/profile"),
            (runs / "profile",),
        ),
        Step(
            "bundle",
            "dwise-predict",
            ("train", "--traces", f"{r}/traces-train", "--out", bundle, "--seed", "0",
             "--cost-profile", f"{r}/profile/cost_profile.json", "--dws-int8-only"),
            (runs / "bundle-tiny-bd",),
        ),
        Step(
            "export",
            "dwise-predict",
            ("export", bundle, "--int8"),
            (),  # in place, atomically: the bundle step's output is the one to remove
        ),
        Step(
            "eval",
            "dwise-predict",
            ("eval", "--bundle", bundle, "--traces", eval_traces, "--out", f"{r}/eval/metrics.json",
             "--record"),
            (runs / "eval",),
        ),
        Step(
            "eval-holdout-chat",
            "dwise-predict",
            ("eval", "--bundle", bundle, "--traces", eval_traces,
             "--out", f"{r}/eval-holdout-chat/metrics.json", "--holdout-category", "chat",
             "--train-traces", f"{r}/traces-train"),
            (runs / "eval-holdout-chat",),
        ),
        Step(
            "simulate",
            "dwise-predict",
            ("simulate", "--traces", eval_traces, "--bundle", bundle,
             "--policies", "fcfs,mlfq,sjf,dwise,oracle", "--arrival", "burst", "--slots", "32",
             "--out", f"{r}/sim-tiny-bd"),
            (runs / "sim-tiny-bd",),
        ),
    ]  # fmt: skip


def run_program(program: str, argv: Sequence[str]) -> int:
    """Run one step in this process: the CLI and the report are library calls with ``main``.

    A bad argument makes argparse exit; that comes back as the step's exit code, not as an exit
    of the whole rebuild.
    """
    if program == "report":
        from .report import main as entry
    elif program == "dwise-predict":
        from dwise_predict.cli import main as entry
    else:
        raise TrainingError(f"unknown program {program!r}; one of {', '.join(PROGRAMS)}")
    try:
        return entry(list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


def _record_path(runs: Path, step: Step) -> Path:
    return runs / "rebuild" / f"{step.name}.json"


def is_done(runs: Path, step: Step, revision: str) -> bool:
    """Whether ``step`` finished for these weights with this very command."""
    path = _record_path(runs, step)
    if not path.exists():
        return False
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return bool(record.get("revision") == revision and record.get("command") == step.command())


def rebuild(
    steps: Sequence[Step],
    runs: Path,
    revision: str,
    runner: Callable[[str, Sequence[str]], int] = run_program,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Run every step not yet done for ``revision``; return the names of the steps run.

    A step that fails (non-zero exit or an exception) stops the rebuild with no record written,
    so the next call starts there. Once a step reruns, every later step reruns too: their
    inputs changed.
    """
    ran: list[str] = []
    for i, step in enumerate(steps, 1):
        if not ran and is_done(runs, step, revision):
            log(f"[{i}/{len(steps)}] {step.name}: done for revision {revision}, skipped")
            continue
        for out in step.outputs:
            if out.is_dir():
                shutil.rmtree(out)
            elif out.exists():
                out.unlink()
        _record_path(runs, step).unlink(missing_ok=True)
        _record_path(runs, step).parent.mkdir(parents=True, exist_ok=True)
        log(f"[{i}/{len(steps)}] {step.name}: {step.command()}")
        start = time.monotonic()
        rc = runner(step.program, step.argv)
        seconds = time.monotonic() - start
        if rc:
            raise TrainingError(
                f"rebuild step {step.name!r} failed (exit {rc}) after {seconds:.0f} s; fix the "
                "cause and rerun: finished steps are skipped"
            )
        write_json(
            _record_path(runs, step),
            {"revision": revision, "command": step.command(), "seconds": round(seconds, 1)},
        )
        log(f"[{i}/{len(steps)}] {step.name}: finished in {seconds:.0f} s")
        ran.append(step.name)
    return ran


def install_bundle(bundle: Path, dest: Path) -> None:
    """Replace the zoo's bundle folder ``dest`` with ``bundle``; a failed copy leaves ``dest``.

    The copy is staged beside ``dest`` and swapped in whole (:func:`staged_folder`), so the
    packaged bundle is never a mix of two trainings.
    """
    if not (bundle / "manifest.json").exists():
        raise TrainingError(f"{bundle} is not a bundle (no manifest.json); run the rebuild first")
    with staged_folder(dest) as staged:
        shutil.copytree(bundle, staged, dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.rebuild",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--runs", type=Path, default=Path("runs"), help="work folder (default: runs)")
    ap.add_argument(
        "--docs", type=Path, default=Path("docs"), help="where the report writes (default: docs)"
    )
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument(
        "--install-bundle",
        action="store_true",
        help="afterwards replace the packaged zoo bundle with RUNS/bundle-tiny-bd",
    )
    args = ap.parse_args(argv)

    from ..io import WEIGHTS_DIR, weights_revision

    steps = plan(args.runs, args.docs)
    if args.dry_run:
        for step in steps:
            print(step.command())
        return 0
    revision = weights_revision(WEIGHTS_DIR / "model.safetensors")
    try:
        rebuild(steps, args.runs, revision)
        if args.install_bundle:
            dest = Path(__file__).resolve().parents[2] / "bundles" / "tiny-bd"
            install_bundle(args.runs / "bundle-tiny-bd", dest)
            print(f"installed {args.runs / 'bundle-tiny-bd'} as {dest}")
    except TrainingError as e:
        print(f"rebuild: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
