"""`dwise-predict workload`: build the request workload (prompts by category) as JSONL."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Build the request workload (prompts by category) as JSONL", "the foundation issue")
