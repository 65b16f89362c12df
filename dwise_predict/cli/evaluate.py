"""`dwise-predict eval`: evaluate a bundle's predictors on traces."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Evaluate a bundle's predictors on traces", "the trainers issue")
