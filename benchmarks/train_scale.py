"""Training at scale: streamed traces under a memory cap, the in-memory path beside it, DDP.

Data: SYNTHETIC traces with the planted signal of tests/synthetic_traces.py (categories, prompt
features and rounds from it; the 2,048-wide first-round hidden state built from each request's
block count and rounds per block plus noise), written as Parquet shards with 1,024-row groups.

Runs, each in a fresh process (peak RSS = that process's ``VmHWM``; not ``ru_maxrss``, which a
child started by ``subprocess`` inherits from its parent across ``execve``):

* ``streaming`` on the large set, with ``RLIMIT_DATA`` set to the process's own size after its
  imports plus ``--cap-mib``: the hidden states alone are ``--scale`` times that cap. Trains the
  refinement ensemble (``--epochs``) and evaluates it on the eval set, streamed.
* ``in-memory`` on the large set under the same cap: expected to fail (it reads every hidden
  state at once); the error is recorded.
* ``in-memory`` and ``streaming`` on a small set (no cap): both peaks, and the metrics, which
  must be equal.
* ``--ddp``: the refinement ensemble trained by one process and by 2 processes (torchrun, DDP
  over gloo) on the same split, evaluated on the same eval set.

Run: ``.venv/bin/python benchmarks/train_scale.py`` (prints a table, writes
``benchmarks/results/train_scale.json``; data under ``runs/train-scale``). ``--quick`` is a smoke
test with a 64 MiB cap.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
MIB = 1 << 20
H = 2048


def write_set(
    folder: Path,
    n: int,
    seed: int,
    *,
    rows_per_shard: int = 16_384,
    row_group: int = 1024,
    prefix: str = "req",
) -> Path:
    """``n`` SYNTHETIC traces in shards; categories, features and rounds from make_traces."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from synthetic_traces import make_traces

    if (folder / "_done").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    dirs = np.random.default_rng(12345).normal(size=(8, H)).astype(np.float32)
    for k, start in enumerate(range(0, n, rows_per_shard)):
        rows = min(rows_per_shard, n - start)
        base = make_traces(rows, 4, seed=seed * 1000 + k, id_prefix=f"{prefix}{k}")
        blocks = np.asarray(base.column("output_blocks").to_numpy(), dtype=np.float64)
        rounds = np.asarray(base.column("total_rounds").to_numpy(), dtype=np.float64)
        names = base.column("category").to_numpy(zero_copy_only=False)
        cat = np.unique(names, return_inverse=True)[1]
        z_blocks = (np.log(blocks) - 1.0) / 0.6
        z_steps = (np.log(rounds / blocks) - 1.5) / 0.45
        rng = np.random.default_rng([seed, k])
        hidden = (
            dirs[2 + cat]
            + z_blocks[:, None] * dirs[0]
            + z_steps[:, None] * dirs[1]
            + 2.0 * rng.standard_normal((rows, H), dtype=np.float32)
        ).astype(np.float32)
        offsets = pa.array(np.arange(0, rows * H + 1, H, dtype=np.int32))
        col = pa.ListArray.from_arrays(offsets, pa.array(hidden.reshape(-1)))
        i = base.schema.get_field_index("first_round_hidden")
        table = base.set_column(i, base.schema.field(i), col)
        table = table.set_column(
            table.schema.get_field_index("hidden_size"),
            "hidden_size",
            pa.array(np.full(rows, H, dtype=np.int32)),
        )
        meta = dict(base.schema.metadata)
        fp = json.loads(meta[b"dwise.fingerprint"])
        fp["hidden_size"] = H
        meta[b"dwise.fingerprint"] = json.dumps(fp).encode()
        table = table.cast(base.schema).replace_schema_metadata(meta)
        pq.write_table(table, folder / f"part-{k:04d}.parquet", row_group_size=row_group)
    (folder / "_done").write_text(str(n))
    return folder


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def _bare_bundle(ensemble: Any, where: str) -> Any:
    """A bundle of just ``ensemble``, in memory, for evaluation (no manifest, no fingerprint)."""
    from dwise_predict.bundle import Bundle

    fingerprint: Any = None
    return Bundle(Path(where), {}, fingerprint, {ensemble.kind: ensemble})


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One measured run in this process (see the module doc); returns its figures."""
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.evaluate import evaluate_arrays, evaluate_source
    from dwise_predict.trainers.refinement import RefinementConfig, train_refinement
    from dwise_predict.trainers.streaming import ParquetSource

    # a 2,048-row shuffle window (16 MiB of hidden states): the window, its normalized copy and
    # the chunks it was joined from are what training holds at once
    cfg = RefinementConfig(epochs=args.epochs, chunk_rows=512, window_chunks=4)
    out: dict[str, Any] = {"path": args.run, "traces": args.traces}
    out["imports_rss_mib"] = _status("VmRSS") / MIB
    # Warm up the machinery on 1,024 rows first: Lightning's fit imports more modules and torch
    # and pyarrow start their thread pools on first use (~230 MiB that does not grow with the
    # set). The cap and "above baseline" then measure what depends on the data. A pool thread
    # that could not get its stack under RLIMIT_DATA would also leave a reader waiting forever.
    warm = ParquetSource(args.traces).read(0, 1024)
    warm_cfg = RefinementConfig(epochs=1, chunk_rows=512, window_chunks=4)
    warm_ens = train_refinement(warm, warm_cfg)
    warm_bundle = _bare_bundle(warm_ens, args.traces)
    evaluate_arrays(warm_bundle, warm, cfg.chunk_rows)
    del warm, warm_ens, warm_bundle
    gc.collect()
    baseline_rss = _status("VmRSS")
    out["baseline_rss_mib"] = baseline_rss / MIB
    if args.cap_mib:
        limit = _status("VmData") + args.cap_mib * MIB
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        out["rlimit_data_mib"] = limit / MIB
    t0 = time.perf_counter()
    try:
        if args.run == "streaming":
            source = ParquetSource(args.traces)
            n = source.n
            ensemble = train_refinement(source, cfg)
        else:
            arrays = trace_arrays(args.traces, need_hidden=True)
            n = arrays.n
            ensemble = train_refinement(arrays, cfg)
            del arrays
        train_s = time.perf_counter() - t0
        bundle = _bare_bundle(ensemble, args.traces)
        t1 = time.perf_counter()
        if args.run == "streaming":
            evs = ParquetSource(args.eval)
            metrics, _ = evaluate_source(bundle, evs, cfg.chunk_rows)
        else:
            metrics, _ = evaluate_arrays(
                bundle, trace_arrays(args.eval, need_hidden=True), cfg.chunk_rows
            )
        eval_s = time.perf_counter() - t1
        out.update(
            ok=True,
            n_train=n,
            n_eval=metrics["n_requests"],
            train_seconds=train_s,
            eval_seconds=eval_s,
            train_traces_per_s=n * cfg.epochs * cfg.members / train_s,
            eval_traces_per_s=metrics["n_requests"] / eval_s,
            metrics={
                k: {"spearman": metrics[k]["spearman"], "median_ratio": metrics[k]["median_ratio"]}
                for k in ("refined_raw", "refined")
            },
        )
    except (MemoryError, RuntimeError, OSError) as e:  # the cap hit (numpy, torch, arrow)
        out.update(
            ok=False,
            error=f"{type(e).__name__}: {str(e)[:160]}",
            seconds_until_error=time.perf_counter() - t0,
        )
    out["peak_rss_mib"] = _status("VmHWM") / MIB
    out["peak_data_mib"] = _status("VmData") / MIB  # what RLIMIT_DATA counts, at the end
    out["peak_above_baseline_mib"] = out["peak_rss_mib"] - baseline_rss / MIB
    return out


def run_child(run: str, traces: Path, eval_: Path, epochs: int, cap_mib: int = 0) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--run",
        run,
        "--traces",
        str(traces),
        "--eval",
        str(eval_),
        "--epochs",
        str(epochs),
        "--cap-mib",
        str(cap_mib),
    ]
    # Arrow's system allocator: jemalloc's retained arenas would count against RLIMIT_DATA
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "system"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {
            "path": run,
            "traces": str(traces),
            "ok": False,
            "error": f"exit {done.returncode}: {done.stderr.strip()[-300:]}",
        }
    return json.loads(lines[-1])


def ddp_comparison(work: Path, epochs: int) -> dict[str, Any]:
    """Refinement by one process vs torchrun --nproc-per-node 2 (DDP, gloo) on the same split."""
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.evaluate import evaluate_arrays
    from dwise_predict.trainers.pipeline import train_bundle
    from dwise_predict.trainers.refinement import RefinementConfig
    from synthetic_traces import make_traces, write_traces

    from dwise_predict.bundle import load_bundle

    first = work / "ddp-train" / "part-0000.parquet"
    train = write_traces(first, make_traces(4096, 256, seed=0)).parent
    ev = trace_arrays(make_traces(2048, 256, seed=1, id_prefix="ev"))
    t0 = time.perf_counter()
    train_bundle(
        train,
        work / "ddp-one",
        only="refinement",
        configs={"refinement": RefinementConfig(epochs=epochs)},
        overwrite=True,
    )
    one_s = time.perf_counter() - t0
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
        str(work / "ddp-two"),
        "--only",
        "refinement",
        "--epochs",
        str(epochs),
        "--streaming",
        "--force",
        "--accelerator",
        "cpu",
        "--devices",
        "2",
        "--strategy",
        "ddp",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    two_s = time.perf_counter() - t0
    res: dict[str, Any] = {
        "n_train": 4096,
        "n_eval": 2048,
        "hidden_size": 256,
        "epochs": epochs,
        "command": " ".join(cmd[1:]).replace(str(ROOT) + "/", ""),
    }
    for name, path, secs in (
        ("one_process", work / "ddp-one", one_s),
        ("ddp_2", work / "ddp-two", two_s),
    ):
        b = load_bundle(path)
        m, _ = evaluate_arrays(b, ev)
        res[name] = {
            "wall_seconds": secs,
            "train_seconds": b.refinement.info["train_seconds"],
            **{
                k: {"spearman": m[k]["spearman"], "median_ratio": m[k]["median_ratio"]}
                for k in ("refined_raw", "refined")
            },
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--run", default="streaming", help=argparse.SUPPRESS)
    ap.add_argument("--traces", help=argparse.SUPPRESS)
    ap.add_argument("--eval", help=argparse.SUPPRESS)
    ap.add_argument(
        "--cap-mib",
        type=int,
        default=256,
        help="memory cap above the warmed-up baseline (default: 256)",
    )
    ap.add_argument("--scale", type=float, default=4.0, help="hidden states / cap (default: 4)")
    ap.add_argument(
        "--epochs", type=int, default=1, help="refinement epochs on the large set (default: 1)"
    )
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "train-scale")
    ap.add_argument("--no-ddp", action="store_true", help="skip the DDP comparison")
    ap.add_argument("--quick", action="store_true", help="64 MiB cap, small sets (smoke test)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0
    if args.quick:
        args.cap_mib = 64
    per_trace = H * 4
    n_large = int(args.scale * args.cap_mib * MIB / per_trace) + 1
    n_small = max(1024, n_large // 16)
    t0 = time.perf_counter()
    large = write_set(args.work / f"large-{n_large}", n_large, seed=0)
    small = write_set(args.work / f"small-{n_small}", n_small, seed=2)
    ev = write_set(args.work / f"eval-{n_small}", n_small, seed=1, prefix="ev")
    print(
        f"data ready in {time.perf_counter() - t0:.0f}s: large {n_large} traces "
        f"({n_large * per_trace / MIB:.0f} MiB of hidden states), small {n_small}",
        file=sys.stderr,
    )
    runs = [
        run_child("streaming", large, ev, args.epochs, args.cap_mib),
        run_child("in-memory", large, ev, args.epochs, args.cap_mib),
        run_child("in-memory", small, ev, 3),
        run_child("streaming", small, ev, 3),
    ]
    result: dict[str, Any] = {
        "benchmark": "train_scale",
        "data": "SYNTHETIC planted traces (tests/synthetic_traces.py signal)",
        "hidden_size": H,
        "cap_mib_above_imports": args.cap_mib,
        "n_large": n_large,
        "n_small": n_small,
        "hidden_mib_large": n_large * per_trace / MIB,
        "hidden_mib_small": n_small * per_trace / MIB,
        "runs": runs,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "command": "python benchmarks/train_scale.py" + (" --quick" if args.quick else ""),
    }
    small_mem, small_str = runs[2].get("metrics"), runs[3].get("metrics")
    result["small_metrics_equal"] = small_mem is not None and small_mem == small_str
    if not args.no_ddp:
        try:
            result["ddp"] = ddp_comparison(args.work, epochs=10)
        except subprocess.CalledProcessError as e:  # keep the memory runs; say what failed
            tail = (e.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
            result["ddp_error"] = f"exit {e.returncode}: " + " | ".join(tail)
    print_table(result)
    out = ROOT / "benchmarks" / "results" / "train_scale.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    os.replace(tmp, out)
    print(f"\nwritten to {out.relative_to(ROOT)}")
    return 0


def print_table(r: dict[str, Any]) -> None:
    def f(v: Any, fmt: str = ".0f") -> str:
        return "-" if v is None else format(v, fmt)

    print(
        f"hidden states: large {r['hidden_mib_large']:.0f} MiB ({r['n_large']} traces), small "
        f"{r['hidden_mib_small']:.0f} MiB; cap {r['cap_mib_above_imports']} MiB above the "
        "baseline (imports + a 1,024-row warm-up)"
    )
    print(
        f"{'path':<10} {'set':<6} {'cap':>5} {'peak RSS':>9} {'above baseline':>15} "
        f"{'train tr/s':>11} "
        f"{'eval tr/s':>10} {'rho':>6} {'median':>7}  result"
    )
    for run, size in zip(r["runs"], ("large", "large", "small", "small")):
        m = (run.get("metrics") or {}).get("refined", {})
        print(
            f"{run['path']:<10} {size:<6} {'yes' if run.get('rlimit_data_mib') else 'no':>5} "
            f"{f(run.get('peak_rss_mib')):>7}Mi {f(run.get('peak_above_baseline_mib')):>13}Mi "
            f"{f(run.get('train_traces_per_s')):>11} {f(run.get('eval_traces_per_s')):>10} "
            f"{f(m.get('spearman'), '.3f'):>6} {f(m.get('median_ratio'), '.3f'):>7}  "
            f"{'ok' if run.get('ok') else run.get('error', '')[:60]}"
        )
    print(f"small set: streaming metrics equal in-memory metrics: {r['small_metrics_equal']}")
    if "ddp" in r:
        d = r["ddp"]
        for name in ("one_process", "ddp_2"):
            print(
                f"{name:<12} rho raw {d[name]['refined_raw']['spearman']:.4f} calibrated "
                f"{d[name]['refined']['spearman']:.4f} median ratio "
                f"{d[name]['refined']['median_ratio']:.4f} "
                f"train {d[name]['train_seconds']:.1f}s"
            )


if __name__ == "__main__":
    raise SystemExit(main())
