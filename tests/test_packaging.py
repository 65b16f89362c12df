"""What the two distributions declare: extras that mean what they say, a light core, a plain dev
install, and a zoo wheel without training logs (`make wheels` checks the built wheels too)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[1]


def _project(path: Path) -> dict:
    return tomllib.loads(path.read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_core_depends_on_no_plotting_and_no_framework():
    deps = _names(_project(REPO / "pyproject.toml")["project"]["dependencies"])
    assert not deps & {"matplotlib", "torch", "pytorch-lightning", "transformers", "sglang"}


def test_the_sglang_extra_is_sglang_itself():
    """A GPU user's `pip install dwise-predict[sglang]` gets SGLang, and none of its internals
    pinned by us (the CPU test recipe is tests/sglang_plugin/requirements-cpu.txt)."""
    extras = _project(REPO / "pyproject.toml")["project"]["optional-dependencies"]
    assert extras["sglang"] == ["sglang==0.5.23"]
    assert (REPO / "tests/sglang_plugin/requirements-cpu.txt").is_file()


def test_plots_are_an_extra_that_train_and_dev_include():
    extras = _project(REPO / "pyproject.toml")["project"]["optional-dependencies"]
    assert _names(extras["plots"]) == {"matplotlib"}
    for name in ("train", "dev"):
        assert "dwise-predict[plots]" in extras[name], name


@pytest.mark.parametrize(
    "makefile", [REPO / "Makefile", *sorted(REPO.glob("mk/*.mk"))], ids=lambda p: p.name
)
def test_the_makefiles_install_plainly(makefile):
    """No .pth file or symlink of the Makefile's own, and no second editable install for the
    zoo: the core's development install covers zoo/, and an editable zoo next to it would hide
    the core outside the checkout (setup.py says why)."""
    text = makefile.read_text(encoding="utf-8")
    assert ".pth" not in text
    assert "ln -s" not in text
    assert "-e ./zoo" not in text, f"{makefile.name}: drop `pip install -e ./zoo` (see setup.py)"


def test_the_zoo_wheel_leaves_training_logs_out():
    tool = _project(REPO / "zoo/pyproject.toml")["tool"]["setuptools"]
    shipped = tool["package-data"]["dwise_predict.zoo.tiny_bd"]
    excluded = tool["exclude-package-data"]["dwise_predict.zoo.tiny_bd"]
    package = REPO / "zoo/tiny_bd"
    logs = sorted(p.relative_to(package).as_posix() for p in package.rglob("train_log*.csv"))
    assert logs, "the repository keeps the training logs; the test needs them to look at"
    for log in logs:
        assert any(fnmatch.fnmatch(log, g) for g in shipped)  # so the exclusion is what works
        assert any(fnmatch.fnmatch(log, g) for g in excluded), log
