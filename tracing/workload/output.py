"""Write a built workload to a folder: train.jsonl, eval.jsonl, summary.json, all or nothing.

All three files are first written to temp names in the target folder; only when every one is
complete are they renamed into place. On any failure the temps and any file already renamed by
this call are removed (and the folder, if this call created it and it is now empty), so a failed
run never leaves a partial workload that a later stage would read as real.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

from dwise_predict.atomic import commit_files, remove_quietly, write_temp
from dwise_predict.errors import WorkloadError

from .builder import WorkloadSplits
from .records import encode_workload

TRAIN_FILE, EVAL_FILE, SUMMARY_FILE = "train.jsonl", "eval.jsonl", "summary.json"


def write_splits(splits: WorkloadSplits, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write the splits and summary into ``out_dir`` (created if missing). Returns name -> path."""
    out = Path(out_dir)
    payloads = {TRAIN_FILE: encode_workload(splits.train), EVAL_FILE: encode_workload(splits.eval)}
    summary = splits.summary_dict()
    summary["files"] = {
        name: {"records": n, "sha256": hashlib.sha256(data).hexdigest()}
        for (name, data), n in zip(payloads.items(), (len(splits.train), len(splits.eval)))
    }
    payloads[SUMMARY_FILE] = (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode("utf-8")

    created = _make_dir(out)  # folders this call made, deepest first
    temps: dict[str, Path] = {}
    try:
        for name, data in payloads.items():
            temps[name] = write_temp(out / name, data)
        # summary.json last: its presence means the set is whole
        commit_files((tmp, out / name) for name, tmp in temps.items())
    except OSError as e:
        _cleanup(temps.values(), created)
        raise WorkloadError(
            f"cannot write the workload to {out}: {e.strerror or e}; "
            "choose a writable --out folder with free space"
        ) from e
    except BaseException:
        _cleanup(temps.values(), created)
        raise
    return {name: out / name for name in payloads}


def _make_dir(out: Path) -> list[Path]:
    """Create ``out`` (and parents) if needed; returns the folders created, deepest first."""
    if out.is_dir():
        return []
    if out.exists():
        raise WorkloadError(f"--out {out} exists and is not a folder; give a folder path")
    missing = [p for p in (out, *out.parents) if not p.exists()]
    try:
        out.mkdir(parents=True)
    except OSError as e:
        _cleanup((), missing)
        raise WorkloadError(
            f"cannot create the output folder {out}: {e.strerror or e}; "
            "choose a writable --out folder"
        ) from e
    return missing


def _cleanup(temps: Iterable[Path], created: list[Path]) -> None:
    for tmp in temps:
        remove_quietly(tmp)
    for folder in created:  # deepest first; rmdir only succeeds on an empty folder
        try:
            folder.rmdir()
        except OSError:
            break
