"""`dwise-predict demo`: run the whole pipeline on the embedded defaults."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Run the whole pipeline on the embedded defaults", "the foundation issue")
