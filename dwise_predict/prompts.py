"""A user's own prompts, from JSONL, Parquet or CSV, as the records the tracer reads.

Someone tracing their own traffic has prompts, and maybe an id and a category; nothing else
should be demanded of them. So only the prompt is required:

* ``id`` defaults to the record's line number in the file (its row number for Parquet), and
  ``category`` to ``unknown``; ``source`` is the file's name unless the record carries one;
* the three columns can have other names (``prompt_column``, ``id_column``,
  ``category_column``);
* a prompt is plain text or a chat conversation: a list of ``{"role", "content"}`` turns
  (OpenAI's format; ``content`` may also be a list of ``{"type": "text", "text"}`` parts). In
  CSV a conversation is a cell holding that list as JSON.

The project's own workload files (``dwise-predict workload``) are read by the same function:
their extra fields (``reference``, ``meta``) are simply not needed for tracing.

A conversation becomes one prompt text (:func:`prompt_text`): a single user turn is its
content, so ``[{"role": "user", "content": "hi"}]`` and ``"hi"`` trace identically; longer
conversations are their turns as ``role: content`` paragraphs. Admission features (words,
newlines, tokens after the chat template) are computed from that text, so a server must turn
a conversation into text with the same function before it asks the admission predictor.

This module needs pyarrow only: it is part of the light core.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import WorkloadError

#: category of a record that names none
UNKNOWN_CATEGORY = "unknown"
#: file suffixes read as each format
FORMATS: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".ndjson", ".json"),
    "parquet": (".parquet", ".pq"),
    "csv": (".csv",),
}


@dataclass(frozen=True)
class PromptRecord:
    """One request to trace: an id, a category, where it came from, and the prompt text."""

    id: str
    category: str
    source: str
    prompt: str


@dataclass(frozen=True)
class PromptColumns:
    """Which field of a record holds the prompt, the id and the category."""

    prompt: str = "prompt"
    id: str = "id"
    category: str = "category"


def prompt_text(value: Any, where: str = "record", field: str = "prompt") -> str:
    """A prompt field as text: plain text as is, a chat conversation flattened (module docs).

    Raises :class:`WorkloadError` naming ``where`` and ``field`` when the value is missing,
    empty, or neither text nor a list of role/content turns.
    """
    if isinstance(value, str):
        text = value
    elif isinstance(value, (list, tuple)):
        text = _conversation_text(list(value), where, field)
    elif value is None:
        raise WorkloadError(
            f"{where}: field {field!r} is missing or null; every record needs a "
            f"prompt (pick the column with --prompt-column)"
        )
    else:
        raise WorkloadError(
            f"{where}: field {field!r} must be text or a list of "
            f"{{role, content}} turns, got {type(value).__name__}"
        )
    if not text.strip():
        raise WorkloadError(f"{where}: field {field!r} is empty; drop the record or fill it in")
    return text


def _conversation_text(turns: list[Any], where: str, field: str) -> str:
    if not turns:
        raise WorkloadError(
            f"{where}: field {field!r} is an empty conversation; it needs at least "
            "one {role, content} turn"
        )
    parts: list[tuple[str, str]] = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str):
            raise WorkloadError(
                f"{where}: field {field!r} turn {k} must be an object with a "
                f"'role' and a 'content', got {str(turn)[:60]!r}"
            )
        parts.append((turn["role"], _turn_content(turn.get("content"), where, field, k)))
    if len(parts) == 1 and parts[0][0] == "user":
        return parts[0][1]
    return "\n\n".join(f"{role}: {content}" for role, content in parts)


def _turn_content(content: Any, where: str, field: str, k: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "".join(texts)  # type: ignore[arg-type]
    raise WorkloadError(
        f"{where}: field {field!r} turn {k} has no text content (only text "
        f"turns can be traced), got {str(content)[:60]!r}"
    )


def read_prompts(path: str | Path, columns: PromptColumns | None = None) -> list[PromptRecord]:
    """Every record of a JSONL, Parquet or CSV file as a :class:`PromptRecord`.

    The format follows the suffix (:data:`FORMATS`). Errors name the file, the line (or row)
    and the field. Ids must be unique, defaults included.
    """
    path = Path(path)
    cols = columns or PromptColumns()
    fmt = _format_of(path)
    if not path.is_file():
        raise WorkloadError(f"prompt file {path} does not exist; pass a JSONL, Parquet or CSV file")
    line_word = "row" if fmt == "parquet" else "line"
    records: list[PromptRecord] = []
    seen: dict[str, int] = {}
    for line, obj in _rows(path, fmt):
        where = f"{path} {line_word} {line}"
        rec = _record(obj, cols, where, str(line), path.name)
        if rec.id in seen:
            raise WorkloadError(
                f"{where}: id {rec.id!r} is also the id of {line_word} "
                f"{seen[rec.id]}; ids must be unique (a record without an id "
                f"gets its {line_word} number)"
            )
        seen[rec.id] = line
        records.append(rec)
    if not records:
        raise WorkloadError(f"prompt file {path} holds no records")
    return records


def shard_of(request_id: str, num_shards: int) -> int:
    """The shard (0 .. num_shards - 1) a request belongs to, from its id alone.

    A stable hash, not the request's position: the split does not depend on the order of the
    workload file or on which other requests it holds, so N machines that each trace one shard
    of the same workload produce disjoint outputs whose union is the whole workload, and a rerun
    with ``--resume`` finds each request in the same shard.
    """
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % num_shards


def select_shard(
    records: list[PromptRecord], num_shards: int, shard_index: int
) -> list[PromptRecord]:
    """The records of shard ``shard_index`` of ``num_shards`` (see :func:`shard_of`), in order."""
    if num_shards < 1:
        raise WorkloadError(f"the number of shards must be >= 1, got {num_shards}")
    if not 0 <= shard_index < num_shards:
        raise WorkloadError(
            f"shard index {shard_index} is outside 0..{num_shards - 1}; shards are numbered "
            "from 0 (a Slurm array's SLURM_ARRAY_TASK_ID with --array=0-N-1)"
        )
    return [r for r in records if shard_of(r.id, num_shards) == shard_index]


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    for fmt, suffixes in FORMATS.items():
        if suffix in suffixes:
            return fmt
    known = ", ".join(s for group in FORMATS.values() for s in group)
    raise WorkloadError(
        f"cannot tell the format of {path} from its suffix {suffix!r}; name it with one of {known}"
    )


def _record(
    obj: Any, cols: PromptColumns, where: str, default_id: str, file_name: str
) -> PromptRecord:
    if not isinstance(obj, dict):
        raise WorkloadError(
            f"{where}: expected an object with a {cols.prompt!r} field, got {type(obj).__name__}"
        )
    if cols.prompt not in obj:
        have = ", ".join(sorted(map(str, obj))) or "none"
        raise WorkloadError(
            f"{where}: no field {cols.prompt!r} (fields: {have}); name the prompt "
            "field with --prompt-column"
        )
    prompt = prompt_text(obj[cols.prompt], where, cols.prompt)
    return PromptRecord(
        id=_text_field(obj, cols.id, where, default_id),
        category=_text_field(obj, cols.category, where, UNKNOWN_CATEGORY),
        source=_text_field(obj, "source", where, file_name),
        prompt=prompt,
    )


def _text_field(obj: dict[str, Any], key: str, where: str, default: str) -> str:
    """An optional field as text: absent, null or empty gives ``default``; numbers are text."""
    value = obj.get(key)
    if value is None or value == "":
        return default
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise WorkloadError(
            f"{where}: field {key!r} must be text or an integer, got {type(value).__name__}"
        )
    return str(value)


def _rows(path: Path, fmt: str) -> Iterator[tuple[int, Any]]:
    """``(line or row number, record)`` pairs, numbered from 1 as an editor shows them."""
    if fmt == "parquet":
        yield from _parquet_rows(path)
        return
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read {path}: {e}; prompt files are UTF-8 text") from e
    if fmt == "jsonl":
        # lines end at "\n" only: str.splitlines() would also cut at U+2028, U+0085 and the
        # like, which JSON strings may hold raw (ShareGPT prompts do)
        for i, line in enumerate(text.split("\n"), start=1):
            if line.strip():
                try:
                    yield i, json.loads(line)
                except json.JSONDecodeError as e:
                    raise WorkloadError(
                        f"{path} line {i}: not valid JSON ({e.msg}); each line "
                        "must be one JSON object"
                    ) from e
        return
    reader = csv.DictReader(io.StringIO(text, newline=""))
    for row in reader:
        yield reader.line_num, {k: _csv_cell(v) for k, v in row.items() if k is not None}


def _csv_cell(value: str | None) -> Any:
    """A CSV cell; one holding a JSON list (a chat conversation) is decoded."""
    if value is not None and value.lstrip().startswith("[{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _parquet_rows(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise WorkloadError(f"cannot read {path}: {e}; the file is corrupt or not Parquet") from e
    yield from enumerate(table.to_pylist(), start=1)
