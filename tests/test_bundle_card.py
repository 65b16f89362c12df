"""The bundle's model card and recorded evaluation (issue 7): real bundle, real metrics, real HF
parser.

A bundle is trained here on SYNTHETIC traces (tests/synthetic_traces.py), evaluated on disjoint
ones with the library's own evaluation, and recorded into the bundle. The card's YAML front matter
is parsed by huggingface_hub (``ModelCard`` / ``metadata_load``), the code the Hub client uses.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from dwise_predict.trainers.dataset import trace_arrays
from dwise_predict.trainers.evaluate import evaluate_arrays, write_plots
from dwise_predict.trainers.pipeline import train_bundle
from dwise_predict.trainers.refinement import RefinementConfig
from huggingface_hub import ModelCard, metadata_load
from synthetic_traces import make_traces, synthetic_featurizer, write_traces

from dwise_predict.bundle import load_bundle, read_manifest, record_evaluation, render_card
from dwise_predict.bundle.format import sha256_file
from dwise_predict.cli import main
from dwise_predict.errors import BundleError, BundleIntegrityError, ConfigError

H = 24
ESTIMATES = ("admission", "refined_raw", "refined")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(fresh bundle folder, eval traces, metrics, plot files): trained and evaluated once."""
    root = tmp_path_factory.mktemp("card")
    bundle = train_bundle(
        make_traces(300, H, seed=0),
        root / "fresh",
        seed=0,
        featurizer=synthetic_featurizer(),
        configs={"refinement": RefinementConfig(epochs=2)},
        name="tiny-card-test",
    )
    evals = make_traces(150, H, seed=1)
    metrics, preds = evaluate_arrays(load_bundle(bundle), trace_arrays(evals))
    metrics["traces"] = "synthetic-eval"
    plots = write_plots(preds, root / "plots", stem="eval")
    return bundle, evals, metrics, plots


@pytest.fixture()
def recorded(trained, tmp_path):
    fresh, _, metrics, plots = trained
    b = shutil.copytree(fresh, tmp_path / "b")
    assert record_evaluation(b, metrics, plots) == b
    return b


def _front_matter(readme: Path) -> dict:
    return metadata_load(readme) or {}


def test_fresh_bundle_has_a_hashed_card_that_says_not_evaluated(trained):
    fresh = trained[0]
    manifest = read_manifest(fresh)
    readme = fresh / "README.md"
    assert manifest["files"]["README.md"]["sha256"] == sha256_file(readme)
    meta = _front_matter(readme)
    assert meta["library_name"] == "dwise-predict" and meta["license"] == "apache-2.0"
    assert meta["tags"] == [
        "dllm",
        "diffusion-llm",
        "scheduling",
        "dwise-predict",
        "synthetic/planted-bd",
    ]
    assert "model-index" not in meta  # nothing measured yet: no invented numbers
    text = readme.read_text()
    assert "Not evaluated yet" in text and "--record" in text
    # the fingerprint table, the predictors' shapes and the training summary come from the manifest
    fp = manifest["fingerprint"]
    assert (
        f"| `block_size` | {fp['block_size']} |" in text
        and f"| `threshold` | {fp['threshold']} |" in text
    )
    ref = manifest["predictors"]["refinement"]
    assert f"K = {ref['K']} hazard logits" in text and f"{ref['n_params']:,} parameters" in text
    assert f"{manifest['predictors']['admission']['n_trees']} trees" in text
    for cat, n in manifest["training"]["categories"].items():
        assert f"| {cat} | {n} |" in text
    assert 'load_bundle("hf://ORG/NAME@REV")' in text and "FingerprintMismatchError" in text


def test_recorded_card_renders_the_metrics_and_plots(trained, recorded):
    _, _, metrics, plots = trained
    bundle = load_bundle(recorded)  # every hash verified, plots and card included
    stored = bundle.manifest["metrics"]
    assert stored["plots"] == [f"plots/{p.name}" for p in plots]
    assert "bundle" not in stored and stored["n_requests"] == 150
    for name in stored["plots"]:
        assert bundle.manifest["files"][name]["sha256"] == sha256_file(recorded / name)
    text = (recorded / "README.md").read_text()
    evaluation = text[text.index("## Evaluation") :]
    for name in ESTIMATES:
        m = metrics[name]
        line = next(ln for ln in evaluation.splitlines() if ln.startswith(f"| {name} | "))
        assert f"{m['spearman']:.3f}" in line and f"{m['median_ratio']:.3f}" in line
    for cat in metrics["categories"]:
        line = next(ln for ln in evaluation.splitlines() if ln.startswith(f"| {cat} | "))
        for name in ESTIMATES:
            assert f"{metrics[name]['per_category'][cat]['spearman']:.3f}" in line
    for p in plots:
        assert (
            f"](plots/{p.name})" in text
            and (recorded / "plots" / p.name).read_bytes() == p.read_bytes()
        )


def test_front_matter_is_accepted_by_huggingface_hub(trained, recorded):
    _, _, metrics, _ = trained
    card = ModelCard.load(
        recorded / "README.md"
    )  # parses and validates model-index into EvalResults
    data = card.data
    assert data.library_name == "dwise-predict" and data.license == "apache-2.0"
    assert data.model_name == "tiny-card-test"
    got = {(r.metric_type, r.metric_name): r.metric_value for r in data.eval_results}
    assert len(got) == 2 * len(ESTIMATES)
    for name in ESTIMATES:
        assert got[("spearman", f"Spearman ρ ({name})")] == pytest.approx(
            metrics[name]["spearman"], abs=1e-6
        )
        assert got[("median_ratio", f"median predicted/actual ({name})")] == pytest.approx(
            metrics[name]["median_ratio"], abs=1e-6
        )
    r = data.eval_results[0]
    assert (r.task_type, r.task_name, r.dataset_type) == (
        "other",
        "remaining-work prediction",
        "synthetic-eval",
    )
    # and the Hub's serialization round-trips the same model-index
    again = ModelCard(str(card)).data.to_dict()["model-index"]
    assert again == _front_matter(recorded / "README.md")["model-index"]


@pytest.mark.parametrize("target", ["plot", "card"])
def test_tampered_plot_or_card_is_refused(recorded, target):
    name = (
        sorted((recorded / "plots").iterdir())[0].relative_to(recorded).as_posix()
        if target == "plot"
        else "README.md"
    )
    data = bytearray((recorded / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (recorded / name).write_bytes(bytes(data))
    with pytest.raises(BundleIntegrityError, match=f"{name} does not match its sha256"):
        load_bundle(recorded)


def test_recording_keeps_predictions_and_replaces_an_earlier_evaluation(trained, recorded):
    fresh, evals, metrics, plots = trained
    arrays = trace_arrays(evals)
    before, after = load_bundle(fresh), load_bundle(recorded)
    names = before.admission.feature_names
    assert np.array_equal(
        before.predict_admission_features(arrays.admission_features(names)),
        after.predict_admission_features(arrays.admission_features(names)),
    )
    args = (arrays.hidden, arrays.prompt_tokens, arrays.output_budget)
    assert np.array_equal(before.predict_refined(*args), after.predict_refined(*args))
    for name in ("admission.lgb.txt", "refinement.safetensors", "calibration.json"):
        assert before.manifest["files"][name] == after.manifest["files"][name]
    # a second evaluation with one plot: the old plots leave the folder and the files table
    second = dict(metrics, n_requests=149)
    record_evaluation(recorded, second, plots[:1])
    m = read_manifest(recorded)
    assert m["metrics"]["n_requests"] == 149 and m["metrics"]["plots"] == [f"plots/{plots[0].name}"]
    assert sorted(p.name for p in (recorded / "plots").iterdir()) == [plots[0].name]
    assert [n for n in m["files"] if n.startswith("plots/")] == [f"plots/{plots[0].name}"]
    assert f"plots/{plots[1].name}" not in (recorded / "README.md").read_text()
    load_bundle(recorded)
    assert not [
        p for p in recorded.parent.iterdir() if p.name.startswith(".")
    ]  # no drafts left behind


def test_a_failed_update_leaves_the_old_bundle_intact(trained, tmp_path):
    fresh, _, metrics, plots = trained
    adm_only = train_bundle(make_traces(120, H, seed=4), tmp_path / "adm", only="admission")
    before = {p.relative_to(adm_only): p.read_bytes() for p in adm_only.rglob("*") if p.is_file()}
    # refined metrics for a bundle without a refinement predictor: refused inside the draft, after
    # the copy
    with pytest.raises(ConfigError, match=r"no \['refinement'\] predictor"):
        record_evaluation(adm_only, metrics, plots)
    after = {p.relative_to(adm_only): p.read_bytes() for p in adm_only.rglob("*") if p.is_file()}
    assert after == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    load_bundle(adm_only)
    # admission-only metrics are fine for it, and the card shows only that estimate
    record_evaluation(
        adm_only, {k: v for k, v in metrics.items() if k not in ("refined", "refined_raw")}
    )
    meta = _front_matter(adm_only / "README.md")
    assert [m["name"] for m in meta["model-index"][0]["results"][0]["metrics"]] == [
        "Spearman ρ (admission)",
        "median predicted/actual (admission)",
    ]


def test_bad_metrics_and_plots_are_refused_with_the_fix(trained, tmp_path):
    fresh, _, metrics, plots = trained
    b = shutil.copytree(fresh, tmp_path / "b")
    with pytest.raises(ConfigError, match="none of the estimates"):
        record_evaluation(b, {"n_requests": 3})
    with pytest.raises(ConfigError, match="must be a dict"):
        record_evaluation(b, [1, 2])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not exist"):
        record_evaluation(b, metrics, [tmp_path / "missing.png"])
    fake = tmp_path / "fake.png"
    fake.write_text("not an image")
    with pytest.raises(ConfigError, match="not a PNG"):
        record_evaluation(b, metrics, [fake])
    (tmp_path / "other").mkdir()
    twin = shutil.copy(plots[0], tmp_path / "other" / plots[0].name)
    with pytest.raises(ConfigError, match="share the name"):
        record_evaluation(b, metrics, [plots[0], twin])
    with pytest.raises(ConfigError, match="not plain JSON"):
        record_evaluation(b, dict(metrics, extra=object()))
    assert read_manifest(b)["metrics"] == {}  # nothing was recorded
    # NaN / inf are stored as null and rendered as n/a, never as invalid JSON or YAML
    nan = json.loads(json.dumps(metrics))
    nan["admission"]["spearman"] = float("nan")
    nan["refined"]["median_ratio"] = float("inf")
    record_evaluation(b, nan)
    m = read_manifest(b)["metrics"]
    assert m["admission"]["spearman"] is None and m["refined"]["median_ratio"] is None
    names = [r.metric_name for r in ModelCard.load(b / "README.md").data.eval_results]
    assert (
        "Spearman ρ (admission)" not in names and "median predicted/actual (refined)" not in names
    )
    assert "| admission | total denoising rounds | n/a |" in (b / "README.md").read_text()


def test_hostile_names_keep_the_card_parseable():
    manifest = {
        "name": 'x"y: z',
        "format_version": 1,
        "fingerprint": {"model_id": "org/m|odel\n---", "block_size": 4, "threshold": 0.9},
        "training": {"n_requests": 2, "categories": {"a|b": 1, "c\nd": 1}},
        "metrics": {
            "n_requests": 2,
            "traces": "t: [x]",
            "admission": {
                "spearman": 0.5,
                "median_ratio": 1.0,
                "per_category": {"a|b": {"spearman": 0.1}},
            },
        },
    }
    card = ModelCard(render_card(manifest, plots=["plots/a.png"]))
    assert card.data.model_name == 'x"y: z' and card.data.tags[-1] == "org/m|odel\n---"
    assert card.data.eval_results[0].dataset_type == "t: [x]"
    assert "| a\\|b | 1 |" in card.text and "![a](plots/a.png)" in card.text


def test_eval_cli_record(trained, tmp_path, capsys):
    fresh, evals, _, _ = trained
    b = shutil.copytree(fresh, tmp_path / "b")
    write_traces(tmp_path / "eval" / "t.parquet", evals)
    rc = main(
        [
            "eval",
            "--bundle",
            str(b),
            "--traces",
            str(tmp_path / "eval"),
            "--out",
            str(tmp_path / "m" / "metrics.json"),
            "--record",
            "-q",
        ]
    )
    assert rc == 0 and "recorded in" in capsys.readouterr().out
    written = json.loads((tmp_path / "m" / "metrics.json").read_text())
    stored = load_bundle(b).manifest["metrics"]
    assert stored["traces"] == "eval" and stored["refined"] == written["refined"]
    assert stored["plots"] == [f"plots/{n}" for n in written["plots"]]
    text = (b / "README.md").read_text()
    assert (
        f"{written['refined']['spearman']:.3f}" in text
        and "](plots/metrics_calibration.png)" in text
    )


def test_record_into_a_new_folder_from_a_symlinked_snapshot(trained, tmp_path):
    """A Hugging Face cache snapshot holds a bundle's files as symlinks to blobs: recording with
    out=DIR copies their content, leaves the snapshot alone, and does not follow a stray symlink."""
    fresh, _, metrics, plots = trained
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshot"
    shutil.copytree(fresh, blobs)
    snap.mkdir()
    for p in sorted(blobs.iterdir()):
        (snap / p.name).symlink_to(p)
    secret = tmp_path / "secret.txt"
    secret.write_text("not part of the bundle")
    (snap / "stray.txt").symlink_to(secret)
    out = record_evaluation(snap, metrics, plots, out=tmp_path / "mine")
    assert out == tmp_path / "mine" and not any(p.is_symlink() for p in out.rglob("*"))
    assert not (out / "stray.txt").exists()
    assert load_bundle(out).manifest["metrics"]["n_requests"] == metrics["n_requests"]
    assert read_manifest(snap)["metrics"] == {}  # the snapshot is untouched
    with pytest.raises(BundleError, match="already exists"):
        record_evaluation(snap, metrics, plots, out=out)
