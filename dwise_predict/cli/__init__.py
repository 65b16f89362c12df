"""The ``dwise-predict`` command line.

Each subcommand lives in its own module of this package with two functions:
``register(subparsers)`` adds its parser and ``run(args) -> int`` composes the Python API.
The CLI adds nothing of its own: everything a subcommand does is a library call a user could
make from Python. Errors of the library's own types print as one line and exit non-zero;
``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from .._version import __version__
from ..errors import DwisePredictError

#: subcommand name -> module (relative to this package), in the order --help lists them
SUBCOMMANDS: dict[str, str] = {
    "workload": ".workload",
    "trace": ".trace",
    "traces": ".traces",
    "profile": ".profile",
    "train": ".train",
    "refresh": ".refresh",
    "eval": ".evaluate",
    "export": ".export",
    "push": ".hub",
    "pull": ".hub",
    "simulate": ".simulate",
    "demo": ".demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dwise-predict",
        description="Trace diffusion LLMs, train remaining-work "
        "predictors, publish them, and schedule with them.",
    )
    parser.add_argument("--version", action="version", version=f"dwise-predict {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("common options")
    g.add_argument(
        "--seed", type=int, default=0, help="random seed (default: 0); same seed, same output"
    )
    g.add_argument(
        "-q", "--quiet", action="store_true", help="print only results and errors, no progress bars"
    )
    g.add_argument("-v", "--verbose", action="store_true", help="print debug logging")
    g.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in SUBCOMMANDS.items():
        mod = importlib.import_module(module, __name__)
        mod.register(sub, name, common)
    return parser


def _configure_logging(args: argparse.Namespace) -> None:
    """Our messages at INFO (DEBUG with -v, WARNING with -q); other libraries' only from WARNING
    (or DEBUG with -v), so exporter and trainer chatter does not drown the results."""
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(message)s",
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("dwise_predict").setLevel(level)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args)
    try:
        return int(args.func(args) or 0)
    except DwisePredictError as e:
        if args.debug:
            raise
        print(f"dwise-predict {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as e:  # Ctrl-C (130), or a stop signal such as SIGTERM (143)
        print(f"dwise-predict {args.command}: {e or 'interrupted'}", file=sys.stderr)
        return int(getattr(e, "exit_code", 130))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
