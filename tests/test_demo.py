"""`dwise-predict demo` end to end on small sizes: every stage runs on the shipped tiny-bd model.

This is the same command `make demo` runs (there with 160/80 requests and 40 profiled ones);
here it is shrunk (40/15 requests, 20 profiled, one DWS encoder epoch) so the test stays around
a minute or two on two cores.
"""

import json
import math

import pytest

from dwise_predict import load_bundle
from dwise_predict.cli import main
from dwise_predict.cli.demo import MARKER


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline_offline(tmp_path, capsys):
    out = tmp_path / "demo"
    argv = [
        "demo",
        "--out",
        str(out),
        "--train-size",
        "40",
        "--eval-size",
        "15",
        "--batch-size",
        "8",
        "--slots",
        "4",
        "--policies",
        "fcfs,dwise,oracle,dws-sjf",
        "--profile-requests",
        "20",
        "--dws-epochs",
        "1",
        "-q",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for stage in (
        "[1/7] workload",
        "[2/7] trace",
        "[3/7] profile",
        "[4/7] train",
        "[5/7] eval",
        "[6/7] export",
        "[7/7] simulate",
    ):
        assert stage in printed

    bundle = load_bundle(out / "bundle")
    assert bundle.fingerprint.model_id == "tiny-bd" and bundle.fingerprint.block_size == 32
    assert set(bundle.manifest["metrics"]) >= {"admission", "refined"}  # eval --record
    assert "admission.onnx" in bundle.manifest["exports"]  # export kept the parity-gated file
    card = (out / "bundle" / "README.md").read_text()
    assert "library_name: dwise-predict" in card and "plots/" in card
    # the bundle carries the served model's tokenizer: it predicts from raw text
    est = bundle.predict_admission(["What is 2 + 3?"])
    assert est.shape == (1,) and est[0] > 0

    # DWS: a measured cost profile, the predictor trained, evaluated and exported, DWS-SJF
    profile = json.loads((out / "profile" / "cost_profile.json").read_text())
    assert profile["block_size"] == 32 and math.isfinite(profile["cv"]["r2"])
    assert bundle.dws is not None and bundle.cost_profile is not None
    assert bundle.cost_profile.alpha_ms == pytest.approx(profile["alpha_ms"])
    dws = bundle.manifest["metrics"]["dws"]
    assert dws["n"] == 15 and 0 < dws["cost_mae"] < float("inf")
    for name in ("output_length", "total_steps", "direct_cost"):
        assert dws["baselines"][name]["cost_mae"] > 0
    assert {"bundle", "paper-llada2.0-mini"} <= set(dws["profiles"])
    assert "dws.onnx: written and gated by `train` (kept)" in printed  # through export_bundle
    cost = bundle.predict_cost(["What is 2 + 3?"])
    assert cost.shape == (1,) and cost[0] > 0
    for sim in ("simulate", "simulate-profiled"):
        summary = json.loads((out / sim / "summary.json").read_text())
        policies = summary.get("policies", summary)
        assert {"fcfs", "dwise", "oracle", "dws-sjf"} <= set(policies)
        assert policies["oracle"]["mean_latency"] <= policies["fcfs"]["mean_latency"]
        assert policies["dws-sjf"]["mean_latency"] > 0
    assert (out / "simulate" / "latency_cdf.png").stat().st_size > 0
    assert (out / MARKER).exists()


def test_demo_refuses_to_replace_a_folder_it_did_not_make(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    assert main(["demo", "--out", str(mine), "-q"]) == 1
    assert "was not made by the demo" in capsys.readouterr().err
    assert (mine / "precious.txt").read_text() == "keep me"
