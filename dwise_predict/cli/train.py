"""`dwise-predict train`: train the admission and refinement predictors into a bundle."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Train the admission and refinement predictors into a bundle", "the trainers issue")
