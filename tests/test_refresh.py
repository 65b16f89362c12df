"""`dwise-predict refresh`: a candidate trained on serving traces ships only when it is better.

Real LightGBM training on SYNTHETIC traces (tests/synthetic_traces.py): the live bundle saw two
categories; serving traffic then carries five (a category mix the bundle saw little of), so a
candidate trained on what the server saw must rank better on the most recent requests.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from dwise_predict.trainers.admission import AdmissionConfig
from dwise_predict.trainers.pipeline import train_bundle
from dwise_predict.trainers.refresh import RefreshConfig, refresh_bundle, split_recent, verdict
from synthetic_traces import CATEGORIES, make_traces, synthetic_featurizer, write_traces

from dwise_predict import load_bundle
from dwise_predict.cli import main
from dwise_predict.errors import ConfigError, FingerprintMismatchError, TrainingError


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    old = make_traces(300, 16, seed=0, categories=CATEGORIES[:2], id_prefix="old")
    out = tmp_path_factory.mktemp("live") / "bundle"
    return train_bundle(old, out, only="admission", seed=0, featurizer=synthetic_featurizer())


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    table = make_traces(500, 16, seed=5, id_prefix="srv")
    return write_traces(tmp_path_factory.mktemp("serving") / "shard-000.parquet", table)


def test_a_candidate_that_ranks_the_new_traffic_better_is_published_as_a_revision(
    live, serving, tmp_path
):
    report = refresh_bundle(live, serving, tmp_path / "next")
    assert report.promoted and report.published == tmp_path / "next"
    assert (report.train_requests, report.holdout_requests, report.kinds) == (
        400,
        100,
        ["admission"],
    )
    assert report.candidate["spearman"] > report.live["spearman"] + 0.05
    refreshed = load_bundle(tmp_path / "next")  # verified: every hash checks out
    assert refreshed.manifest["revision"] == load_bundle(live).manifest.get("revision", 0) + 1
    assert refreshed.manifest["training"]["refreshed_from"]["name"] == load_bundle(live).name
    # the same inputs give the same candidate (fixed seed)
    again = refresh_bundle(live, serving, tmp_path / "again")
    assert again.candidate == report.candidate


@pytest.fixture(scope="module")
def noisy(serving, tmp_path_factory):
    """The serving traces with the training part's work shuffled across its prompts: a
    candidate trained on them learns noise, while the held-out 100 stay real."""
    table = pq.read_table(serving)
    rng = np.random.default_rng(0)
    perm = np.concatenate([rng.permutation(400), np.arange(400, table.num_rows)])
    for name in ("rounds_per_block", "total_rounds", "output_blocks"):
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(i), table.column(name).take(perm))
    return write_traces(tmp_path_factory.mktemp("noisy") / "shard-000.parquet", table)


def test_a_worse_candidate_is_never_written(live, noisy, tmp_path):
    report = refresh_bundle(live, noisy, tmp_path / "never")
    assert not report.promoted and report.published is None
    assert "kept the live bundle" in report.reason
    assert report.candidate["spearman"] < report.live["spearman"]
    assert not (tmp_path / "never").exists()


def test_refresh_refuses_what_it_cannot_judge(live, serving, tmp_path):
    with pytest.raises(TrainingError, match="too few to refresh"):
        refresh_bundle(live, serving, tmp_path / "x", config=RefreshConfig(min_holdout=300))
    other = make_traces(200, 16, seed=1, block_size=64)  # another block size: another setting
    with pytest.raises(FingerprintMismatchError):
        refresh_bundle(live, write_traces(tmp_path / "o.parquet", other), tmp_path / "y")
    with pytest.raises(ConfigError, match="holdout_frac"):
        RefreshConfig(holdout_frac=1.0)
    t = make_traces(100, 16, seed=2)
    older, recent = split_recent(t, RefreshConfig(holdout_frac=0.3, min_holdout=10))
    assert (older.num_rows, recent.num_rows) == (70, 30)
    assert recent.column("request_id").to_pylist() == t.column("request_id").to_pylist()[70:]
    ok, why = verdict(
        {"spearman": 0.5, "median_ratio": 1.1}, {"spearman": 0.49, "median_ratio": 1.0}, 0.02
    )
    assert ok and why.startswith("promoted")
    ok, why = verdict(
        {"spearman": 0.5, "median_ratio": 1.0}, {"spearman": 0.6, "median_ratio": 1.5}, 0
    )
    assert not ok and "median ratio" in why


def test_the_cli_exits_3_when_it_keeps_the_live_bundle(live, serving, noisy, tmp_path, capsys):
    common = ["refresh", "--bundle", str(live), "-q"]
    out, report = tmp_path / "cli", tmp_path / "r.json"
    rc = main(
        [*common, "--serving-traces", str(serving), "--out", str(out), "--report", str(report)]
    )
    assert rc == 0 and (out / "manifest.json").exists()
    assert json.loads(report.read_text())["promoted"] is True
    rc = main([*common, "--serving-traces", str(noisy), "--out", str(tmp_path / "cli2")])
    assert rc == 3 and not (tmp_path / "cli2").exists()
    assert "kept the live bundle" in capsys.readouterr().out


def test_unlabelled_serving_traffic_is_refreshed(live, tmp_path):
    """Serving traces often carry one category (clients send none): the candidate still
    trains and is judged on the held-out requests' ranking."""
    table = make_traces(500, 16, seed=7, categories=CATEGORIES[2:3], id_prefix="one")
    traces = write_traces(tmp_path / "serving" / "shard-000.parquet", table)
    report = refresh_bundle(live, traces, tmp_path / "next")
    assert (report.train_requests, report.holdout_requests) == (400, 100)
    assert np.isfinite(report.candidate["spearman"]) and np.isfinite(report.live["spearman"])
    assert report.promoted == (tmp_path / "next").exists()


def test_the_candidate_reads_the_live_bundles_features(live, tmp_path):
    """A candidate is trained on the live bundle's feature set. Serving traces record the
    prompt's lexical counts without its text, so a bundle that reads them refreshes from
    redacted traces; traces with neither are refused, and a bundle on the three counts
    refreshes from them."""
    import pyarrow as pa

    table = make_traces(400, 16, seed=5, id_prefix="srv")
    i = table.column_names.index("prompt")
    redacted = table.set_column(i, "prompt", pa.array([None] * table.num_rows, pa.string()))
    assert load_bundle(live).admission.needs_text  # the default set reads the prompts
    kept = write_traces(tmp_path / "redacted" / "shard-000.parquet", redacted)
    report = refresh_bundle(live, kept, tmp_path / "from-redacted")
    assert report.candidate["spearman"] is not None
    old = redacted.drop_columns(["digit_permille", "symbol_permille", "question_marks"])
    path = write_traces(tmp_path / "old" / "shard-000.parquet", old)
    with pytest.raises(TrainingError, match="schema v3.*--admission-features counts"):
        refresh_bundle(live, path, tmp_path / "x")
    old = make_traces(300, 16, seed=0, categories=CATEGORIES[:2], id_prefix="old")
    counts_live = train_bundle(
        old,
        tmp_path / "counts-live",
        only="admission",
        seed=0,
        featurizer=synthetic_featurizer(),
        configs={"admission": AdmissionConfig(features="counts")},
    )
    report = refresh_bundle(counts_live, path, tmp_path / "revisions")
    assert report.promoted, report.reason
    published = load_bundle(report.published)
    assert published.admission.feature_names == load_bundle(counts_live).admission.feature_names
