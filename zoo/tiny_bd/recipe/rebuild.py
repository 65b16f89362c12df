"""Rebuild every figure the docs quote about tiny-bd from its shipped weights, step by step.

    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild            # all steps, ~1 h on 2 busy cores
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --dry-run  # print the commands only
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --step report &  # independent steps
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --step traces-train &  # side by side,
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --step profile; wait  # then the rest:
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild
    # then replace zoo/bundles/tiny-bd with the rebuilt bundle (a zoo release, docs/zoo.md):
    python -m dwise_predict.zoo.tiny_bd.recipe.rebuild --install-bundle

Why: shipping new weights (a new training stage) changes every tiny-bd figure in the docs: the
report, the zoo bundle trained on the weights' own traces, its ONNX exports and evaluation, the
cost profile and the simulator. Those are nine commands whose outputs feed one another; run by
hand, one forgotten, or run on the old weights' traces, gives pages that mix two models. This
runs them in order, each exactly the command ``docs/predictors.md`` prints, and records every
finished step with the weights' revision in ``RUNS/rebuild/``. A rerun after an interruption
resumes at the first unfinished step; new weights start over. A step without a record has its
outputs removed before it runs, so nothing half-written from an earlier try is reused, except
the tracing steps' shards: the tracer writes whole shards and skips the requests they hold, so
an interrupted tracing step of the same command and revision continues where it stopped.

Doc prose is not rewritten: the report updates its own figures section, ``eval --record`` the
bundle's card, and the printed tables are what the pages quote.

The bundle is trained on the whole train split (``--train-requests N`` takes its first N) and its
cost profile on 200 train-split requests with the speed probe (docs/cost-model.md). A release
that keeps the weights can pass ``--eval-traces-only``: the report's figures depend on the
weights alone, so its step then traces the eval requests at τ = 0.95 (what the later steps read)
into ``RUNS/report`` and leaves ``docs/reference-model.*`` and the weights' card as they are.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from dwise_predict.atomic import staged_folder, write_json
from dwise_predict.errors import TrainingError

#: the programs a step can run: the project's CLI and the reference model's report
PROGRAMS = ("dwise-predict", "report")


@dataclass(frozen=True)
class Step:
    """One command of the rebuild and the paths it writes (removed before it reruns).

    ``needs`` names the earlier steps whose outputs it reads (``--step`` reruns drop the
    records of the steps that need it). ``resume_argv``, for a tracing step, is the command
    that continues the outputs an
    interrupted run of ``argv`` left (the tracer skips the requests already written): a rerun
    for the same revision and command keeps them and runs it instead of starting over.
    """

    name: str
    program: str
    argv: tuple[str, ...]
    outputs: tuple[Path, ...]
    resume_argv: tuple[str, ...] | None = None
    needs: tuple[str, ...] = ()  # the steps whose outputs it reads

    def command(self) -> str:
        head = (
            "python -m dwise_predict.zoo.tiny_bd.recipe.report"
            if self.program == "report"
            else "dwise-predict"
        )
        return " ".join([head, shlex.join(self.argv)])


#: requests the cost profile serves one at a time (docs/cost-model.md's figures use 200)
PROFILE_REQUESTS = 200


def plan(
    runs: Path,
    docs: Path,
    n_eval: int = 1000,
    n_train: int | None = None,
    eval_traces_only: bool = False,
) -> list[Step]:
    """The rebuild's steps, in order (the commands of docs/predictors.md and docs/simulator.md).

    ``n_train`` None trains on the whole train split, else on its first ``n_train`` requests.
    ``eval_traces_only`` writes the report into ``RUNS/report`` at τ = 0.95 alone and leaves the
    docs and the weights' card untouched (a release that keeps the weights).
    ``export`` writes the ONNX and INT8 files the packaged bundle ships next to the native ones.
    """
    r = str(runs)
    eval_traces = f"{r}/tiny-bd-eval/tau0.95"
    bundle = f"{r}/bundle-tiny-bd"
    report_argv: tuple[str, ...] = ("--out", str(docs))
    report_outputs: tuple[Path, ...] = (runs / "tiny-bd-eval",)
    if eval_traces_only:
        # one torch thread, as the default report's two parallel thresholds trace
        report_argv = ("--out", f"{r}/report", "--thresholds", "0.95", "--threads", "1",
                       "--no-card")  # fmt: skip
        report_outputs += (runs / "report",)
    report_argv += ("--n", str(n_eval), "--traces", f"{r}/tiny-bd-eval")
    limit = () if n_train is None else ("--limit", str(n_train))
    # one torch thread: the fastest on a busy machine (trace --help), and no thread-count
    # dependence in the traces
    trace_train = ("trace", "--model", "tiny-bd", "--workload", f"{r}/workload", "--split",
                   "train", *limit, "--batch-size", "16", "--threads", "1", "--out",
                   f"{r}/traces-train")  # fmt: skip
    steps = [
        Step("workload", "dwise-predict", ("workload", "--out", f"{r}/workload"),
             (runs / "workload",)),
        Step("report", "report", (*report_argv, "--overwrite"), report_outputs,
             resume_argv=report_argv),
        Step("traces-train", "dwise-predict", trace_train, (runs / "traces-train",),
             resume_argv=(*trace_train, "--resume")),
        Step(
            "profile",
            "dwise-predict",
            ("profile", "--model", "tiny-bd", "--workload", f"{r}/workload", "--split", "train",
             "--limit", str(PROFILE_REQUESTS), "--threads", "1", "--clock", "cpu",
             "--speed-probe", "3", "--out", f"{r}/profile"),
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
    return [replace(step, needs=NEEDS[step.name]) for step in steps]


#: what each step reads (the report builds its own workload; eval and simulate read the
#: report's eval traces)
NEEDS: dict[str, tuple[str, ...]] = {
    "workload": (),
    "report": (),
    "traces-train": ("workload",),
    "profile": ("workload",),
    "bundle": ("traces-train", "profile"),
    "export": ("bundle",),
    "eval": ("export", "report"),
    "eval-holdout-chat": ("export", "report", "traces-train"),
    "simulate": ("export", "report"),
}


def dependents(steps: Sequence[Step], names: Collection[str]) -> list[Step]:
    """The steps that read, directly or through others, what the steps ``names`` write."""
    changed, out = set(names), []
    for step in steps:
        if step.name not in names and changed.intersection(step.needs):
            changed.add(step.name)
            out.append(step)
    return out


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


def _started_path(runs: Path, step: Step) -> Path:
    return runs / "rebuild" / f"{step.name}.started.json"


def _matches(path: Path, step: Step, revision: str) -> bool:
    if not path.exists():
        return False
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return bool(record.get("revision") == revision and record.get("command") == step.command())


def can_resume(runs: Path, step: Step, revision: str) -> bool:
    """Whether ``step`` is resumable and its outputs are an interrupted run of this very command
    for these weights (recorded when it started)."""
    return (
        step.resume_argv is not None
        and _matches(_started_path(runs, step), step, revision)
        and any(out.exists() for out in step.outputs)
    )


def is_done(runs: Path, step: Step, revision: str) -> bool:
    """Whether ``step`` finished for these weights with this very command."""
    return _matches(_record_path(runs, step), step, revision)


def rebuild(
    steps: Sequence[Step],
    runs: Path,
    revision: str,
    runner: Callable[[str, Sequence[str]], int] = run_program,
    log: Callable[[str], None] = print,
    only: Collection[str] = (),
) -> list[str]:
    """Run every step not yet done for ``revision``; return the names of the steps run.

    A step that fails (non-zero exit or an exception) stops the rebuild with no record written,
    so the next call starts there: from scratch, or for a tracing step (``resume_argv``) where
    its interrupted run stopped. Once a step reruns, every later step reruns too: their
    inputs changed.

    ``only`` runs just the named steps, done or not, so that independent steps (``report``,
    ``traces-train``, ``profile``) can run side by side in separate processes; when it starts,
    the records of the steps that read their outputs (``needs``, transitively) are removed, so
    the next plain rebuild reruns those.
    """
    unknown = sorted(set(only) - {s.name for s in steps})
    if unknown:
        raise TrainingError(
            f"unknown step(s) {', '.join(unknown)}; one of {', '.join(s.name for s in steps)}"
        )
    for later in dependents(steps, only):
        _record_path(runs, later).unlink(missing_ok=True)
    ran: list[str] = []
    for i, step in enumerate(steps, 1):
        if only and step.name not in only:
            continue
        if not only and not ran and is_done(runs, step, revision):
            log(f"[{i}/{len(steps)}] {step.name}: done for revision {revision}, skipped")
            continue
        _record_path(runs, step).unlink(missing_ok=True)
        _record_path(runs, step).parent.mkdir(parents=True, exist_ok=True)
        argv = step.argv
        if step.resume_argv is not None and can_resume(runs, step, revision):
            argv = step.resume_argv
            log(f"[{i}/{len(steps)}] {step.name}: resuming its interrupted run")
        else:
            for out in step.outputs:
                if out.is_dir():
                    shutil.rmtree(out)
                elif out.exists():
                    out.unlink()
            write_json(_started_path(runs, step), {"revision": revision, "command": step.command()})
        log(f"[{i}/{len(steps)}] {step.name}: {step.command()}")
        start = time.monotonic()
        rc = runner(step.program, argv)
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
        _started_path(runs, step).unlink(missing_ok=True)
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
        "--train-requests",
        type=int,
        default=None,
        metavar="N",
        help="train the bundle on the first N train-split requests (default: all of them)",
    )
    ap.add_argument(
        "--eval-traces-only",
        action="store_true",
        help="the weights are unchanged: trace the eval requests at tau 0.95 and leave "
        "docs/reference-model.* and the weights' card as they are",
    )
    ap.add_argument(
        "--step",
        action="append",
        default=[],
        metavar="NAME",
        help="run only this step (repeatable), e.g. independent ones in parallel processes",
    )
    ap.add_argument(
        "--install-bundle",
        action="store_true",
        help="afterwards replace the packaged zoo bundle with RUNS/bundle-tiny-bd",
    )
    args = ap.parse_args(argv)

    from ..io import WEIGHTS_DIR, weights_revision

    if args.train_requests is not None and args.train_requests < 1:
        ap.error("--train-requests must be >= 1")
    steps = plan(
        args.runs,
        args.docs,
        n_train=args.train_requests,
        eval_traces_only=args.eval_traces_only,
    )
    if args.dry_run:
        for step in steps:
            print(step.command())
        return 0
    revision = weights_revision(WEIGHTS_DIR / "model.safetensors")
    try:
        rebuild(steps, args.runs, revision, only=args.step)
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
