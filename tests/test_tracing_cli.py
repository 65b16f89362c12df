"""`dwise-predict trace` end to end: Parquet shards readable everywhere, reproducible, resumable,
safe."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from _tracing_helpers import make_diffusion_gemma, make_tiny_bd, one_torch_thread, workload_records  # noqa: F401 (autouse fixture)
from dwise_predict.tracing.adapters import load_adapter
from dwise_predict.tracing.runner import trace_workload

from dwise_predict.cli import main
from dwise_predict.features import lexical_features
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.traces import (
    META_FINGERPRINT,
    TRACE_SCHEMA,
    activity_matrix,
    hidden_matrix,
    read_trace_fingerprint,
    read_traces,
)

ARGS = [
    "--block-size",
    "8",
    "--max-new-tokens",
    "16",
    "--threshold",
    "0.5",
    "--batch-size",
    "4",
    "--shard-size",
    "5",
    "-q",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=8)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "eval.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in workload_records()))
    return path


@pytest.fixture(scope="module")
def traced(tmp_path_factory, model_dir, workload):
    out = tmp_path_factory.mktemp("t") / "traces"
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(workload),
                "--out",
                str(out),
                *ARGS,
            ]
        )
        == 0
    )
    return out


def _content(path):
    """Trace rows sorted by id, without the one column that measures time."""
    t = read_traces(path).drop_columns(["round_wall_ms"]).to_pylist()
    return sorted(t, key=lambda r: r["request_id"])


def test_trace_files_follow_schema_and_are_read_everywhere(traced, workload):
    shards = sorted(p.name for p in traced.iterdir())
    writer = shards[0][len("shard-") : -len("-00000.parquet")]  # <host>-<pid>-<random>
    assert shards == [f"shard-{writer}-{i:05d}.parquet" for i in range(3)]  # 5 + 5 + 2
    table = read_traces(traced)
    assert table.num_rows == 12 and table.schema.remove_metadata().equals(TRACE_SCHEMA)
    fp = read_trace_fingerprint(traced)
    assert (fp.block_size, fp.threshold, fp.decoding, fp.max_new_tokens, fp.mask_token_id) == (
        8,
        0.5,
        "low_confidence",
        16,
        1,
    )
    assert (
        ModelFingerprint.from_dict(
            json.loads(pq.read_schema(traced / shards[0]).metadata[META_FINGERPRINT])
        )
        == fp
    )
    rows = table.to_pylist()
    prompts = {r["id"]: r["prompt"] for r in workload_records()}
    for r in rows:
        assert r["prompt"] == prompts[r["request_id"]]
        assert r["word_count"] == len(r["prompt"].split()) and r["newline_count"] == r[
            "prompt"
        ].count("\n")
        lexical = (r["digit_permille"], r["symbol_permille"], r["question_marks"])
        assert lexical == lexical_features(r["prompt"])
        assert r["prompt_blocks"] == r["prompt_tokens"] // 8  # tiny-bd's default: absolute
        assert sum(r["rounds_per_block"]) == r["total_rounds"] and r["output_blocks"] == len(
            r["rounds_per_block"]
        )
        assert len(r["round_wall_ms"]) == r["prompt_blocks"] + r["total_rounds"]
        assert r["output_tokens"] <= 16 and r["finished_eos"] != r["hit_budget"]
        assert activity_matrix(r["rounds_per_block"], 8).sum() == r["total_rounds"]
    assert hidden_matrix(table).shape == (12, 64)

    import duckdb
    import pandas as pd
    import polars as pl

    df = pd.read_parquet(traced)
    assert len(df) == 12 and set(df["request_id"]) == set(prompts)
    pdf = pl.read_parquet(traced / "*.parquet")
    assert pdf.height == 12 and pdf["total_rounds"].sum() == df["total_rounds"].sum()
    [(n, rounds)] = duckdb.sql(
        f"SELECT count(*), sum(total_rounds) FROM '{traced}/*.parquet'"
    ).fetchall()
    assert (n, rounds) == (12, df["total_rounds"].sum())
    lens = duckdb.sql(
        f"SELECT DISTINCT len(first_round_hidden) FROM '{traced}/*.parquet'"
    ).fetchall()
    assert lens == [(64,)]


def test_prompt_tokens_equal_the_admission_featurizer(traced, model_dir):
    ad = load_adapter(model_dir)
    for r in read_traces(traced).to_pylist():
        assert r["prompt_tokens"] == ad.featurizer.token_count(r["prompt"])


def test_same_seed_gives_identical_traces(traced, tmp_path, model_dir, workload):
    again = tmp_path / "again"
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(workload),
                "--out",
                str(again),
                *ARGS,
            ]
        )
        == 0
    )
    assert _content(again) == _content(traced)
    batch1 = tmp_path / "b1"  # batch composition does not change any request's trace either
    args = [a if a != "4" else "1" for a in ARGS]
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(workload),
                "--out",
                str(batch1),
                *args,
            ]
        )
        == 0
    )
    _assert_same_up_to_float(_content(batch1), _content(traced))


def _assert_same_up_to_float(rows_a, rows_b):
    """Identical rows, except hidden vectors equal within float tolerance (batch shapes differ)."""
    assert len(rows_a) == len(rows_b)
    for a, b in zip(rows_a, rows_b):
        a, b = dict(a), dict(b)
        ha, hb = a.pop("first_round_hidden"), b.pop("first_round_hidden")
        assert a == b
        np.testing.assert_allclose(ha, hb, rtol=1e-4, atol=1e-5)


class _InterruptAfter:
    """A progress bar whose user presses Ctrl-C after ``n`` finished requests."""

    def __init__(self, n):
        self.n, self.seen = n, 0

    def update(self, k=1):
        self.seen += k
        if self.seen >= self.n:
            raise KeyboardInterrupt

    def set_postfix(self, **_):
        pass


def test_interrupted_run_leaves_no_partial_file_and_resume_completes(
    traced, tmp_path, model_dir, workload
):
    out = tmp_path / "run"
    records = workload_records()
    ad = load_adapter(model_dir)
    with pytest.raises(KeyboardInterrupt):
        trace_workload(
            ad,
            records,
            out,
            batch_size=4,
            threshold=0.5,
            max_new_tokens=16,
            block_size=8,
            shard_size=5,
            progress=_InterruptAfter(7),
        )
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 2  # 5 rows + the 2 finished before Ctrl-C
    assert read_traces(out).num_rows == 7
    dead = out / ".shard-gone-1-0123abcd-00000.parquet.x.tmp"  # what a SIGKILL mid-write leaves
    dead.write_bytes(b"PAR1 half a file")
    os.utime(dead, (0, 0))  # long ago: its writer is surely gone
    assert read_traces(out).num_rows == 7  # readers never see temp files
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(workload),
                "--out",
                str(out),
                *ARGS,
                "--resume",
            ]
        )
        == 0
    )
    assert len(list(out.iterdir())) == 3  # the stale temp file is gone
    _assert_same_up_to_float(_content(out), _content(traced))


def test_resume_refuses_other_settings(traced, tmp_path, model_dir, workload, capsys):
    other = [a if a != "0.5" else "0.9" for a in ARGS]
    before = {p.name: p.stat().st_mtime_ns for p in traced.iterdir()}
    rc = main(
        [
            "trace",
            "--model",
            str(model_dir),
            "--workload",
            str(workload),
            "--out",
            str(traced),
            *other,
            "--resume",
        ]
    )
    assert rc == 1 and "differs in threshold" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in traced.iterdir()} == before


def _fails(capsys, argv, match):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc != 0 and match in err, err
    return err


def test_bad_inputs_fail_clearly_and_write_nothing(traced, tmp_path, model_dir, workload, capsys):
    out = tmp_path / "out"
    base = ["trace", "--out", str(out), *ARGS]
    before = {p.name: p.stat().st_mtime_ns for p in traced.iterdir()}
    _fails(
        capsys,
        [
            "trace",
            "--model",
            str(model_dir),
            "--workload",
            str(workload),
            "--out",
            str(traced),
            *ARGS,
        ],
        "already holds 3 trace shard(s); pass --resume",
    )
    assert {p.name: p.stat().st_mtime_ns for p in traced.iterdir()} == before
    _fails(
        capsys,
        [*base, "--model", "no-such-model", "--workload", str(workload)],
        "unknown model 'no-such-model'",
    )
    _fails(
        capsys,
        [*base, "--model", str(model_dir), "--workload", str(tmp_path / "nope.jsonl")],
        "does not exist",
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "a", "category": "chat", "source": "x", "prompt": "hi", "reference": null, '
        '"meta": {}}\n{oops\n'
    )
    _fails(
        capsys,
        [*base, "--model", str(model_dir), "--workload", str(bad)],
        "bad.jsonl line 2: not valid JSON",
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("".join(json.dumps(r) + "\n" for r in workload_records(["fine", "   \n "])))
    _fails(
        capsys,
        [*base, "--model", str(model_dir), "--workload", str(empty)],
        "empty.jsonl line 2: field 'prompt' is empty",
    )
    small = make_tiny_bd(tmp_path / "small", block_size=8, max_position=64)
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps(r) + "\n" for r in workload_records(["short", "y" * 80])))
    _fails(
        capsys,
        [*base, "--model", str(small), "--workload", str(long)],
        "exceeds the model's context of 64",
    )
    assert not out.exists()  # nothing half-written by any of them


def test_workload_folder_split(tmp_path, model_dir, capsys):
    wl = tmp_path / "wl"
    wl.mkdir()
    (wl / "eval.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in workload_records(["a", "b"]))
    )
    (wl / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in workload_records(["c", "d", "e"]))
    )
    out = tmp_path / "o"
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(wl),
                "--split",
                "train",
                "--out",
                str(out),
                *ARGS,
                "--limit",
                "2",
            ]
        )
        == 0
    )
    assert sorted(read_traces(out).column("prompt").to_pylist()) == ["c", "d"]


def test_diffusion_gemma_traced_end_to_end_through_the_cli(tmp_path, workload):
    model = make_diffusion_gemma(tmp_path / "dg", canvas_length=8, max_denoising_steps=6)
    out = tmp_path / "dg-traces"
    assert (
        main(
            [
                "trace",
                "--model",
                str(model),
                "--workload",
                str(workload),
                "--out",
                str(out),
                "--max-new-tokens",
                "16",
                "--limit",
                "4",
                "--seed",
                "5",
                "-q",
            ]
        )
        == 0
    )
    t = read_traces(out)
    assert t.num_rows == 4
    fp = read_trace_fingerprint(out)
    assert (
        fp.decoding == "diffusion_gemma_entropy_bound"
        and fp.block_size == 8
        and fp.mask_token_id is None
    )
    for r in t.to_pylist():
        assert r["output_blocks"] == 2 and all(1 <= x <= 6 for x in r["rounds_per_block"])
        assert r["seed"] == 5 and len(r["first_round_hidden"]) == 32
    again = tmp_path / "dg-again"
    assert (
        main(
            [
                "trace",
                "--model",
                str(model),
                "--workload",
                str(workload),
                "--out",
                str(again),
                "--max-new-tokens",
                "16",
                "--limit",
                "4",
                "--seed",
                "5",
                "-q",
            ]
        )
        == 0
    )
    assert _content(again) == _content(out)


def test_bare_prompt_jsonl_traces_without_edits(tmp_path, model_dir):
    """Only `prompt` is required: the id is the line number and the category `unknown`."""
    bare = tmp_path / "my.jsonl"
    bare.write_text(
        '{"prompt": "hello"}\n\n{"prompt": "what is 2+2?"}\n'
        '{"prompt": [{"role": "user", "content": "tell me a story"}]}\n'
    )
    out = tmp_path / "o"
    assert (
        main(
            ["trace", "--model", str(model_dir), "--workload", str(bare), "--out", str(out), *ARGS]
        )
        == 0
    )
    rows = sorted(read_traces(out).to_pylist(), key=lambda r: int(r["request_id"]))
    assert [(r["request_id"], r["category"], r["source"], r["prompt"]) for r in rows] == [
        ("1", "unknown", "my.jsonl", "hello"),
        ("3", "unknown", "my.jsonl", "what is 2+2?"),
        ("4", "unknown", "my.jsonl", "tell me a story"),
    ]
    assert all(r["total_rounds"] >= r["output_blocks"] >= 1 for r in rows)


def test_parquet_with_other_column_names_traces_without_edits(tmp_path, model_dir):
    import pyarrow as pa

    turns = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    table = pa.table(
        {
            "uid": pa.array([101, 102, 103], pa.int64()),
            "intent": ["math", None, "chat"],
            "conversation": pa.array(
                [
                    [{"role": "user", "content": "what is 2+2?"}],
                    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                    [{"role": "user", "content": "a haiku, please"}],
                ],
                turns,
            ),
        }
    )
    pq.write_table(table, tmp_path / "traffic.parquet")
    out = tmp_path / "o"
    traffic = str(tmp_path / "traffic.parquet")
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                traffic,
                "--prompt-column",
                "conversation",
                "--id-column",
                "uid",
                "--category-column",
                "intent",
                "--out",
                str(out),
                *ARGS,
            ]
        )
        == 0
    )
    rows = {r["request_id"]: r for r in read_traces(out).to_pylist()}
    assert {k: (r["category"], r["prompt"]) for k, r in rows.items()} == {
        "101": ("math", "what is 2+2?"),
        "102": ("unknown", "system: be brief\n\nuser: hi"),
        "103": ("chat", "a haiku, please"),
    }
    assert rows["102"]["newline_count"] == 2 and rows["102"]["word_count"] == 5


def test_joint_threshold_through_the_cli_records_s_and_reads_back(tmp_path, model_dir, workload):
    out = tmp_path / "jt"
    args = [a for a in ARGS if a != "0.5"]
    args.remove("--threshold")
    assert (
        main(
            [
                "trace",
                "--model",
                str(model_dir),
                "--workload",
                str(workload),
                "--out",
                str(out),
                *args,
                "--decoding",
                "joint_threshold",
                "--limit",
                "6",
            ]
        )
        == 0
    )
    fp = read_trace_fingerprint(out)
    assert (fp.decoding, fp.threshold, fp.max_steps_per_block) == ("joint_threshold", 0.5, 25)
    assert fp.extra["edit_threshold"] == 0.0 and fp.extra["max_post_edit_steps"] == 16
    t = read_traces(out)
    assert set(t.column("max_steps_per_block").to_pylist()) == {25}
    for r in t.to_pylist():
        a = activity_matrix(r["rounds_per_block"], r["max_steps_per_block"])
        assert a.shape == (r["output_blocks"], 25) and int(a.sum()) == r["total_rounds"]
