"""`dwise-predict demo` end to end on small sizes: every stage runs on the shipped tiny-bd model.

This is the same command `make demo` runs (there with 160/80 requests); here it is shrunk so
the test stays around a minute on two cores.
"""

import json

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
        "fcfs,dwise,oracle",
        "-q",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for stage in (
        "[1/6] workload",
        "[2/6] trace",
        "[3/6] train",
        "[4/6] eval",
        "[5/6] export",
        "[6/6] simulate",
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

    summary = json.loads((out / "simulate" / "summary.json").read_text())
    policies = summary.get("policies", summary)
    assert {"fcfs", "dwise", "oracle"} <= set(policies)
    assert policies["oracle"]["mean_latency"] <= policies["fcfs"]["mean_latency"]
    assert (out / "simulate" / "latency_cdf.png").stat().st_size > 0
    assert (out / MARKER).exists()


def test_demo_refuses_to_replace_a_folder_it_did_not_make(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    assert main(["demo", "--out", str(mine), "-q"]) == 1
    assert "was not made by the demo" in capsys.readouterr().err
    assert (mine / "precious.txt").read_text() == "keep me"
