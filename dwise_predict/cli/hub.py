"""`dwise-predict push` / `pull`: publish bundles to and fetch them from the Hugging Face Hub."""

from __future__ import annotations

import argparse
from typing import Any

from ._common import add_stub

_HELP = {
    "push": "Upload a bundle folder to a Hugging Face Hub repository",
    "pull": "Download a bundle from a Hugging Face Hub repository",
}


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    add_stub(subparsers, name, common, _HELP[name], "the export issue")
