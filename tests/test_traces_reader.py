"""The core trace reader: schema version, required columns, value checks, clear errors."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dwise_predict import ModelFingerprint, TraceError, activity_matrix, read_traces
from dwise_predict.traces import (
    META_FINGERPRINT,
    META_SCHEMA_VERSION,
    TRACE_SCHEMA,
    TRACE_SCHEMA_VERSION,
    hidden_matrix,
    read_trace_fingerprint,
)

FP = ModelFingerprint(model_id="m", block_size=4, threshold=0.9, hidden_size=3)


def _row(i: int, rounds: list[int]) -> dict:
    return {
        "schema_version": TRACE_SCHEMA_VERSION,
        "request_id": f"r{i}",
        "category": "chat",
        "source": "test",
        "prompt": "hi there",
        "prompt_sha256": "x",
        "prompt_tokens": 9,
        "word_count": 2,
        "newline_count": 0,
        "digit_permille": 0,
        "symbol_permille": 0,
        "question_marks": 0,
        "prompt_blocks": 3,
        "output_budget": 16,
        "block_size": 4,
        "decoding": "low_confidence",
        "threshold": 0.9,
        "max_steps_per_block": 4,
        "seed": 0,
        "output_tokens": 4 * len(rounds),
        "output_text": "....",
        "output_blocks": len(rounds),
        "rounds_per_block": rounds,
        "total_rounds": sum(rounds),
        "finished_eos": True,
        "hit_budget": False,
        "first_round_hidden": [0.1 * i, 0.2, 0.3],
        "round_wall_ms": [1.0] * (3 + sum(rounds)),
        "model_id": "m",
        "model_revision": None,
        "model_dtype": "float32",
        "mask_token_id": 1,
        "hidden_size": 3,
    }


def _write(path, rows, version=TRACE_SCHEMA_VERSION, schema=TRACE_SCHEMA):
    table = pa.Table.from_pylist(rows, schema=schema)
    meta = {META_SCHEMA_VERSION: str(version).encode(), META_FINGERPRINT: FP.to_json().encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


def test_reads_a_folder_of_shards_and_its_fingerprint(tmp_path):
    _write(tmp_path / "shard-00000.parquet", [_row(0, [1, 4]), _row(1, [2])])
    _write(tmp_path / "shard-00001.parquet", [_row(2, [3, 3, 1])])
    t = read_traces(tmp_path)
    assert t.num_rows == 3
    assert t.column("total_rounds").to_pylist() == [5, 2, 7]
    assert hidden_matrix(t).shape == (3, 3)
    assert read_trace_fingerprint(tmp_path) == FP


def test_newer_schema_and_missing_columns_are_refused(tmp_path):
    _write(tmp_path / "a.parquet", [_row(0, [1])], version=TRACE_SCHEMA_VERSION + 1)
    with pytest.raises(TraceError, match="upgrade dwise-predict"):
        read_traces(tmp_path / "a.parquet")
    slim = pa.schema([f for f in TRACE_SCHEMA if f.name != "total_rounds"])
    rows = [{k: v for k, v in _row(0, [1]).items() if k != "total_rounds"}]
    _write(tmp_path / "b.parquet", rows, schema=slim)
    with pytest.raises(TraceError, match="total_rounds"):
        read_traces(tmp_path / "b.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "c.parquet")
    with pytest.raises(TraceError, match="not a dwise-predict trace"):
        read_traces(tmp_path / "c.parquet")
    (tmp_path / "d.parquet").write_bytes(b"garbage")
    with pytest.raises(TraceError, match="corrupt"):
        read_traces(tmp_path / "d.parquet")


def test_inconsistent_rounds_duplicates_and_nan_are_refused(tmp_path):
    bad = _row(0, [1, 2])
    bad["total_rounds"] = 4
    _write(tmp_path / "a.parquet", [bad])
    with pytest.raises(TraceError, match="inconsistent rounds"):
        read_traces(tmp_path / "a.parquet")
    other = _row(0, [2])
    other["prompt_sha256"] = "y"
    _write(tmp_path / "b.parquet", [_row(0, [1]), other])
    with pytest.raises(TraceError, match="'r0' was traced for two different prompts"):
        read_traces(tmp_path / "b.parquet")
    nan = _row(0, [1])
    nan["first_round_hidden"] = [float("nan"), 0.0, 0.0]
    _write(tmp_path / "c.parquet", [nan])
    with pytest.raises(TraceError, match="NaN"):
        read_traces(tmp_path / "c.parquet")


def test_a_request_traced_by_two_writers_is_read_once(tmp_path, caplog):
    _write(tmp_path / "shard-a-00000.parquet", [_row(0, [1, 4]), _row(1, [2])])
    _write(tmp_path / "shard-b-00000.parquet", [_row(2, [3]), _row(1, [4])])  # r1 again
    with caplog.at_level("WARNING", "dwise_predict"):
        t = read_traces(tmp_path, columns=["total_rounds"])
    assert t.column_names == ["total_rounds"]
    assert t.column("total_rounds").to_pylist() == [5, 2, 3]  # r1: the copy in shard-a
    assert "1 request(s) were traced by more than one writer" in caplog.text
    assert read_traces(tmp_path).column("request_id").to_pylist() == ["r0", "r1", "r2"]


def test_activity_matrix_follows_rounds_per_block():
    a = activity_matrix([1, 4, 2], max_steps=4, n_blocks=4)
    assert a.tolist() == [[1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]]
    assert int(a.sum()) == 7
    with pytest.raises(TraceError, match=r"\[1, 4\]"):
        activity_matrix([5], max_steps=4)
    np.testing.assert_array_equal(activity_matrix([], 4, 1), np.zeros((1, 4)))
    json.dumps(FP.to_dict())


def _editing_row(i: int, rounds: list[int], steps: int = 21) -> dict:
    """A JointThreshold row: block 4 + 16 post-edit steps + 1 finishing step = S of 21."""
    row = _row(i, rounds)
    row.update(decoding="joint_threshold", threshold=0.5, max_steps_per_block=steps)
    return row


def test_rounds_beyond_block_size_read_back_as_an_activity_matrix_of_width_s(tmp_path):
    _write(tmp_path / "jt.parquet", [_editing_row(0, [7, 2, 21]), _editing_row(1, [5])])
    t = read_traces(tmp_path / "jt.parquet")
    row = t.slice(0, 1).to_pylist()[0]
    assert row["block_size"] == 4 and row["max_steps_per_block"] == 21
    a = activity_matrix(row["rounds_per_block"], row["max_steps_per_block"])
    assert a.shape == (3, 21)
    assert a.sum(axis=1).tolist() == [7, 2, 21] and int(a.sum()) == row["total_rounds"] == 30
    with pytest.raises(TraceError, match=r"\[1, 4\]"):  # block_size is not the bound any more
        activity_matrix(row["rounds_per_block"], row["block_size"])
    _write(tmp_path / "over.parquet", [_editing_row(0, [3]), _editing_row(1, [2, 22])])
    with pytest.raises(
        TraceError, match=r"request #1 .*rounds_per_block=\[2, 22\].*max_steps_per_block=21"
    ):
        read_traces(tmp_path / "over.parquet")


def test_a_version_1_trace_still_reads_with_s_equal_to_block_size(tmp_path):
    v1 = pa.schema([f for f in TRACE_SCHEMA if f.name != "max_steps_per_block"])
    rows = [
        {k: v for k, v in _row(i, r).items() if k != "max_steps_per_block"}
        for i, r in enumerate([[1, 4], [2]])
    ]
    for r in rows:
        r["schema_version"] = 1
    _write(tmp_path / "shard-00000.parquet", rows, version=1, schema=v1)
    t = read_traces(tmp_path)
    assert t.column("max_steps_per_block").to_pylist() == [4, 4]
    assert t.column("schema_version").to_pylist() == [TRACE_SCHEMA_VERSION] * 2
    assert t.schema.remove_metadata().equals(TRACE_SCHEMA)
    some = read_traces(tmp_path, columns=["request_id", "max_steps_per_block"], validate=False)
    assert some.column_names == ["request_id", "max_steps_per_block"]
    assert some.column("max_steps_per_block").to_pylist() == [4, 4]
    bad = [{k: v for k, v in _row(0, [5]).items() if k != "max_steps_per_block"}]
    _write(tmp_path / "bad.parquet", bad, version=1, schema=v1)  # v1 never allowed > block_size
    with pytest.raises(TraceError, match="block_size=4|max_steps_per_block=4"):
        read_traces(tmp_path / "bad.parquet")


def test_validation_names_the_first_bad_request_among_many(tmp_path):
    rows = [_row(i, [1 + i % 4, 2]) for i in range(500)]
    rows[321]["rounds_per_block"] = []
    rows[321]["total_rounds"] = 0
    _write(tmp_path / "a.parquet", rows)
    with pytest.raises(TraceError, match=r"request #321 .*rounds_per_block=\[\]"):
        read_traces(tmp_path / "a.parquet")
    rows[321] = _row(321, [0, 3])
    _write(tmp_path / "b.parquet", rows)
    with pytest.raises(TraceError, match=r"request #321"):
        read_traces(tmp_path / "b.parquet")


def test_a_version_2_trace_reads_with_its_lexical_counts_counted_from_the_prompt(tmp_path):
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.streaming import ARRAY_COLUMNS, ParquetSource

    from dwise_predict.features import LEXICAL_FEATURES, lexical_features

    v2 = pa.schema([f for f in TRACE_SCHEMA if f.name not in LEXICAL_FEATURES])
    rows = [{k: v for k, v in _row(i, [2]).items() if k not in LEXICAL_FEATURES} for i in (0, 1)]
    rows[0]["prompt"] = "What is 12 + 30?"
    for r in rows:
        r["schema_version"] = 2
    _write(tmp_path / "shard-00000.parquet", rows, version=2, schema=v2)
    t = read_traces(tmp_path)
    assert t.schema.remove_metadata().equals(TRACE_SCHEMA)
    got = [tuple(t.column(c)[0].as_py() for c in LEXICAL_FEATURES)]
    assert got == [lexical_features("What is 12 + 30?")]
    some = read_traces(tmp_path, columns=["request_id", "question_marks"], validate=False)
    assert some.column_names == ["request_id", "question_marks"]
    assert some.column("question_marks").to_pylist() == [1, 0]  # "hi there" has none
    # streaming reads derive them too (the prompt is read only to count them)
    source = ParquetSource(tmp_path)
    table = source.read_columns([c for c in ARRAY_COLUMNS if c != "first_round_hidden"])
    assert "prompt" not in table.column_names
    assert table.column("digit_permille").to_pylist() == t.column("digit_permille").to_pylist()
    assert trace_arrays(table).lexical is not None
    # a v2 prompt redacted has no counts to derive: null, and no lexical features
    rows[1]["prompt"] = None
    _write(tmp_path / "shard-00000.parquet", rows, version=2, schema=v2)
    redacted = read_traces(tmp_path)
    assert redacted.column("digit_permille").to_pylist()[1] is None
    assert trace_arrays(redacted).lexical is None
