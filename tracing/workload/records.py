"""One workload request as a record, and the JSONL file format that stores a list of them.

The workload is the *input* side of tracing: which prompts the dLLM is asked to answer. A
record keeps the reference response and the exact answer facts (``meta``) next to the prompt
because the reference-model training and the accuracy checks of single-answer categories both
need them, and carrying them in the same line keeps the pairing impossible to lose.

Files are written whole or not at all (temp file in the same folder, then ``os.replace``) so a
crash never leaves a half-written workload that a later run would silently read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dwise_predict import atomic
from dwise_predict.errors import WorkloadError

#: the six categories of the default workload mix (DWISE paper, Table 1), in output order
CATEGORIES: tuple[str, ...] = ("chat", "code", "instruction", "math", "mcq", "long_context")
#: a training-only category (copy / reverse / count), never part of the default mix
SYNTHETIC = "synthetic"
#: every category a record may carry
KNOWN_CATEGORIES: tuple[str, ...] = (*CATEGORIES, SYNTHETIC)
#: version of the JSONL record layout below; bumped when a field changes meaning
WORKLOAD_SCHEMA_VERSION = 1

_FIELDS = ("id", "category", "source", "prompt", "reference", "meta")


@dataclass(frozen=True)
class WorkloadRecord:
    """One request of the workload.

    ``reference`` is the source's reference response (ShareGPT's first reply, HumanEval's
    canonical solution, a worked answer for generated problems) or None when there is none.
    ``meta`` holds what checks and difficulty analyses need: the exact answer, the answer
    letter, the needle facts, and the difficulty knobs the generator used.
    """

    id: str
    category: str
    source: str
    prompt: str
    reference: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The record as a JSON object with a fixed key order (for byte-identical files)."""
        return {
            "id": self.id,
            "category": self.category,
            "source": self.source,
            "prompt": self.prompt,
            "reference": self.reference,
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "record") -> WorkloadRecord:
        """Validate a decoded JSON object and build the record; ``where`` names it in errors."""
        if not isinstance(obj, dict):
            raise WorkloadError(
                f"{where}: expected a JSON object, got {type(obj).__name__}; "
                "each line of a workload file must be one record object"
            )
        missing = [k for k in _FIELDS if k not in obj]
        if missing:
            raise WorkloadError(
                f"{where}: missing field(s) {', '.join(missing)}; a record needs "
                f"{', '.join(_FIELDS)} (see docs/workload.md)"
            )
        for key in ("id", "category", "source", "prompt"):
            if not isinstance(obj[key], str) or not obj[key]:
                raise WorkloadError(
                    f"{where}: field {key!r} must be a non-empty string, "
                    f"got {obj[key]!r:.60}; fix or drop this record"
                )
        if obj["category"] not in KNOWN_CATEGORIES:
            raise WorkloadError(
                f"{where}: unknown category {obj['category']!r}; valid: "
                f"{', '.join(KNOWN_CATEGORIES)}"
            )
        if obj["reference"] is not None and not isinstance(obj["reference"], str):
            raise WorkloadError(
                f"{where}: field 'reference' must be a string or null, got "
                f"{type(obj['reference']).__name__}"
            )
        if not isinstance(obj["meta"], dict):
            raise WorkloadError(
                f"{where}: field 'meta' must be a JSON object, got {type(obj['meta']).__name__}"
            )
        return cls(
            id=obj["id"],
            category=obj["category"],
            source=obj["source"],
            prompt=obj["prompt"],
            reference=obj["reference"],
            meta=obj["meta"],
        )


def dumps_record(record: WorkloadRecord) -> str:
    """One JSONL line (no newline). UTF-8 text is kept as is; NaN is refused (not JSON)."""
    return json.dumps(
        record.to_json(), ensure_ascii=False, allow_nan=False, separators=(", ", ": ")
    )


def encode_workload(records: Iterable[WorkloadRecord]) -> bytes:
    """The exact bytes of a workload JSONL file; the same records give the same bytes."""
    lines = []
    for i, r in enumerate(records):
        if not isinstance(r, WorkloadRecord):
            raise WorkloadError(f"record {i} is a {type(r).__name__}, not a WorkloadRecord")
        try:
            lines.append(dumps_record(r))
        except ValueError as e:  # NaN/inf in meta
            raise WorkloadError(
                f"record {r.id!r} cannot be written as JSON ({e}); "
                "replace NaN/inf values in its meta"
            ) from e
    text = "\n".join(lines) + ("\n" if lines else "")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise WorkloadError(
            f"a record holds text that is not valid UTF-8 ({e.reason}); drop or clean the record"
        ) from e


def write_workload(records: Iterable[WorkloadRecord], path: str | os.PathLike[str]) -> Path:
    """Write records as JSONL (one object per line, UTF-8), atomically. Returns the path."""
    path = Path(path)
    try:
        return atomic.write_bytes(path, encode_workload(records))
    except OSError as e:
        raise WorkloadError(
            f"cannot write {path}: {e.strerror or e}; choose a writable folder with free space"
        ) from e


def read_workload(path: str | os.PathLike[str]) -> list[WorkloadRecord]:
    """Read and validate a workload JSONL file.

    Every line must be one record object with the documented fields; blank lines are allowed.
    Ids must be unique within the file. Errors name the file and the line number.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError as e:
        raise WorkloadError(
            f"workload file {path} does not exist; build one with "
            "`dwise-predict workload --out DIR`"
        ) from e
    except OSError as e:
        raise WorkloadError(f"cannot read workload file {path}: {e.strerror or e}") from e
    records: list[WorkloadRecord] = []
    seen: dict[str, int] = {}
    # split on \n only: JSON escapes every other line break, and text may contain U+2028
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise WorkloadError(
                f"{where}: not UTF-8 text ({e.reason}); workload files are UTF-8 JSONL"
            ) from e
        except json.JSONDecodeError as e:
            raise WorkloadError(
                f"{where}: malformed JSON ({e.msg} at column {e.colno}); "
                "the file may be truncated or not a workload file"
            ) from e
        rec = WorkloadRecord.from_json(obj, where)
        if rec.id in seen:
            raise WorkloadError(
                f"{where}: duplicate id {rec.id!r} (first on line {seen[rec.id]}); "
                "ids must be unique within a workload file"
            )
        seen[rec.id] = lineno
        records.append(rec)
    return records
