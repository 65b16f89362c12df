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
        self.by_argv.update({s.resume_argv: s for s in steps if s.resume_argv is not None})
        self.argvs: list[tuple[str, ...]] = []
        self.fail = fail
        self.calls: list[str] = []

    def __call__(self, program: str, argv: Sequence[str]) -> int:
        step = self.by_argv[tuple(argv)]
        self.calls.append(step.name)
        self.argvs.append(tuple(argv))
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


def test_the_release_plan_trains_on_the_whole_split_and_profiles_with_the_probe(
    tmp_path: Path,
) -> None:
    """Zoo 1.0: no --limit on the training traces (``--train-requests N`` puts one back), and
    the cost profile serves 200 requests with the speed probe (docs/cost-model.md)."""
    by_name = {s.name: s for s in _steps(tmp_path)}
    assert "--limit" not in by_name["traces-train"].argv
    profile = build_parser().parse_args(list(by_name["profile"].argv))
    assert (profile.limit, profile.speed_probe, profile.threads, profile.clock) == (
        200,
        3,
        1,
        "cpu",
    )
    some = {s.name: s for s in rb.plan(tmp_path / "runs", tmp_path / "docs", n_train=600)}
    assert build_parser().parse_args(list(some["traces-train"].argv)).limit == 600

    # keeping the weights: the report traces tau 0.95 into runs/ and never writes the docs
    kept = {s.name: s for s in rb.plan(tmp_path / "runs", tmp_path / "docs", eval_traces_only=True)}
    args = report_parser().parse_args(list(kept["report"].argv))
    assert args.out == tmp_path / "runs" / "report" and args.no_card
    assert args.thresholds == "0.95" and args.traces == tmp_path / "runs" / "tiny-bd-eval"
    assert all(out.is_relative_to(tmp_path / "runs") for out in kept["report"].outputs)


def test_named_steps_run_alone_and_drop_the_records_of_what_reads_them(tmp_path: Path) -> None:
    """``--step``: independent steps run in processes of their own; the records of the steps
    that read their outputs go (a plain rebuild reruns those), the others stay."""
    runs = tmp_path / "runs"
    steps = _steps(tmp_path)
    quiet = {"log": lambda _: None}
    rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=Recorder(steps), **quiet)
    for name in ("traces-train", "profile"):
        alone = Recorder(steps)
        assert rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=alone, only=[name], **quiet) == [name]
        assert rb.is_done(runs, steps[1], "aaaaaaaaaaaa")  # the report reads neither
    assert all(rb.is_done(runs, s, "aaaaaaaaaaaa") for s in steps[:4])
    rest = Recorder(steps)
    assert rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=rest, **quiet) == [
        "bundle",
        "export",
        "eval",
        "eval-holdout-chat",
        "simulate",
    ]
    # the eval traces feed the evaluations and the simulator, not the bundle
    assert rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=Recorder(steps), only=["report"],
                      **quiet) == ["report"]  # fmt: skip
    assert [s.name for s in steps if not rb.is_done(runs, s, "aaaaaaaaaaaa")] == [
        "eval",
        "eval-holdout-chat",
        "simulate",
    ]
    with pytest.raises(TrainingError, match="unknown step"):
        rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=Recorder(steps), only=["tracing"])


def test_an_interrupted_tracing_step_resumes_its_shards(tmp_path: Path) -> None:
    """The tracing steps keep what an interrupted run of the same command wrote (the tracer
    skips those requests); a changed command or new weights start them over."""
    runs = tmp_path / "runs"
    steps = _steps(tmp_path)
    traces = runs / "traces-train"
    failing = Recorder(steps, fail="traces-train")
    with pytest.raises(TrainingError):
        rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=failing, log=lambda _: None)
    traces.mkdir(parents=True)
    (traces / "shard-00000.parquet").write_text("written before the stop")
    again = Recorder(steps)
    rb.rebuild(steps, runs, "aaaaaaaaaaaa", runner=again, log=lambda _: None)
    step = next(s for s in steps if s.name == "traces-train")
    assert again.argvs[0] == step.resume_argv and step.resume_argv[-1] == "--resume"
    assert (traces / "shard-00000.parquet").exists()
    assert not (runs / "rebuild" / "traces-train.started.json").exists()

    # new weights: the half-written shards of the old ones are removed, the command runs plain
    with pytest.raises(TrainingError):
        rb.rebuild(steps, runs, "bbbbbbbbbbbb", runner=Recorder(steps, fail="traces-train"),
                   log=lambda _: None)  # fmt: skip
    traces.mkdir(parents=True, exist_ok=True)
    (traces / "stale.parquet").write_text("x")
    fresh = Recorder(steps)
    rb.rebuild(steps, runs, "cccccccccccc", runner=fresh, log=lambda _: None)
    assert fresh.argvs[fresh.calls.index("traces-train")] == step.argv
    assert not (traces / "stale.parquet").exists()
