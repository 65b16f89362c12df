import subprocess
import sys

import pytest

from dwise_predict.cli import SUBCOMMANDS, main

NAMES = [
    "workload",
    "trace",
    "traces",
    "profile",
    "train",
    "refresh",
    "eval",
    "export",
    "push",
    "pull",
    "simulate",
    "demo",
]


def test_help_lists_every_subcommand():
    out = subprocess.run(
        [sys.executable, "-m", "dwise_predict", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for name in NAMES:
        assert f"    {name}" in out.stdout
    assert list(SUBCOMMANDS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_every_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "--seed" in out and "--quiet" in out and "--debug" in out


def test_library_error_is_one_line_and_nonzero(capsys, tmp_path):
    # reading a trace folder that does not exist is a library error: one line, no traceback
    from dwise_predict.errors import TraceError
    from dwise_predict.traces import read_traces

    with pytest.raises(TraceError, match="does not exist"):
        read_traces(tmp_path / "nope")
