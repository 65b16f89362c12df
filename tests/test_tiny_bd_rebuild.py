"""The tiny-bd rebuild: its commands are the CLI's, finished steps are skipped, failures resume."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from dwise_predict.zoo.tiny_bd.recipe import rebuild as rb
from dwise_predict.zoo.tiny_bd.recipe.report import build_parser as report_parser

from dwise_predict.cli import build_parser
from dwise_predict.errors import TrainingError


def test_every_step_parses_with_the_real_parsers(tmp_path: Path) -> None:
    """The plan's argv are accepted by the parsers that will run them: a renamed flag fails here,
    not an hour into a rebuild."""
    steps = rb.plan(tmp_path / "runs", tmp_path / "docs")
    assert [s.name for s in steps] == [
        "workload",
        "report",
        "traces-train",
        "profile",
        "bundle",
        "export",
        "eval",
        "eval-holdout-chat",
        "simulate",
    ]
    cli = build_parser()
    for step in steps:
        if step.program == "report":
            args = report_parser().parse_args(list(step.argv))
            assert args.n == 1000 and args.overwrite
        else:
            args = cli.parse_args(list(step.argv))
            assert args.command == step.argv[0]
        for out in step.outputs:
            assert out.is_relative_to(tmp_path / "runs")  # never removes docs or the zoo


class Recorder:
    """A runner that writes each step's outputs, so removal and resumption can be seen."""

    def __init__(self, steps: Sequence[rb.Step], fail: str | None = None) -> None:
        self.by_argv = {s.argv: s for s in steps}
        self.fail = fail
        self.calls: list[str] = []

    def __call__(self, program: str, argv: Sequence[str]) -> int:
        step = self.by_argv[tuple(argv)]
        self.calls.append(step.name)
        if step.name == self.fail:
            return 2
        for out in step.outputs:
            out.mkdir(parents=True, exist_ok=True)
            (out / "made").write_text(step.name)
        return 0


def _steps(tmp_path: Path) -> list[rb.Step]:
    return rb.plan(tmp_path / "runs", tmp_path / "docs")


def test_rebuild_resumes_after_a_failure_and_skips_finished_steps(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    steps = _steps(tmp_path)
    failing = Recorder(steps, fail="bundle")
    with pytest.raises(TrainingError, match="'bundle' failed \\(exit 2\\).*rerun"):
        rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=failing, log=lambda _: None)
    assert failing.calls == ["workload", "report", "traces-train", "profile", "bundle"]
    assert not (runs / "rebuild" / "bundle.json").exists()
    record = json.loads((runs / "rebuild" / "profile.json").read_text())
    assert record["revision"] == "aaaaaaaaaaaa" and record["command"].startswith(
        "dwise-predict profile"
    )

    # a half-written output of the failed step is removed before it reruns
    (runs / "bundle-tiny-bd").mkdir()
    (runs / "bundle-tiny-bd" / "stale").write_text("x")
    again = Recorder(steps)
    ran = rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=again, log=lambda _: None)
    assert ran == again.calls == ["bundle", "export", "eval", "eval-holdout-chat", "simulate"]
    assert not (runs / "bundle-tiny-bd" / "stale").exists()

    # everything done: nothing runs
    assert rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=Recorder(steps), log=lambda _: None) == []


def test_new_weights_or_a_changed_command_rerun_from_there(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    steps = _steps(tmp_path)
    rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=Recorder(steps), log=lambda _: None)
    names = [s.name for s in steps]
    assert (
        rb.rebuild(steps, runs, "bbbbbbbbbbbb", runner=Recorder(steps), log=lambda _: None) == names
    )

    # a changed command for one step reruns it and every step after it (their inputs changed)
    changed = rb.plan(runs, tmp_path / "docs", n_train=300)
    rerun = rb.rebuild(changed, runs, "bbbbbbbbbbbb", runner=Recorder(changed), log=lambda _: None)
    assert rerun == names[names.index("traces-train") :]


def test_run_program_returns_argparse_exits_as_codes() -> None:
    assert rb.run_program("dwise-predict", ["trace", "--no-such-flag"]) == 2
    with pytest.raises(TrainingError, match="unknown program"):
        rb.run_program("make", [])


def test_install_bundle_swaps_whole_folders(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    (bundle / "admission.lgb.txt").write_text("new")
    dest = tmp_path / "zoo" / "tiny-bd"
    dest.mkdir(parents=True)
    (dest / "manifest.json").write_text("{}")
    (dest / "only-in-old.onnx").write_text("old")
    rb.install_bundle(bundle, dest)
    assert sorted(p.name for p in dest.iterdir()) == ["admission.lgb.txt", "manifest.json"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tiny-bd"]
    with pytest.raises(TrainingError, match="not a bundle"):
        rb.install_bundle(tmp_path / "empty", dest)


def test_dry_run_prints_the_docs_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert rb.main(["--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9
    assert lines[1] == (
        "python -m dwise_predict.zoo.tiny_bd.recipe.report --out docs --n 1000 "
        "--traces runs/tiny-bd-eval --overwrite"
    )
    assert lines[4] == (
        "dwise-predict train --traces runs/traces-train --out runs/bundle-tiny-bd --seed 0 "
        "--cost-profile runs/profile/cost_profile.json --dws-int8-only"
    )
