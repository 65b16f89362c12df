"""Scale-out on SYNTHETIC planted traces: streamed = in memory, sharding, devices, DDP on 2 CPUs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from dwise_predict.trainers.dataset import trace_arrays
from dwise_predict.trainers.devices import DeviceConfig, parse_devices
from dwise_predict.trainers.evaluate import evaluate_arrays, evaluate_source
from dwise_predict.trainers.loader import ShufflePlan
from dwise_predict.trainers.refinement import RefinementConfig, train_refinement
from dwise_predict.trainers.streaming import ArraySource, ParquetSource, scan_stats
from synthetic_traces import make_traces

from dwise_predict.bundle import Bundle, load_bundle
from dwise_predict.errors import ConfigError, TraceError
from dwise_predict.traces import read_traces

H = 32
CFG = RefinementConfig(members=2, epochs=3, batch_size=64, chunk_rows=128, window_chunks=2)


def write_shards(folder: Path, table, rows_per_shard: int, row_group: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for k, start in enumerate(range(0, table.num_rows, rows_per_shard)):
        pq.write_table(
            table.slice(start, rows_per_shard),
            folder / f"part-{k:03d}.parquet",
            row_group_size=row_group,
        )
    return folder


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """600 training traces in 3 shards of row groups (70 rows) that cut across the chunks (128)."""
    folder = tmp_path_factory.mktemp("traces")
    table = make_traces(600, H, seed=3)
    return write_shards(folder / "train", table, 200, 70), table


def test_parquet_source_reads_rows_across_row_groups_and_shards(sharded):
    folder, _ = sharded
    source = ParquetSource(folder)
    whole = read_traces(folder)
    assert source.n == 600 and len(source._groups) == 3 * 3
    part = source.read_table(150, 420, ["request_id", "total_rounds"])  # 3 files, 5 row groups
    assert part.column("request_id").to_pylist() == whole.column("request_id").to_pylist()[150:420]
    inside = source.read_table(10, 30, ["request_id"])  # both ends inside one row group
    assert inside.column("request_id").to_pylist() == whole.column("request_id").to_pylist()[10:30]
    got = source.read(190, 215)
    want = trace_arrays(whole).subset(np.arange(190, 215))
    assert np.array_equal(got.hidden, want.hidden) and list(got.request_id) == list(want.request_id)


def test_parquet_source_reads_through_a_pyarrow_filesystem(sharded):
    """The object-storage path: a pyarrow filesystem (here a local subtree) and a relative key."""
    from pyarrow import fs

    folder, _ = sharded
    sub = fs.SubTreeFileSystem(str(folder.parent), fs.LocalFileSystem())
    source = ParquetSource(folder.name, filesystem=sub)
    assert source.n == 600
    want = ParquetSource(folder).read(0, 600).total_rounds
    assert np.array_equal(source.read(0, 600).total_rounds, want)


def test_parquet_source_refuses_shards_of_different_models(tmp_path):
    write_shards(tmp_path / "a", make_traces(40, H, seed=0), 40, 40)
    other = make_traces(40, H + 8, seed=1, id_prefix="other")
    meta = dict(other.schema.metadata)
    meta[b"dwise.fingerprint"] = meta[b"dwise.fingerprint"].replace(b"planted-bd", b"planted-xx")
    pq.write_table(other.replace_schema_metadata(meta), tmp_path / "a" / "part-999.parquet")
    with pytest.raises(TraceError, match="different models"):
        ParquetSource(tmp_path / "a")


def test_stats_read_in_chunks_equal_stats_of_the_whole(sharded):
    _, table = sharded
    arrays = trace_arrays(table)
    chunked = scan_stats(ArraySource(arrays), chunk_rows=37)
    h = arrays.hidden.astype(np.float64)
    assert np.allclose(chunked.hidden_mean, h.mean(axis=0), rtol=0, atol=1e-6)
    assert np.allclose(chunked.hidden_std, h.std(axis=0), rtol=1e-5)
    assert arrays.remaining.max() == chunked.K
    assert list(chunked.category_names()) == list(arrays.category)


def test_plan_gives_each_row_to_one_shard_and_every_process_the_same_steps():
    keep = np.random.default_rng(0).random(1000) < 0.7
    plan = ShufflePlan.for_shards(
        1000, 2 * 3, chunk_rows=64, window_chunks=2, batch_size=16, seed=5, keep=keep
    )
    quota = plan.quotas(epoch=1, world=2, workers=3)
    per_process = quota.reshape(2, 3).sum(axis=1)
    assert per_process[0] == per_process[1]
    seen = []
    for shard in range(6):
        rows_of_shard = []
        for w, chunk_ids in enumerate(plan.shard_windows(1, shard, 6)):
            rows = plan.window_rows(chunk_ids)
            rows_of_shard += [rows[b] for b in plan.window_batches(chunk_ids, 1, shard, w)]
        assert len(rows_of_shard) >= quota[shard]
        seen.append(np.concatenate(rows_of_shard))
    allrows = np.concatenate(seen)
    assert len(allrows) == len(set(allrows.tolist())) == keep.sum()  # each kept row once, no other
    # a new epoch is a new order, the same epoch the same order
    assert not np.array_equal(plan.shard_windows(1, 0, 6)[0], plan.shard_windows(2, 0, 6)[0])
    assert np.array_equal(plan.shard_windows(1, 0, 6)[0], plan.shard_windows(1, 0, 6)[0])


def test_streamed_training_and_evaluation_equal_in_memory(sharded, tmp_path):
    folder, table = sharded
    in_memory = train_refinement(table, CFG)
    streamed = train_refinement(ParquetSource(folder), CFG)
    for a, b in zip(in_memory.members, streamed.members):
        assert np.array_equal(a.w1, b.w1) and np.array_equal(a.b2, b.b2)
    assert np.array_equal(in_memory.calibration.y_thresholds, streamed.calibration.y_thresholds)
    bundle = Bundle(
        path=tmp_path,
        manifest={},
        fingerprint=None,  # type: ignore[arg-type]
        modules={streamed.kind: streamed},
    )
    ev = make_traces(300, H, seed=4, id_prefix="ev")
    write_shards(tmp_path / "ev", ev, 300, 64)
    m_mem, _ = evaluate_arrays(bundle, trace_arrays(ev), chunk_rows=100)
    m_str, _ = evaluate_source(bundle, ParquetSource(tmp_path / "ev"), chunk_rows=100)
    assert json.dumps(m_mem, sort_keys=True) == json.dumps(m_str, sort_keys=True)


def test_device_options_reach_the_tiny_bd_trainer():
    from dwise_predict.zoo.tiny_bd.recipe.train import TrainConfig, build_parser, make_trainer
    from pytorch_lightning.accelerators import CPUAccelerator
    from pytorch_lightning.strategies import DDPStrategy, SingleDeviceStrategy

    plain = build_parser().parse_args(["--out", "x"])
    default = make_trainer(TrainConfig(), DeviceConfig.from_args(plain))
    assert isinstance(default.accelerator, CPUAccelerator)
    assert isinstance(default.strategy, SingleDeviceStrategy)
    assert default.num_devices == 1 and default.precision == "32-true"
    args = build_parser().parse_args(
        [
            "--out",
            "x",
            "--accelerator",
            "cpu",
            "--devices",
            "2",
            "--strategy",
            "ddp",
            "--precision",
            "bf16-mixed",
            "--num-nodes",
            "1",
        ]
    )
    ddp = make_trainer(TrainConfig(), DeviceConfig.from_args(args))
    assert isinstance(ddp.strategy, DDPStrategy) and ddp.num_devices == 2
    assert ddp.precision == "bf16-mixed"
    gpu = build_parser().parse_args(["--out", "x", "--accelerator", "gpu"])
    # the option reaches Lightning, which finds no GPU on this machine
    with pytest.raises(Exception, match="(?i)gpu|cuda"):
        make_trainer(TrainConfig(), DeviceConfig.from_args(gpu))


def test_device_config_refuses_bad_values_with_the_option_name():
    assert parse_devices("2") == 2 and parse_devices("0,1") == "0,1"
    assert parse_devices("auto") == "auto"
    with pytest.raises(ConfigError, match="--devices"):
        parse_devices("two")
    with pytest.raises(ConfigError, match="--precision"):
        DeviceConfig(precision="fp8")
    with pytest.raises(ConfigError, match="--num-nodes"):
        DeviceConfig(num_nodes=0)


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_matches_one_process(tmp_path):
    """torchrun, 2 processes, DDP over gloo, streamed shards: the multi-GPU / multi-node code path.

    The single-process run trains in this process on the same traces (read whole); the two runs
    differ in batch composition and dropout draws, not in data or hyper-parameters.
    """
    from dwise_predict.trainers.pipeline import train_bundle

    train = write_shards(tmp_path / "train", make_traces(1200, H, seed=0), 400, 128)
    ev = trace_arrays(make_traces(1000, H, seed=1, id_prefix="ev"))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "dwise_predict",
        "train",
        "--traces",
        str(train),
        "--out",
        str(tmp_path / "ddp"),
        "--only",
        "refinement",
        "--epochs",
        "10",
        "--allow-single-category",
        "--streaming",
        "--accelerator",
        "cpu",
        "--devices",
        "2",
        "--strategy",
        "ddp",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    train_bundle(
        train,
        tmp_path / "one",
        only="refinement",
        configs={"refinement": RefinementConfig(epochs=10)},
        allow_single_category=True,
    )
    one, ddp = load_bundle(tmp_path / "one"), load_bundle(tmp_path / "ddp")
    assert ddp.refinement.info["processes"] == 2 and one.refinement.info["processes"] == 1
    m_one, _ = evaluate_arrays(one, ev)
    m_ddp, _ = evaluate_arrays(ddp, ev)
    for name in ("refined_raw", "refined"):
        assert abs(m_ddp[name]["spearman"] - m_one[name]["spearman"]) <= 0.01, name
    ratio = m_ddp["refined"]["median_ratio"] / m_one["refined"]["median_ratio"]
    assert abs(ratio - 1) <= 0.02, ratio
