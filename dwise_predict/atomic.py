"""Whole-or-nothing writes: every file and folder dwise-predict produces goes through here.

A reader (a bundle loader, a trace reader globbing ``*.parquet``, a training stage reading a
workload) must never see a half-written file, and a crash or Ctrl-C must never destroy the
previous good version. So:

* a file is written to a unique hidden temp name in the same folder (``.NAME.<random>.tmp``:
  unique so two writers never share it, hidden and ending in ``.tmp`` so no ``*.parquet`` or
  ``*.json`` glob picks it up), flushed and fsync-ed, then ``os.replace``-d onto its name, and
  the folder is fsync-ed so the rename itself survives a power cut;
* a folder (a bundle, a pulled Hub snapshot, a model checkpoint) is built in a hidden sibling
  and swapped in with :func:`swap_folder`, the only place that replaces a folder.

Temp files are created with ``open(..., "xb")`` rather than ``mkstemp`` so they get the user's
umask permissions like any other output (a bundle is meant to be shared). On any error the temp
file or folder is removed and the error propagates unchanged (callers wrap ``OSError`` in the
error type that fits their context).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

TEMP_SUFFIX = ".tmp"


def temp_name(target: str | os.PathLike[str], tag: str = "") -> Path:
    """A fresh hidden name beside ``target`` (``.NAME.<tag><random>.tmp``); nothing is created."""
    target = Path(target)
    return target.with_name(f".{target.name}.{tag}{secrets.token_hex(6)}{TEMP_SUFFIX}")


def remove_quietly(path: str | os.PathLike[str]) -> None:
    """Remove a file or folder if it is there; never raise (used on error paths)."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Flush a closed file's data to disk (a writer such as pyarrow closed it without fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make renames inside ``folder`` durable; a no-op where the OS cannot fsync a folder."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # Windows cannot open a folder; its renames are journalled by NTFS anyway
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (and platforms) refuse fsync on a folder
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temp path for a writer that needs a file name (pyarrow, safetensors, savefig).

    On a clean exit the file written there is fsync-ed and renamed onto ``target``; on an
    exception it is removed and ``target`` is left as it was.
    """
    target = Path(target)
    tmp = temp_name(target)
    try:
        yield tmp
        if not tmp.is_file():
            raise FileNotFoundError(f"the writer did not create {tmp} for {target}")
        fsync_file(tmp)
        os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_dir(target.parent)


def write_temp(target: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to a new fsync-ed temp file beside ``target``; return its path.

    For writers that place several files together (all temps first, then all renames).
    """
    tmp = temp_name(target)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        remove_quietly(tmp)
        raise
    return tmp


def commit_files(
    moves: Iterable[tuple[str | os.PathLike[str], str | os.PathLike[str]]],
) -> list[Path]:
    """Rename each ``(temp, target)`` into place, in order, all or nothing.

    For writers that place several files as one result (a workload's three files, a
    compaction's merged shards): write every temp first (:func:`write_temp`), then commit
    them here. On a failure (or an interrupt) the temps not yet placed and the targets this
    call already placed are removed before the error propagates, so no reader sees part of
    the set. Each target folder is fsync-ed once at the end. Returns the targets.
    """
    pairs = [(Path(t), Path(d)) for t, d in moves]
    placed: list[Path] = []
    try:
        for tmp, target in pairs:
            os.replace(tmp, target)
            placed.append(target)
    except BaseException:
        for tmp, _ in pairs[len(placed) :]:
            remove_quietly(tmp)
        for target in placed:
            remove_quietly(target)
        raise
    for folder in dict.fromkeys(target.parent for _, target in pairs):
        fsync_dir(folder)
    return placed


def write_bytes(target: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``target`` whole or not at all. Returns ``target`` as a Path."""
    target = Path(target)
    tmp = write_temp(target, data)
    try:
        os.replace(tmp, target)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_dir(target.parent)
    return target


def write_text(target: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 ``text`` to ``target`` whole or not at all."""
    return write_bytes(target, text.encode("utf-8"))


def write_json(
    target: str | os.PathLike[str],
    obj: Any,
    *,
    sort_keys: bool = True,
    allow_nan: bool = False,
    default: Any = None,
) -> Path:
    """Write ``obj`` as indented JSON (plus a newline) to ``target`` whole or not at all.

    ``allow_nan`` is off by default: NaN is not JSON, and other tools reading the file choke.
    """
    text = json.dumps(obj, indent=2, sort_keys=sort_keys, allow_nan=allow_nan, default=default)
    return write_text(target, text + "\n")


def fsync_tree(folder: str | os.PathLike[str]) -> None:
    """fsync every file and folder under ``folder`` (before it is renamed into place)."""
    root = Path(folder)
    for path in sorted(root.rglob("*"), reverse=True):  # children before their folder
        if path.is_symlink():
            continue
        if path.is_file():
            fsync_file(path)
        elif path.is_dir():
            fsync_dir(path)
    fsync_dir(root)


def swap_folder(staged: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Put the finished folder ``staged`` at ``target`` (same file system), replacing any old one.

    A folder cannot be exchanged atomically with portable calls, so this takes two renames;
    between them the previous version sits intact in a hidden ``.NAME.<random>.tmp/previous``
    sibling, never half-written, and it is removed once the new one is in place.
    """
    staged, target = Path(staged), Path(target)
    fsync_tree(staged)
    if not target.exists():
        os.replace(staged, target)
    else:
        old = temp_name(target, "old.")
        os.mkdir(old)
        os.replace(target, old / "previous")
        os.replace(staged, target)
        shutil.rmtree(old, ignore_errors=True)
    fsync_dir(target.parent)
    return target


@contextlib.contextmanager
def staged_folder(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty hidden sibling folder of ``target`` to build in; swap it in on a clean exit.

    On an exception (Ctrl-C included) the staged folder is removed and ``target`` is untouched.
    The caller may check the staged folder (load it back) before the block ends.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = temp_name(target)
    os.mkdir(staged)  # mkdir (not mkdtemp, which makes 0700) so the umask applies
    try:
        yield staged
        swap_folder(staged, target)
    except BaseException:
        remove_quietly(staged)
        raise
