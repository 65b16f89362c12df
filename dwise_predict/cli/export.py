"""`dwise-predict export`: export a bundle's predictors to ONNX / INT8."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, "Export a bundle's predictors to ONNX / INT8", "the export issue")
