"""`dwise-predict push` / `pull`: publish bundles to and fetch them from the Hugging Face Hub.

``push BUNDLE --repo-id ORG/NAME [--revision BRANCH] [--tag TAG] [--private] [--endpoint URL]``
composes :func:`dwise_predict.export.hub.push_bundle`; ``pull ORG/NAME[@REV] --out DIR
[--endpoint URL]`` composes :func:`dwise_predict.hub.pull_bundle`. The token comes from
``HF_TOKEN`` or ``hf auth login`` (never a command-line flag: it would show in ``ps`` and shell
history).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

_HELP = {
    "push": "Upload a bundle folder to a Hugging Face Hub repository",
    "pull": "Download a bundle from a Hugging Face Hub repository",
}


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name, parents=[common], help=_HELP[name], description=_HELP[name] + "."
    )
    if name == "push":
        p.add_argument("bundle", metavar="BUNDLE", help="bundle folder (with manifest.json)")
        p.add_argument(
            "--repo-id",
            required=True,
            metavar="ORG/NAME",
            help="Hub model repository (created if missing)",
        )
        p.add_argument(
            "--revision",
            metavar="BRANCH",
            default=None,
            help="branch to commit to (default: main; created from main if missing)",
        )
        p.add_argument(
            "--tag", default=None, help="tag to cut on the new commit (tags are never moved)"
        )
        p.add_argument(
            "--private", action="store_true", help="create the repository private (if it is new)"
        )
        p.add_argument("--message", default=None, help="commit message")
        p.set_defaults(func=run_push)
    else:
        p.add_argument(
            "ref",
            metavar="ORG/NAME[@REV]",
            help="repository, optionally @branch, @tag or @commit-sha "
            "(an hf:// prefix is accepted)",
        )
        p.add_argument(
            "--out",
            required=True,
            metavar="DIR",
            help="folder to write the bundle into (atomically)",
        )
        p.add_argument(
            "--overwrite", action="store_true", help="replace DIR if it exists and is not empty"
        )
        p.add_argument(
            "--offline", action="store_true", help="use only the local Hugging Face cache"
        )
        p.set_defaults(func=run_pull)
    p.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="Hub endpoint (default: HF_ENDPOINT or huggingface.co)",
    )


def _quiet_hub(args: argparse.Namespace) -> None:
    if args.quiet or not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


def run_push(args: argparse.Namespace) -> int:
    from dwise_predict.export.hub import push_bundle

    _quiet_hub(args)
    result = push_bundle(
        args.bundle,
        args.repo_id,
        revision=args.revision,
        tag=args.tag,
        private=args.private,
        endpoint=args.endpoint,
        commit_message=args.message,
    )
    print(
        f"pushed {args.bundle} -> {result.repo_id}@{result.revision} commit {result.commit_sha}"
        + (f" tag {result.tag}" if result.tag else "")
    )
    print(f"load it with: dwise_predict.load_bundle({result.hub_ref!r})")
    return 0


def run_pull(args: argparse.Namespace) -> int:
    from ..hub import pull_bundle

    _quiet_hub(args)
    out = pull_bundle(
        args.ref,
        args.out,
        endpoint=args.endpoint,
        local_files_only=args.offline,
        overwrite=args.overwrite,
    )
    print(f"pulled {args.ref} -> {out}")
    return 0
