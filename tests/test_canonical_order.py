"""The same requests train the same bundle, whatever order or sharding their traces came in.

Serving traces arrive in finish order, sharded by replica and by writer; the trainers batch and
split by row position. Real LightGBM and Lightning training on SYNTHETIC traces.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
from dwise_predict.trainers.pipeline import canonical_order, train_bundle
from dwise_predict.trainers.refinement import RefinementConfig
from synthetic_traces import make_traces, synthetic_featurizer

from dwise_predict import load_bundle
from dwise_predict.predictors import RefinementEnsemble

H = 16


def _train(traces, out):
    config = {RefinementEnsemble.kind: RefinementConfig(epochs=2, members=2)}
    path = train_bundle(traces, out, seed=0, featurizer=synthetic_featurizer(), configs=config)
    return load_bundle(path)


def _predict(bundle, table):
    arr = table.sort_by("request_id")
    hidden = np.stack(arr.column("first_round_hidden").to_numpy(zero_copy_only=False))
    return (
        bundle.predict_admission(arr.column("prompt").to_pylist()),
        bundle.predict_refined(
            hidden.astype(np.float32),
            arr.column("prompt_tokens").to_numpy(),
            arr.column("output_budget").to_numpy(),
        ),
    )


def test_shuffled_and_resharded_traces_train_bit_identical_predictors(tmp_path):
    table = make_traces(240, H, seed=4)
    held_out = make_traces(60, H, seed=9, id_prefix="eval")
    ref = _predict(_train(table, tmp_path / "a"), held_out)

    shuffled = table.take(np.random.default_rng(1).permutation(table.num_rows))
    # re-sharded: three files of uneven size, written in reverse order of their rows
    folder = tmp_path / "shards"
    folder.mkdir()
    for k, (lo, hi) in enumerate([(150, 240), (40, 150), (0, 40)]):
        pq.write_table(shuffled.slice(lo, hi - lo), folder / f"shard-{k:03d}.parquet")

    for i, traces in enumerate([shuffled, folder]):
        got = _predict(_train(traces, tmp_path / f"b{i}"), held_out)
        assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1])


def test_canonical_order_is_a_stable_sort_by_request_id():
    t = make_traces(30, H, seed=2)
    shuffled = t.take(np.random.default_rng(0).permutation(30))
    ids = canonical_order(shuffled).column("request_id").to_pylist()
    assert ids == sorted(ids) == sorted(t.column("request_id").to_pylist())
    assert canonical_order(shuffled).schema.metadata == t.schema.metadata  # fingerprint kept
