"""Profiling a real (tiny, random) tiny-bd one request at a time, and re-profiling a bundle."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from _tracing_helpers import make_tiny_bd, one_torch_thread  # noqa: F401 (autouse fixture)
from dwise_predict.tracing.adapters.tiny_bd import load_tiny_bd
from dwise_predict.tracing.engine import DecodeConfig, DecodeRequest, decode
from dwise_predict.trainers.cost_profile import (
    SPEED_EXPONENTS,
    planted_paper_profile,
    synthetic_requests,
)
from dwise_predict.trainers.profile_traces import read_profile_traces, write_profile_traces

import dwise_predict
from dwise_predict.cli import main
from dwise_predict.cost import load_cost_profile
from dwise_predict.errors import FingerprintMismatchError

BS = 8
PROMPTS = [f"question {i}: " + "word " * (3 * i) for i in range(24)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_bd(tmp_path_factory.mktemp("m") / "tbd", block_size=BS)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    f = tmp_path_factory.mktemp("w") / "train.jsonl"
    f.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"r{i}",
                    "category": "chat",
                    "source": "test",
                    "prompt": p,
                    "reference": None,
                    "meta": {},
                }
            )
            + "\n"
            for i, p in enumerate(PROMPTS)
        )
    )
    return f


def test_split_commit_decodes_the_same_and_times_every_refresh(model_dir):
    adapter = load_tiny_bd(model_dir)
    reqs = [DecodeRequest(f"r{i}", adapter.encode_prompt(p)) for i, p in enumerate(PROMPTS[:8])]
    cfg = DecodeConfig(block_size=BS, threshold=0.9, max_new_tokens=24)
    fused = {r.request_id: r for r in decode(adapter, reqs, cfg, batch_size=1)}
    split = {r.request_id: r for r in decode(adapter, reqs, cfg, batch_size=1, split_commit=True)}
    for rid, a in fused.items():
        b = split[rid]
        assert b.output_ids == a.output_ids and b.rounds_per_block == a.rounds_per_block
        assert len(b.refresh_wall_ms) == b.output_blocks  # the last block is committed too
        assert all(w > 0 for w in b.refresh_wall_ms)
        assert a.refresh_wall_ms == []
        assert len(b.round_wall_ms) == b.prompt_blocks + b.total_rounds


def test_profile_cli_measures_fits_and_writes_nothing_on_bad_input(
    model_dir, workload, tmp_path, capsys
):
    out = tmp_path / "prof"
    args = [
        "profile",
        "--model",
        str(model_dir),
        "--workload",
        str(workload),
        "--out",
        str(out),
        "--max-new-tokens",
        "24",
        "--threshold",
        "0.9",
        "--warmup",
        "1",
        "--clock",
        "cpu",
        "-q",
    ]
    # too few requests to profile: a clear error, and no folder written
    assert main([*args, "--limit", "10"]) == 1
    assert "at least 20" in capsys.readouterr().err
    assert not out.exists()
    # an empty prompt is refused before anything runs
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        workload.read_text()
        + json.dumps(
            {
                "id": "empty",
                "category": "chat",
                "source": "t",
                "prompt": "  ",
                "reference": None,
                "meta": {},
            }
        )
        + "\n"
    )
    bad_args = [a if a != str(workload) else str(bad) for a in args]
    assert main([*bad_args, "--limit", "25"]) == 1
    assert "'prompt' is empty" in capsys.readouterr().err
    assert not out.exists()
    assert main([*args, "--limit", "24"]) == 0
    requests, fingerprint, hardware = read_profile_traces(out)
    assert len(requests) == 24 and fingerprint["block_size"] == BS and "clock=cpu" in hardware
    assert all(r.refresh_ms > 0 and r.denoise_ms > 0 and r.prefill_ms > 0 for r in requests)
    # every request has the speed probe beside it: forwards of one block, so a few ms at most
    assert all(r.probe_ms is not None and 0 < r.probe_ms < 1e3 for r in requests)
    profile = load_cost_profile(out / "cost_profile.json")
    assert (profile.block_size, profile.max_steps) == (BS, BS)
    assert profile.fingerprint["model_id"] == fingerprint["model_id"]
    assert set(profile.cv) == {"r2", "mape", "spearman", "pairwise", "speed_exponent"}
    assert profile.cv["speed_exponent"] in SPEED_EXPONENTS
    # the profile prices the requests it was fitted on in the measured ballpark
    pred = np.array([profile.request_cost(r.rounds_per_block, r.prompt_blocks) for r in requests])
    true = np.array([r.total_ms for r in requests])
    assert np.median(np.abs(pred - true) / true) < 0.5


def _hashes(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture()
def bundle_copy(tmp_path):
    src = dwise_predict.load_bundle("tiny-bd").path
    dst = tmp_path / "bundle"
    shutil.copytree(src, dst)
    return dst


def _profile_traces(tmp_path, fingerprint, n=60):
    planted = planted_paper_profile(n_blocks=8)
    reqs = synthetic_requests(planted, n, seed=4)
    return write_profile_traces(
        tmp_path / "t",
        reqs,
        [f"r{i}" for i in range(n)],
        [32 * r.prompt_blocks for r in reqs],
        [[1.0] * sum(r.rounds_per_block) for r in reqs],
        fingerprint,
        "hw-B",
    )


def test_reprofiling_a_bundle_changes_only_its_cost_profile(bundle_copy, tmp_path):
    before = _hashes(bundle_copy)
    fp = dwise_predict.load_bundle(bundle_copy).fingerprint.to_dict()
    traces = _profile_traces(tmp_path, fp)
    assert main(["profile", "--bundle", str(bundle_copy), "--traces", str(traces), "-q"]) == 0
    after = _hashes(bundle_copy)
    changed = {k for k in after if before.get(k) != after[k]}
    assert changed == {"manifest.json", "cost_profile.json", "README.md"}
    b = dwise_predict.load_bundle(bundle_copy)  # every hash verifies
    assert b.cost_profile is not None and b.cost_profile.hardware == "hw-B"
    assert b.manifest["predictors"]["cost_profile"]["revision"] == 1
    assert b.manifest["files"]["cost_profile.json"]["sha256"] == after["cost_profile.json"]
    # a second deployment: a new revision, predictor files still byte-identical
    traces2 = _profile_traces(tmp_path / "2", fp, n=40)
    assert main(["profile", "--bundle", str(bundle_copy), "--traces", str(traces2), "-q"]) == 0
    b2 = dwise_predict.load_bundle(bundle_copy)
    assert b2.manifest["predictors"]["cost_profile"]["revision"] == 2
    assert "cost profile rev 2" in (bundle_copy / "README.md").read_text()
    assert b2.predict_admission(["hello"]) == pytest.approx(b.predict_admission(["hello"]))
    again = _hashes(bundle_copy)
    assert {k for k in again if before.get(k) != again[k]} == changed


def test_a_profile_for_another_decoder_is_refused_and_the_bundle_left_alone(
    bundle_copy, tmp_path, capsys
):
    before = _hashes(bundle_copy)
    fp = dwise_predict.load_bundle(bundle_copy).fingerprint.to_dict()
    traces = _profile_traces(tmp_path, {**fp, "block_size": 4 * fp["block_size"]})
    assert main(["profile", "--bundle", str(bundle_copy), "--traces", str(traces)]) == 1
    assert "block_size" in capsys.readouterr().err
    assert _hashes(bundle_copy) == before
    b = dwise_predict.load_bundle(bundle_copy)
    with pytest.raises(FingerprintMismatchError):
        b.with_cost_profile(load_cost_profile("paper-llada2.0-mini"))  # LLaDA2.0-mini, not tiny-bd
    own = b.cost_profile  # the zoo bundle's measured tiny-bd profile
    priced = b.with_cost_profile(load_cost_profile("paper-llada2.0-mini"), allow_mismatch=True)
    assert priced.cost_profile is not None and priced.cost_profile is not own
    assert priced.cost_profile.alpha_ms != own.alpha_ms
    assert b.cost_profile is own  # re-pricing returns a new bundle; this one is unchanged


def test_profile_clock_defaults_to_one_threads_cpu_time_on_a_cpu_and_wall_on_a_gpu():
    from types import SimpleNamespace

    from dwise_predict.cli.profile import r2_warning, resolve_clock
    from dwise_predict.errors import ConfigError

    assert resolve_clock("auto", "cpu", None) == ("cpu", 1)
    assert resolve_clock("auto", "cpu", 4) == ("cpu", 4)  # an explicit --threads stands
    assert resolve_clock("auto", "cuda:0", None) == ("wall", None)
    assert resolve_clock("wall", "cpu", None) == ("wall", None)
    with pytest.raises(ConfigError, match="--clock wall"):
        resolve_clock("cpu", "cuda", None)
    poor, good = SimpleNamespace(cv={"r2": 0.80}), SimpleNamespace(cv={"r2": 0.996})
    assert r2_warning(good, "cpu") is None
    assert "0.800" in r2_warning(poor, "wall") and "--clock cpu --threads 1" in r2_warning(
        poor, "wall"
    )
    assert "quieter machine" in r2_warning(poor, "cpu")


def test_speed_probes_are_timed_between_requests_and_can_be_turned_off(model_dir):
    from dwise_predict.tracing.profile import profile_workload

    adapter = load_tiny_bd(model_dir)
    records = [
        {"id": f"r{i}", "category": "chat", "source": "t", "prompt": p}
        for i, p in enumerate(PROMPTS[:4])
    ]
    kw = dict(threshold=0.9, block_size=BS, max_new_tokens=16, warmup=1, clock="cpu")
    probed = profile_workload(adapter, records, **kw)
    plain = profile_workload(adapter, records, probe_reps=0, **kw)
    assert all(r.probe_ms is not None and r.probe_ms > 0 for r in probed.requests)
    assert all(r.probe_ms is None for r in plain.requests)
    # the probe changes nothing the model decodes
    assert [r.rounds_per_block for r in probed.requests] == [
        r.rounds_per_block for r in plain.requests
    ]


def test_profile_traces_from_before_probes_still_fit_as_measured(tmp_path):
    """A profile.parquet written before the probe column existed reads with no probes, and
    refits with the times as measured (no speed correction), naming none in ``cv``."""
    import pyarrow.parquet as pq

    planted = planted_paper_profile(n_blocks=8)
    reqs = synthetic_requests(planted, 40, seed=4)
    probed = [dataclasses.replace(r, probe_ms=2.0 + 0.01 * i) for i, r in enumerate(reqs)]
    new = write_profile_traces(
        tmp_path / "new",
        probed,
        [f"r{i}" for i in range(40)],
        [32 * r.prompt_blocks for r in reqs],
        [[1.0] * sum(r.rounds_per_block) for r in reqs],
        {"model_id": "m", "block_size": 32},
        "hw",
    )
    back, _, _ = read_profile_traces(new)
    assert [r.probe_ms for r in back] == [r.probe_ms for r in probed]
    table = pq.read_table(new)
    old = tmp_path / "old" / "profile.parquet"
    old.parent.mkdir()
    pq.write_table(table.drop(["probe_ms"]).replace_schema_metadata(table.schema.metadata), old)
    requests, fingerprint, _ = read_profile_traces(old)
    assert fingerprint["model_id"] == "m" and all(r.probe_ms is None for r in requests)
    out = tmp_path / "refit"
    assert main(["profile", "--traces", str(old), "--out", str(out), "-q"]) == 0
    cv = load_cost_profile(out).cv
    assert cv is not None and "speed_exponent" not in cv and cv["mape"] < 0.05
