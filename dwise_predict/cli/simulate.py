"""`dwise-predict simulate`: replay traces under scheduling policies in the trace-driven simulator."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Replay traces under scheduling policies in the trace-driven simulator", "the runtime issue")
