"""Bundle format v1: round trip, integrity, versions, fingerprint guard, train/eval CLI."""

import dataclasses
import json

import numpy as np
import pyarrow.compute as pc
import pytest
from dwise_predict.trainers.dataset import trace_arrays
from dwise_predict.trainers.pipeline import train_bundle
from dwise_predict.trainers.refinement import RefinementConfig
from synthetic_traces import CHAT_TEMPLATE, make_traces, synthetic_featurizer, write_traces

from dwise_predict.bundle import load_bundle, read_manifest, save_bundle
from dwise_predict.cli import main
from dwise_predict.errors import (
    BundleError,
    BundleIntegrityError,
    BundleVersionError,
    FingerprintMismatchError,
    PredictorInputError,
    TrainingError,
)

H = 32


@pytest.fixture(scope="module")
def traces():
    return make_traces(400, H, seed=0), make_traces(200, H, seed=1)


@pytest.fixture(scope="module")
def bundle_dir(traces, tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "bundle"
    return train_bundle(
        traces[0],
        out,
        seed=0,
        featurizer=synthetic_featurizer(),
        configs={"refinement": RefinementConfig(epochs=4)},
    )


def _copy(src, tmp_path):
    import shutil

    dst = tmp_path / "copy"
    shutil.copytree(src, dst)
    return dst


def test_round_trip_predicts_identically(bundle_dir, traces, tmp_path):
    b = load_bundle(bundle_dir)
    ev = trace_arrays(traces[1])
    prompts = traces[1].column("prompt").to_pylist()
    # raw text through the bundled tokenizer + chat template == the traced features
    X = ev.admission_features(b.admission.feature_names)
    assert np.array_equal(b.predict_admission(prompts), b.predict_admission_features(X))
    refined = b.predict_refined(ev.hidden, ev.prompt_tokens, ev.output_budget)
    raw = b.predict_refined(ev.hidden, ev.prompt_tokens, ev.output_budget, raw=True)
    assert refined.shape == raw.shape == (200,) and not np.array_equal(refined, raw)
    # save the loaded predictors again: same predictions, same hashes for the model files
    again = save_bundle(
        tmp_path / "again",
        b.modules.values(),
        fingerprint=b.fingerprint,
        training=b.manifest["training"],
    )
    b2 = load_bundle(again)
    assert np.array_equal(
        b2.predict_refined(ev.hidden, ev.prompt_tokens, ev.output_budget), refined
    )
    assert np.array_equal(b2.predict_admission(prompts), b.predict_admission(prompts))
    for name in (
        "admission.lgb.txt",
        "refinement.safetensors",
        "calibration.json",
        "tokenizer.json",
    ):
        assert b2.manifest["files"][name] == b.manifest["files"][name]


def test_manifest_declares_everything(bundle_dir):
    m = read_manifest(bundle_dir)
    assert m["format"] == "dwise-predict-bundle" and m["format_version"] == 2
    assert m["library"]["requires"] and m["fingerprint"]["hidden_size"] == H
    assert set(m["files"]) == {p.name for p in bundle_dir.iterdir()} - {"manifest.json"}
    adm, ref = m["predictors"]["admission"], m["predictors"]["refinement"]
    assert adm["feature_names"] == [
        *("word_count", "newline_count", "prompt_tokens"),
        *("digit_permille", "symbol_permille", "question_marks"),
    ]
    assert ref["hidden_size"] == H and ref["members"] >= 1 and "features" not in m
    assert "refinement.json" not in m["files"]  # its description lives in the entry only
    assert sum(m["training"]["categories"].values()) == 400
    assert not any(p.suffix in (".pkl", ".pt", ".ckpt", ".pickle") for p in bundle_dir.iterdir())


@pytest.mark.parametrize("damage", ["tamper", "truncate", "missing"])
def test_damaged_file_is_refused_naming_it(bundle_dir, tmp_path, damage):
    d = _copy(bundle_dir, tmp_path)
    f = d / "refinement.safetensors"
    data = f.read_bytes()
    if damage == "tamper":
        f.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "truncate":
        f.write_bytes(data[: len(data) // 2])
    else:
        f.unlink()
    with pytest.raises(BundleIntegrityError, match="refinement.safetensors"):
        load_bundle(d)


def _edit_manifest(d, **changes):
    m = json.loads((d / "manifest.json").read_text())
    for k, v in changes.items():
        if k == "requires":
            m["library"]["requires"] = v
        else:
            m[k] = v
    (d / "manifest.json").write_text(json.dumps(m))


def test_newer_format_and_unmet_requirement_are_refused_before_loading(bundle_dir, tmp_path):
    d = _copy(bundle_dir, tmp_path)
    (d / "refinement.safetensors").write_bytes(
        b"garbage"
    )  # never reached: the version check comes first
    _edit_manifest(d, format_version=3)
    with pytest.raises(BundleVersionError, match="format v3.*upgrade"):
        load_bundle(d)
    _edit_manifest(d, format_version=2, requires=">=99")
    with pytest.raises(BundleVersionError, match="requires dwise-predict>=99"):
        load_bundle(d)


def test_fingerprint_mismatch_names_both_sides(bundle_dir):
    b = load_bundle(bundle_dir)
    assert b.check(b.fingerprint) == []
    other = dataclasses.replace(b.fingerprint, model_id="SDAR-8B", block_size=4)
    with pytest.raises(FingerprintMismatchError) as e:
        b.check(other)
    msg = str(e.value)
    assert (
        "synthetic/planted-bd" in msg
        and "SDAR-8B" in msg
        and "block 32" in msg
        and "block 4" in msg
    )
    assert "allow_mismatch=True" in msg
    with pytest.warns(UserWarning, match="SDAR-8B"):
        assert set(b.check(other, allow_mismatch=True)) == {"model_id", "block_size"}


def test_bad_inputs_and_references(bundle_dir, traces, tmp_path):
    b = load_bundle(bundle_dir)
    with pytest.raises(
        PredictorInputError, match=f"hidden size 7 does not match the bundle's hidden size {H}"
    ):
        b.predict_refined(np.zeros((2, 7)), 10, 256)
    with pytest.raises(BundleError, match="does not exist"):
        load_bundle(tmp_path / "nope")
    with pytest.raises(
        BundleError, match="hf://org/name@main"
    ):  # offline here: a Hub error naming the ref
        load_bundle("hf://org/name@main")
    with pytest.raises(BundleError, match="already exists"):
        train_bundle(traces[0], bundle_dir, only="admission")
    one_cat = traces[0].filter(pc.equal(traces[0].column("category"), "chat"))
    with pytest.raises(TrainingError, match="single category"):
        train_bundle(one_cat, tmp_path / "x")
    adm_only = load_bundle(
        train_bundle(one_cat, tmp_path / "y", only="admission", allow_single_category=True)
    )
    with pytest.raises(BundleError, match="no refinement predictor"):
        adm_only.predict_refined(np.zeros((1, H)), 1, 1)
    with pytest.raises(PredictorInputError, match="no tokenizer"):
        adm_only.predict_admission(["hi"])


def test_train_and_eval_cli(traces, tmp_path, capsys):
    write_traces(tmp_path / "train" / "t.parquet", traces[0])
    write_traces(tmp_path / "eval" / "t.parquet", traces[1])
    synthetic_featurizer().tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "chat.jinja").write_text(CHAT_TEMPLATE)
    rc = main(
        [
            "train",
            "--traces",
            str(tmp_path / "train"),
            "--out",
            str(tmp_path / "b"),
            "--epochs",
            "3",
            "--tokenizer",
            str(tmp_path / "tokenizer.json"),
            "--chat-template",
            str(tmp_path / "chat.jinja"),
            "-q",
        ]
    )
    assert rc == 0 and "bundle written" in capsys.readouterr().out
    rc = main(
        [
            "eval",
            "--bundle",
            str(tmp_path / "b"),
            "--traces",
            str(tmp_path / "eval"),
            "--out",
            str(tmp_path / "m" / "metrics.json"),
            "-q",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "refined" in out and "admission" in out
    m = json.loads((tmp_path / "m" / "metrics.json").read_text())
    assert m["n_requests"] == 200
    for name in ("admission", "refined_raw", "refined"):
        assert set(m[name]) >= {"spearman", "median_ratio", "per_category"}
        assert set(m[name]["per_category"]) == {"chat", "code", "math", "mcq", "summarize"}
        assert -1 <= m[name]["spearman"] <= 1
    assert (tmp_path / "m" / "metrics_pred_vs_actual.png").stat().st_size > 1000
    assert (tmp_path / "m" / "metrics_calibration.png").stat().st_size > 1000
    # rounds or tokens: every score's rho with the rounds it ranks, with and without mcq
    rvt = m["rounds_vs_tokens"]
    assert set(rvt) == {"output_length", "admission", "refined_raw", "refined"}
    assert rvt["admission"]["rho_all"] == pytest.approx(m["admission"]["spearman"], abs=1e-12)
    assert all(-1 <= v["rho_other"] <= 1 for v in rvt.values())
    assert "true output length" in out
    # a library error is one line, non-zero
    assert (
        main(
            [
                "eval",
                "--bundle",
                str(tmp_path / "nope"),
                "--traces",
                str(tmp_path / "eval"),
                "--out",
                str(tmp_path / "x.json"),
            ]
        )
        == 1
    )
    assert "does not exist" in capsys.readouterr().err


def test_holdout_category_retrains_without_it(bundle_dir, traces):
    from dwise_predict.trainers.evaluate import holdout_evaluation

    b = load_bundle(bundle_dir)
    h = holdout_evaluation(b, traces[0], traces[1], "mcq", seed=0)
    assert h["category"] == "mcq" and h["n_train_without"] == 320 and h["n_eval"] == 40
    for name in ("admission", "refined_raw", "refined"):
        assert set(h[name]) == {
            "in_training",
            "held_out",
            "overall_held_out",
            "median_ratio_held_out",
        }
    # the planted hidden signal transfers to the unseen category
    assert h["refined"]["held_out"] > 0.3
    with pytest.raises(Exception, match="not in the training traces"):
        holdout_evaluation(b, traces[0], traces[1], "poetry")


def test_simulator_runs_on_a_bundles_estimates(bundle_dir, traces, tmp_path):
    """The simulate path: a trained bundle's estimates drive DWISE on (synthetic) traces.

    Admission reads the traced prompt counts and the prompts' lexical features, so a
    featurizer-less bundle works as well.
    """
    from dwise_predict.runtime import compare_policies, estimates_from_bundle, requests_from_traces

    bundle = load_bundle(bundle_dir)
    table = traces[1]
    adm, ref = estimates_from_bundle(bundle, table)
    prompts = table.column("prompt").to_pylist()
    tokens = table.column("prompt_tokens").to_pylist()
    X = np.array([bundle.admission_row(p, n) for p, n in zip(prompts, tokens)])
    np.testing.assert_array_equal(adm, bundle.predict_admission_features(X))
    assert adm.shape == ref.shape == (table.num_rows,) and np.all(ref >= 0)
    report = compare_policies(
        requests_from_traces(table, adm, ref), "fcfs,dwise,oracle", "burst", slots=16, k=8, seed=0
    )
    s = report.summary
    assert set(s) == {"fcfs", "dwise", "oracle"}
    # the planted signal makes the estimates informative: DWISE beats FCFS, and oracle bounds it
    assert s["dwise"]["mean_latency"] < s["fcfs"]["mean_latency"]
    assert s["oracle"]["mean_latency"] <= s["dwise"]["mean_latency"] * 1.05
