"""Rules the library code keeps, checked on its source (every package, not only the core)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dwise_predict", "tracing", "trainers", "export", "zoo")


def _library_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def test_the_scan_sees_the_library():
    names = {p.relative_to(REPO).as_posix() for p in _library_files()}
    assert {
        "dwise_predict/bundle/bundle.py",
        "tracing/engine.py",
        "trainers/refinement.py",
    } <= names


def test_no_assert_is_used_as_a_runtime_check():
    """``python -O`` strips asserts: a check that must hold is a raise of the library's errors."""
    found = [
        f"{p.relative_to(REPO)}:{node.lineno}"
        for p in _library_files()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), str(p)))
        if isinstance(node, ast.Assert)
    ]
    assert found == []
