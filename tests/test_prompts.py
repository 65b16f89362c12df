"""A user's own prompt files: formats, defaults, other column names, chat turns, clear errors."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dwise_predict.errors import WorkloadError
from dwise_predict.prompts import PromptColumns, PromptRecord, prompt_text, read_prompts


def test_jsonl_needs_only_a_prompt_and_keeps_what_is_given(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        '{"prompt": "a"}\n'
        '{"prompt": "b", "id": 7, "category": "code", "source": "mine"}\n'
        '{"prompt": "c", "id": "", "category": null}\n'
    )
    assert read_prompts(f) == [
        PromptRecord("1", "unknown", "p.jsonl", "a"),
        PromptRecord("7", "code", "mine", "b"),
        PromptRecord("3", "unknown", "p.jsonl", "c"),
    ]


def test_csv_with_other_columns_and_a_chat_cell(tmp_path):
    f = tmp_path / "p.csv"
    chat = json.dumps(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
            }
        ]
    )
    f.write_text('q,kind\n"two\nlines",math\n' + '"' + chat.replace('"', '""') + '",\n')
    recs = read_prompts(f, PromptColumns(prompt="q", category="kind"))
    assert recs == [
        PromptRecord("3", "math", "p.csv", "two\nlines"),
        PromptRecord("4", "unknown", "p.csv", "hi there"),
    ]


def test_parquet_rows_are_numbered_from_one(tmp_path):
    pq.write_table(pa.table({"prompt": ["x", "y"]}), tmp_path / "p.parquet")
    assert [r.id for r in read_prompts(tmp_path / "p.parquet")] == ["1", "2"]


def test_conversations_become_one_prompt_text():
    assert prompt_text([{"role": "user", "content": "hi"}]) == "hi"  # same as plain "hi"
    two = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert prompt_text(two) == "system: be brief\n\nuser: hi"


@pytest.mark.parametrize(
    "lines, match",
    [
        (
            ['{"prompt": "a"}', '{"text": "b"}'],
            r"p\.jsonl line 2: no field 'prompt' \(fields: text\)",
        ),
        (['{"prompt": "a"}', '{"prompt": "  "}'], r"line 2: field 'prompt' is empty"),
        (['{"prompt": 3}'], r"line 1: field 'prompt' must be text or a list of \{role, content\}"),
        (['{"prompt": []}'], r"line 1: field 'prompt' is an empty conversation"),
        (['{"prompt": [{"content": "x"}]}'], r"line 1: field 'prompt' turn 0 must be an object"),
        (['{"prompt": [{"role": "user", "content": [{"type": "image"}]}]}'], r"turn 0 has no text"),
        (['{"prompt": null}'], r"line 1: field 'prompt' is missing or null"),
        (
            ['{"prompt": "a", "id": "2"}', '{"prompt": "b"}'],
            r"line 2: id '2' is also the id of line 1",
        ),
        (['{"prompt": "a"', ""], r"line 1: not valid JSON"),
        (['["a"]'], r"line 1: expected an object"),
    ],
)
def test_bad_records_are_refused_naming_the_line_and_field(tmp_path, lines, match):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(WorkloadError, match=match):
        read_prompts(f)


def test_unknown_suffix_missing_file_and_empty_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"suffix '\.txt'; name it with one of \.jsonl"):
        read_prompts(tmp_path / "p.txt")
    with pytest.raises(WorkloadError, match="does not exist"):
        read_prompts(tmp_path / "p.jsonl")
    (tmp_path / "e.csv").write_text("prompt\n")
    with pytest.raises(WorkloadError, match="holds no records"):
        read_prompts(tmp_path / "e.csv")


def test_jsonl_prompts_may_hold_unicode_line_separators(tmp_path):
    """JSON strings may hold U+2028, U+0085 and \\r raw; only "\\n" ends a JSONL line."""
    import json

    from dwise_predict.prompts import read_prompts

    prompts = ["one\u2028two", "three\x85four", "five\rsix"]
    path = tmp_path / "p.jsonl"
    path.write_text(
        "\r\n".join(json.dumps({"prompt": p}, ensure_ascii=False) for p in prompts) + "\r\n",
        encoding="utf-8",
    )
    assert [r.prompt for r in read_prompts(path)] == prompts
