"""The DWS surface predictor: training on a tiny random BERT, ONNX export, the light core.

One module-scoped training run (a 1-layer, 32-wide random BERT with the real all-MiniLM-L6-v2
tokenizer, on synthetic traces with block size 8 and a 32-token budget: N = 4, S = 8) serves
every test, so the file costs one short training plus one export.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import _dws_helpers  # noqa: E402
from synthetic_traces import make_traces, synthetic_featurizer  # noqa: E402

import dwise_predict  # noqa: E402
from dwise_predict.cost import CostProfile, load_cost_profile  # noqa: E402
from dwise_predict.errors import (  # noqa: E402
    BundleError,
    BundleIntegrityError,
    ConfigError,
    FingerprintMismatchError,
    PredictorInputError,
    TraceError,
    TrainingError,
)
from dwise_predict.predictors.dws import Truncation, surface_from_logits  # noqa: E402

BS, BUDGET = 8, 32  # N = 4 output blocks, S = 8 steps


def planted_profile(block_size: int = BS, model_id: str = "synthetic/planted-bd") -> CostProfile:
    fingerprint = {
        "model_id": model_id,
        "block_size": block_size,
        "decoding": "low_confidence",
        "threshold": 0.9,
    }
    return _dws_helpers.planted_profile(block_size, BUDGET, fingerprint)


def labelled_traces(n: int, seed: int):
    return _dws_helpers.labelled_traces(n, seed, block_size=BS, output_budget=BUDGET)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _dws_helpers.save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="module")
def trained(tiny_encoder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from dwise_predict.trainers.dws import DWSTrainConfig
    from dwise_predict.trainers.pipeline import train_bundle

    out = tmp_path_factory.mktemp("dws") / "bundle"
    cfg = DWSTrainConfig(
        encoder_path=str(tiny_encoder),
        stage_a_epochs=2,
        stage_b_epochs=30,
        baseline_epochs=15,
        window=48,
        head_tokens=16,
        num_threads=1,
        encoder_lr=1e-3,
    )
    traces = labelled_traces(128, seed=0)
    train_bundle(
        traces,
        out,
        only="admission,dws",
        cost_profile=planted_profile(),
        featurizer=synthetic_featurizer(),
        configs={"dws": cfg},
    )
    return {"path": out, "eval": labelled_traces(96, seed=1), "train": traces, "config": cfg}


def test_surface_keeps_the_decoding_constraints(trained: dict) -> None:
    bundle = dwise_predict.load_bundle(trained["path"])
    prompts = trained["eval"].column("prompt").to_pylist()[:40]
    D = bundle.predict_surface(prompts)
    assert D.shape == (40, BUDGET // BS, BS) and D.dtype == np.float32
    assert np.all(D >= 0) and np.all(D <= 1 + 1e-6)
    np.testing.assert_allclose(D[:, 0, 0], 1.0, atol=1e-5)  # every request runs block 0, step 0
    # within a block, step s+1 needs step s; block b+1 is reached only if block b was
    assert np.all(np.diff(D, axis=2) <= 1e-6) and np.all(np.diff(D[:, :, 0], axis=1) <= 1e-6)
    # batching and order do not change a prediction (INT8 quantizes activations per batch:
    # a few hundredths at most)
    tol = 1e-5 if bundle.dws.precision == "fp32" else 0.05
    np.testing.assert_allclose(bundle.predict_surface(prompts[::-1])[::-1], D, atol=tol)
    np.testing.assert_allclose(bundle.predict_surface(prompts[3]), D[3:4], atol=tol)


def test_numpy_surface_twin_matches_torch() -> None:
    import torch
    from dwise_predict.trainers.dws import surface_torch

    rng = np.random.default_rng(0)
    blocks, steps = rng.normal(size=(5, 4)), rng.normal(size=(5, 4, 8)) * 3
    got = surface_from_logits(blocks, steps)
    want = surface_torch(torch.as_tensor(blocks), torch.as_tensor(steps)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    # one-hot logits give the activity matrix of that request exactly
    sharp = surface_from_logits(
        np.array([[-50.0, 50, -50, -50]]),
        np.tile(np.where(np.arange(8) == 2, 50.0, -50.0), (1, 4, 1)),
    )
    np.testing.assert_allclose(
        sharp[0], np.array([[1, 1, 1, 0, 0, 0, 0, 0]] * 2 + [[0] * 8] * 2), atol=1e-9
    )


def test_predict_cost_prices_the_surface_with_the_profile(trained: dict) -> None:
    bundle = dwise_predict.load_bundle(trained["path"])
    prompts = trained["eval"].column("prompt").to_pylist()[:16]
    profile = planted_profile()
    assert bundle.cost_profile is not None  # the training profile is stored in the bundle
    priced = bundle.with_cost_profile(profile)
    cost = priced.predict_cost(prompts)
    m = priced.prompt_blocks(prompts)
    np.testing.assert_allclose(cost, profile.expected_cost(priced.predict_surface(prompts), m))
    assert np.all(cost > profile.alpha_ms * m)
    # another deployment re-prices the same surface without retraining
    paper = load_cost_profile("paper-llada2.0-mini")
    with pytest.raises(FingerprintMismatchError):
        bundle.with_cost_profile(paper)
    other = bundle.with_cost_profile(paper, allow_mismatch=True).predict_cost(prompts)
    assert not np.allclose(other, cost)
    tokens = np.full(len(prompts), 40)
    np.testing.assert_allclose(priced.prompt_blocks(prompts, tokens), 5)


def test_dws_learns_the_workload_and_beats_a_constant_surface(trained: dict) -> None:
    from dwise_predict.trainers.dws_data import dws_arrays
    from dwise_predict.trainers.dws_eval import evaluate_dws, profile_metrics

    bundle = dwise_predict.load_bundle(trained["path"]).with_cost_profile(planted_profile())
    metrics, surface = evaluate_dws(bundle, trained["eval"])
    assert set(metrics["baselines"]) == {"output_length", "total_steps", "direct_cost"}
    assert set(metrics["profiles"]) == {"bundle", "paper-llada2.0-mini"}
    arrays = dws_arrays(trained["eval"])
    train = dws_arrays(trained["train"])
    constant = np.broadcast_to(train.activity.mean(0), surface.shape)
    flat = profile_metrics(constant, None, arrays, planted_profile(), None)
    # the prompt carries the category, the category the work: the surface must use it
    assert metrics["cost_mae"] < 0.9 * flat["cost_mae"], (metrics["cost_mae"], flat["cost_mae"])
    assert metrics["brier"] < float(((constant - arrays.activity) ** 2).sum(axis=(1, 2)).mean())


def test_manifest_records_the_module_and_the_gate(trained: dict) -> None:
    manifest = json.loads((trained["path"] / "manifest.json").read_text())
    entry = manifest["predictors"]["dws"]
    assert entry["N"] == BUDGET // BS and entry["S"] == BS
    assert entry["truncation"] == {
        "rule": "head+tail",
        "window": 48,
        "head_tokens": 16,
        "max_chars": 16384,
    }
    fp32 = next(e for e in entry["exports"] if e["precision"] == "fp32")
    assert fp32["kept"] and fp32["surface_max_abs_error"] < 1e-4
    int8 = next(e for e in entry["exports"] if e["precision"] == "int8")
    dev = int8["cost_deviation_rel"]  # the gate: mean |cost change| / mean FP32 cost
    assert dev is not None and dev >= 0
    assert int8["kept"] == (
        dev <= 0.01
        and int8["surface_max_abs_error"] <= 0.25
        and int8["latency_ms_per_request"] * 1.05 <= fp32["latency_ms_per_request"]
    )
    for f in entry["files"]:
        assert f in manifest["files"]
    assert "dws" in manifest["training"] and manifest["training"]["dws"]["N"] == BUDGET // BS
    assert "DWS surface 4 x 8" in (trained["path"] / "README.md").read_text()
    # the encoder is named, not located: no path of the training machine in a bundle
    assert entry["encoder"] == trained["config"].encoder_path.rsplit("/", 1)[-1]
    assert "/" not in entry["encoder"]
    assert "cost_profile" in manifest["predictors"]


def test_export_reports_the_train_time_gates_through_export_bundle(
    trained: dict, tmp_path: Path
) -> None:
    """`dwise-predict export` treats DWS as every kind: its exporter (named by the kind)
    reports the gates `train` recorded, and the ONNX files it cannot re-export stay as they
    are, hashed."""
    from dwise_predict.cli import main

    copy = tmp_path / "b"
    shutil.copytree(trained["path"], copy)
    before = (copy / "dws.onnx").read_bytes()
    argv = ["export", str(copy), "--repeats", "2", "--report", str(tmp_path / "r.json")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    entry = json.loads((copy / "manifest.json").read_text())["predictors"]["dws"]
    carried = {c["file"]: c for c in report["carried"]}
    assert set(carried) == {e["file"] for e in entry["exports"]}
    for rec in entry["exports"]:
        c = carried[rec["file"]]
        assert c["predictor"] == "dws" and c["kept"] == rec["kept"]
        assert c["parity"]["max_abs_error"] == rec["surface_max_abs_error"]
        assert c["latency_us"]["probes"]["exported"] == 1e3 * rec["latency_ms_per_request"]
    assert "dws" not in report["not_applicable"]
    assert "admission.onnx" in {c["file"] for c in report["checks"]}
    after = dwise_predict.load_bundle(copy)  # every hash verifies
    assert (copy / "dws.onnx").read_bytes() == before and after.dws is not None
    assert not any(name.startswith("dws") for name in after.manifest["exports"])


def test_tampered_dws_file_is_refused(trained: dict, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(trained["path"], copy)
    with open(copy / "dws.onnx", "r+b") as f:
        f.seek(200)
        f.write(b"\x00\x01\x02")
    with pytest.raises(BundleIntegrityError, match="dws.onnx"):
        dwise_predict.load_bundle(copy)


def test_empty_and_huge_prompts(trained: dict) -> None:
    bundle = dwise_predict.load_bundle(trained["path"])
    huge = "word " * 400_000 + "the question at the end?"
    t = time.perf_counter()
    D = bundle.predict_surface(["", huge, "x"])
    assert time.perf_counter() - t < 5.0
    assert D.shape == (3, BUDGET // BS, BS) and np.all(np.isfinite(D))
    with pytest.raises(PredictorInputError, match="strings"):
        bundle.predict_surface(["ok", None])  # type: ignore[list-item]
    tok = bundle.dws.tokenizer  # head + tail: the end of a long prompt survives truncation
    ids = tok.token_ids([huge])[0]
    assert len(ids) == 48
    assert ids[-3:-1] == tok.token_ids(["end?"])[0][1:-1][-2:]


def test_truncation_rule_keeps_head_and_tail() -> None:
    t = Truncation(window=10, head_tokens=3, max_chars=20)
    assert t.cut_ids(list(range(100))) == [0, 1, 2, 95, 96, 97, 98, 99]
    assert t.cut_ids([1, 2]) == [1, 2]
    assert t.cut_text("a" * 10 + "b" * 30 + "c" * 10) == "a" * 10 + " " + "c" * 10
    with pytest.raises(PredictorInputError):
        Truncation(window=10, head_tokens=9)


def test_predict_cost_runs_without_torch_or_transformers(trained: dict) -> None:
    code = (
        "import sys, json, dwise_predict\n"
        f"b = dwise_predict.load_bundle({str(trained['path'])!r})  # its stored cost profile\n"
        "c = b.predict_cost(['what is 2 + 2?', 'write a long story'])\n"
        "heavy = [m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning') "
        "if m in sys.modules]\n"
        "print(json.dumps({'cost': c.tolist(), 'heavy': heavy}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["heavy"] == [] and len(got["cost"]) == 2 and min(got["cost"]) > 0


def test_bad_training_inputs(tiny_encoder: Path, tmp_path: Path) -> None:
    from dwise_predict.trainers.dws import DWSTrainConfig, train_dws
    from dwise_predict.trainers.dws_bundle import train_dws_module
    from dwise_predict.trainers.dws_data import dws_arrays
    from dwise_predict.trainers.pipeline import train_bundle

    few = make_traces(12, block_size=BS, output_budget=BUDGET, seed=3)
    with pytest.raises(TrainingError, match="too few"):
        train_dws(
            dws_arrays(few), planted_profile(), DWSTrainConfig(encoder_path=str(tiny_encoder))
        )
    with pytest.raises(TraceError, match="steps"):
        dws_arrays(few, max_steps=2)
    with pytest.raises(TrainingError, match="cost profile"):
        train_bundle(few, tmp_path / "x", only="dws")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="block size"):
        train_dws_module(few, planted_profile(block_size=4), tmp_path)
    with pytest.raises(ConfigError):
        DWSTrainConfig(stage_a="everything")


def test_dws_only_bundle_evaluates_and_prices_dws_sjf(
    tiny_encoder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`eval` on a bundle trained with --only dws, and DWS-SJF's score from the bundle; the
    training says which step runs (minutes on a CPU at real sizes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from dwise_predict.trainers.dws import DWSTrainConfig
    from dwise_predict.trainers.pipeline import train_bundle

    from dwise_predict.cli import main
    from dwise_predict.runtime import costs_from_bundle

    cfg = DWSTrainConfig(
        encoder_path=str(tiny_encoder),
        stage_a="none",
        stage_b_epochs=5,
        baseline_epochs=5,
        window=48,
        head_tokens=16,
        num_threads=1,
    )
    out = tmp_path / "bundle"
    with caplog.at_level(logging.INFO, logger="dwise_predict"):
        train_bundle(
            labelled_traces(64, seed=4),
            out,
            only="dws",
            cost_profile=planted_profile(),
            configs={"dws": cfg},
        )
    said = [r.getMessage() for r in caplog.records]
    steps = [
        "training dws (1 of 1) on 64 requests",
        "DWS: embedding 64 prompts with the frozen encoder",
        f"DWS stage B: fitting the {BUDGET // BS} x {BS} surface head, 5 epochs",
        "DWS: fitting the three scalar baselines (output length, steps, cost)",
    ]
    assert [m for m in said if m in steps] == steps  # each once, in order
    assert any(m.startswith("dws trained in ") for m in said)
    assert not any("stage A" in m for m in said)  # stage_a="none": no encoder pass announced
    ev = labelled_traces(32, seed=5)
    pq.write_table(ev, tmp_path / "eval.parquet")
    argv = ["eval", "--bundle", str(out), "--traces", str(tmp_path / "eval.parquet")]
    assert main([*argv, "--out", str(tmp_path / "m.json"), "-q"]) == 0  # plots included
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["dws"]["n"] == 32 and "admission" not in metrics

    bundle = dwise_predict.load_bundle(out)
    cost = costs_from_bundle(bundle, ev)
    surface = bundle.predict_surface(ev.column("prompt").to_pylist())
    m = ev.column("prompt_blocks").to_numpy()
    np.testing.assert_allclose(cost, bundle.cost_profile.expected_cost(surface, m))
    i = ev.schema.get_field_index("prompt")
    redacted = ev.set_column(i, "prompt", pa.array([None] * ev.num_rows, pa.string()))
    with pytest.raises(TraceError, match="redacted"):
        costs_from_bundle(bundle, redacted)


def test_int8_only_module_ships_one_onnx_file_and_survives_reprofiling(
    trained: dict, tmp_path: Path
) -> None:
    from dwise_predict.export.quantize import quantize_int8

    from dwise_predict.bundle.dws import write_bundle_dws
    from dwise_predict.bundle.update import write_bundle_cost_profile
    from dwise_predict.errors import BundleError
    from dwise_predict.predictors.dws import DWSPredictor

    src = dwise_predict.load_bundle(trained["path"])
    work = tmp_path / "int8"
    work.mkdir()
    q = quantize_int8(src.dws.path.with_name("dws.onnx"), work / "dws.int8.onnx", per_channel=True)
    only = DWSPredictor(
        q, src.dws.tokenizer, src.dws.config, exports=src.dws.exports, ship_fp32=False
    )
    out = write_bundle_dws(trained["path"], only, out=tmp_path / "b8")
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["predictors"]["dws"]
    assert "dws.onnx" not in manifest["files"] and "dws.int8.onnx" in manifest["files"]
    assert not (out / "dws.onnx").exists()
    assert entry["precision"] == "int8" and entry["fp32_shipped"] is False
    bundle = dwise_predict.load_bundle(out)
    prompts = trained["eval"].column("prompt").to_pylist()[:8]
    assert bundle.dws.precision == "int8" and bundle.dws.ship_fp32 is False
    np.testing.assert_allclose(
        bundle.predict_cost(prompts), src.predict_cost(prompts), rtol=0.1
    )  # INT8 of a random 1-layer BERT: near, not equal
    with pytest.raises(BundleError, match="int8=True"):
        DWSPredictor.load(out, int8=False)
    # a new revision (re-profiling) copies the one file and keeps it INT8-only
    again = write_bundle_cost_profile(out, planted_profile(), out=tmp_path / "b8-reprofiled")
    assert (again / "dws.int8.onnx").read_bytes() == (out / "dws.int8.onnx").read_bytes()
    assert not (again / "dws.onnx").exists()
    assert dwise_predict.load_bundle(again).predict_cost(prompts).shape == (8,)
    # saved again as a module (e.g. a bundle rebuilt around it): still one file
    write_bundle_dws(again, dwise_predict.load_bundle(again).dws, out=tmp_path / "b8-rewritten")
    assert not (tmp_path / "b8-rewritten" / "dws.onnx").exists()


def test_embedding_tables_go_int8_one_scale_per_row(trained: dict, tmp_path: Path) -> None:
    import onnx
    from dwise_predict.export.quantize import embeddings_int8_per_row
    from onnx import numpy_helper

    from dwise_predict.predictors.dws import DWSPredictor

    src = dwise_predict.load_bundle(trained["path"]).dws
    fp32_file = src.path.with_name("dws.onnx")
    dst = tmp_path / "rows.onnx"
    assert embeddings_int8_per_row(fp32_file, dst) >= 1  # the 30,522-token word table at least
    before = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(fp32_file)).graph.initializer}
    after = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(dst)).graph.initializer}
    words = next(n for n in before if n.endswith("word_embeddings.weight"))
    assert words not in after and after[f"{words}.int8"].dtype == np.int8
    w, q, s = before[words], after[f"{words}.int8"], after[f"{words}.row_scale"]
    assert s.shape == (w.shape[0], 1)
    # each row within half an int8 step of its own scale
    assert np.all(np.abs(q * s - w) <= 0.5 * s + 1e-7)
    prompts = trained["eval"].column("prompt").to_pylist()[:16]
    rows = DWSPredictor(dst, src.tokenizer, src.config)
    fp32 = DWSPredictor(fp32_file, src.tokenizer, src.config)
    assert np.abs(rows.predict_surface(prompts) - fp32.predict_surface(prompts)).max() < 0.02
    assert dst.stat().st_size < 0.5 * fp32_file.stat().st_size


#: run under torchrun by the DDP test: `train_bundle` as `dwise-predict train` calls it with
#: --accelerator cpu --devices 2 --strategy ddp (fewer head epochs than the CLI's defaults, to
#: keep the test short)
DDP_CONFIG = {
    "stage_a_epochs": 2,
    "stage_b_epochs": 30,
    "baseline_epochs": 10,
    "window": 48,
    "head_tokens": 16,
}
DDP_DRIVER = f"""
import sys
from dwise_predict.trainers.devices import DeviceConfig
from dwise_predict.trainers.dws import DWSTrainConfig
from dwise_predict.trainers.pipeline import train_bundle

traces, out, profile, encoder = sys.argv[1:5]
train_bundle(
    traces,
    out,
    only="dws",
    cost_profile=profile,
    configs={{"dws": DWSTrainConfig(encoder_path=encoder, **{DDP_CONFIG!r})}},
    devices=DeviceConfig(accelerator="cpu", devices=2, strategy="ddp"),
)
"""


@pytest.mark.slow
def test_dws_trains_with_ddp_on_two_cpu_processes(tiny_encoder: Path, tmp_path: Path) -> None:
    """torchrun, 2 processes, DDP over gloo: the DWS trainer on the multi-GPU / multi-node code
    path, as the other trainers. Both processes take their half of every batch, rank 0 alone
    exports and writes, and the model is as good as one process's on the same traces (the
    same global batches; they differ in dropout draws and float summation order)."""
    import pyarrow.parquet as pq
    from dwise_predict.trainers.dws import DWSTrainConfig
    from dwise_predict.trainers.dws_eval import evaluate_dws
    from dwise_predict.trainers.pipeline import train_bundle

    pq.write_table(labelled_traces(96, seed=6), tmp_path / "train.parquet")
    planted_profile().save(tmp_path / "profile.json")
    (tmp_path / "driver.py").write_text(DDP_DRIVER)
    args = [str(tmp_path / n) for n in ("train.parquet", "ddp", "profile.json")]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    done = subprocess.run(
        [
            *torchrun,
            "--nproc-per-node",
            "2",
            str(tmp_path / "driver.py"),
            *args,
            str(tiny_encoder),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    train_bundle(  # the single-process peer, in this process, as `train` without device flags
        args[0],
        tmp_path / "one",
        only="dws",
        cost_profile=args[2],
        configs={"dws": DWSTrainConfig(encoder_path=str(tiny_encoder), **DDP_CONFIG)},
    )
    one, ddp = (dwise_predict.load_bundle(tmp_path / n) for n in ("one", "ddp"))
    info = ddp.manifest["training"]["dws"]
    assert info["processes"] == 2 and info["devices"]["strategy"] == "ddp"
    assert one.manifest["training"]["dws"]["processes"] == 1
    ev = labelled_traces(64, seed=7)
    m_one, _ = evaluate_dws(one, ev)
    m_ddp, s_ddp = evaluate_dws(ddp, ev)
    assert np.all(s_ddp >= 0) and np.all(s_ddp <= 1 + 1e-6)
    ratio = m_ddp["cost_mae"] / m_one["cost_mae"]
    assert 0.8 <= ratio <= 1.25, (m_ddp["cost_mae"], m_one["cost_mae"])


def test_the_surface_covers_the_block_the_absolute_layout_adds() -> None:
    """In the absolute layout the prompt's tail shares the first output block, so a budget of
    B tokens can run B / bs + 1 blocks: N must cover it even when no training trace did, or an
    eval set that holds such a request is refused (the demo's eval split did exactly that)."""
    import dataclasses

    from dwise_predict.trainers.dws_data import budget_blocks, dws_arrays

    from dwise_predict.fingerprint import ModelFingerprint
    from dwise_predict.traces import META_FINGERPRINT

    table = make_traces(12, block_size=BS, output_budget=BUDGET, seed=3)
    fp = ModelFingerprint.from_dict(json.loads(table.schema.metadata[META_FINGERPRINT]))

    def with_alignment(alignment: str):
        meta = dict(table.schema.metadata)
        meta[META_FINGERPRINT] = dataclasses.replace(fp, block_alignment=alignment).to_json()
        return table.replace_schema_metadata(meta)

    assert max(len(r) for r in table.column("rounds_per_block").to_pylist()) <= BUDGET // BS
    assert dws_arrays(with_alignment("response")).activity.shape[1] == BUDGET // BS
    assert dws_arrays(with_alignment("absolute")).activity.shape[1] == BUDGET // BS + 1
    assert budget_blocks(256, 32, absolute=True) == 9 and budget_blocks(256, 32, False) == 8
    assert budget_blocks(250, 32, absolute=True) == 9 and budget_blocks(250, 32, False) == 8
    with pytest.raises(TraceError, match="block alignment"):
        dws_arrays(table, n_blocks=1)


def test_the_lightgbm_dws_admission_source(
    trained: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``predict_admission(source="lightgbm+dws")`` is the plain mean of the admission model's
    estimate and the surface's expected rounds (the sum of D), which is a count of (block,
    step) pairs; a bundle without DWS and traces without prompt text are refused by name."""
    import pyarrow as pa

    from dwise_predict.bundle import ADMISSION_SOURCES, save_bundle
    from dwise_predict.cli import main
    from dwise_predict.runtime import estimates_from_bundle

    bundle = dwise_predict.load_bundle(trained["path"])
    table = trained["eval"]
    prompts = table.column("prompt").to_pylist()[:24]
    surface = bundle.predict_surface(prompts)
    rounds = bundle.predict_dws_rounds(prompts)
    np.testing.assert_allclose(rounds, surface.sum(axis=(1, 2)), rtol=1e-6)
    assert np.all(rounds >= 1.0) and np.all(rounds <= surface.shape[1] * surface.shape[2])
    lgbm = bundle.predict_admission(prompts)
    np.testing.assert_allclose(
        bundle.predict_admission(prompts, source="lightgbm+dws"), (lgbm + rounds) / 2, rtol=1e-9
    )
    # the mean ranks the planted workload at least as well as the worse of the two alone
    true = np.array([sum(r) for r in table.column("rounds_per_block").to_pylist()[:24]])

    def rho(x: np.ndarray) -> float:
        return float(np.corrcoef(np.argsort(np.argsort(x)), np.argsort(np.argsort(true)))[0, 1])

    assert rho((lgbm + rounds) / 2) >= min(rho(lgbm), rho(rounds)) - 1e-9
    assert ADMISSION_SOURCES == ("lightgbm", "lightgbm+dws")
    with pytest.raises(BundleError, match="not one of"):
        bundle.predict_admission(prompts, source="bert")
    no_dws = dwise_predict.load_bundle(
        save_bundle(tmp_path / "plain", [bundle.admission], fingerprint=bundle.fingerprint)
    )
    with pytest.raises(BundleError, match="no DWS predictor"):
        no_dws.predict_admission(prompts, source="lightgbm+dws")
    redacted = table.set_column(
        table.schema.get_field_index("prompt"),
        table.schema.field("prompt"),
        pa.array([None] * table.num_rows, type=table.schema.field("prompt").type),
    )
    with pytest.raises(TraceError, match="redacted"):
        estimates_from_bundle(bundle, redacted, admission_source="lightgbm+dws")
    argv = ["simulate", "--synthetic", "paper-llada2.1-mini", "--admission", "lightgbm+dws"]
    assert main([*argv, "--out", str(tmp_path / "sim")]) != 0
    assert "pass --bundle too" in capsys.readouterr().err


def test_an_int8_surface_does_not_depend_on_the_prompts_beside_it() -> None:
    """The shipped INT8 DWS quantizes activations per call; priced in a list, each prompt must
    get exactly the surface it gets alone (a ranking must not depend on which arrivals came
    together)."""
    bundle = dwise_predict.load_bundle("tiny-bd")
    assert bundle.dws is not None and bundle.dws.precision == "int8"
    prompts = [
        "Hi!",
        "Write a haiku about queues.",
        "Explain, step by step, how a block-diffusion language model decodes a block. " * 6,
        "What is 17 * 23?",
    ]
    together = bundle.predict_dws_rounds(prompts)
    alone = np.array([bundle.predict_dws_rounds([p])[0] for p in prompts])
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_array_equal(bundle.predict_dws_rounds(prompts[::-1])[::-1], alone)
