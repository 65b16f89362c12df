"""`dwise-predict trace`: trace a dLLM's denoising rounds and first-round hidden states into Parquet."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Trace a dLLM's denoising rounds and first-round hidden states into Parquet", "the tracing issue")
