"""Predictor latency and training time, each figure a median beside a peer measured in the same run.

Data: SYNTHETIC planted traces (tests/synthetic_traces.py), 2,048 training requests with
2,048-dimensional hidden vectors, 5 categories. Figures (issue 5 goals in brackets):

* admission, model only, 1 request [<= 10 µs] vs ``lightgbm.Booster.predict`` on the same row
* admission, batch of 128, per request [<= 2 µs] vs ``Booster.predict`` on the same batch
* admission from raw text incl. chat template + tokenization [<= 0.2 ms] vs featurizer + Booster
* refinement on CPU, numpy, 1 request and batch of 128 at H = 2,048 [<= 0.3 ms for 1] vs the torch
path
* training: 3-member refinement ensemble on 2,048 x 2,048 [<= 60 s] beside the admission model

Run: ``.venv/bin/python benchmarks/predictors.py`` (prints a table, writes
``benchmarks/results/predictors.json``). ``--quick`` uses 512 training requests (smoke test).
"""

from __future__ import annotations

import argparse
import os

# One thread for every library, ours and the peers alike: a scheduler predicts on its own thread,
# and multi-threaded BLAS/OpenMP for one small request only adds synchronisation (and collapses
# on a shared machine). Set before numpy/torch/lightgbm load their thread pools.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
for _var in THREAD_VARS:
    os.environ.setdefault(_var, "1")

import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def per_call_us(fn, *, loops: int, repeats: int = 7) -> float:
    """Median over ``repeats`` of the mean time per call over ``loops`` calls, in µs."""
    fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        samples.append((time.perf_counter_ns() - t0) / loops / 1e3)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="512 training requests instead of 2,048")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "predictors.json"))
    args = ap.parse_args()

    import torch
    from dwise_predict.trainers.admission import train_admission
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.refinement import (
        RefinementConfig,
        ensemble_to_torch,
        train_refinement,
    )
    from synthetic_traces import make_traces, synthetic_featurizer

    from dwise_predict.atomic import write_json
    from dwise_predict.tables import format_table

    torch.set_num_threads(1)
    n_train, hidden = (512, 2048) if args.quick else (2048, 2048)
    train = make_traces(n_train, hidden, seed=0)
    ev = trace_arrays(make_traces(256, hidden, seed=1))
    featurizer = synthetic_featurizer()

    t0 = time.perf_counter()
    admission = train_admission(train, featurizer=featurizer)
    t_adm = time.perf_counter() - t0
    t0 = time.perf_counter()
    refinement = train_refinement(train, RefinementConfig(seed=0))
    t_ref = time.perf_counter() - t0

    booster = admission.booster()
    row = ev.features[0].tolist()
    row_np = ev.features[:1]
    batch = ev.features[:128]
    prompt = make_traces(1, hidden, seed=2).column("prompt")[0].as_py()
    assert np.array_equal(np.log(admission.predict_features(batch)), booster.predict(batch))

    results = []

    def add(name, ours, peer, peer_name, goal):
        results.append(
            {
                "figure": name,
                "median_us": ours,
                "peer": peer_name,
                "peer_median_us": peer,
                "speedup_vs_peer": peer / ours,
                "goal_us": goal,
                "meets_goal": ours <= goal,
            }
        )

    add(
        "admission model-only, 1 request",
        per_call_us(lambda: admission.predict_one(row), loops=20000),
        per_call_us(lambda: booster.predict(row_np, num_threads=1), loops=500),
        "lightgbm.Booster.predict (same row)",
        10.0,
    )
    ours_b = per_call_us(lambda: admission.predict_features(batch), loops=2000) / 128
    peer_b = per_call_us(lambda: booster.predict(batch, num_threads=1), loops=200) / 128
    add(
        "admission batch of 128, per request",
        ours_b,
        peer_b,
        "lightgbm.Booster.predict (same batch)",
        2.0,
    )
    add(
        "admission from raw text (template + tokenize + model)",
        per_call_us(lambda: admission.predict([prompt]), loops=2000),
        per_call_us(lambda: booster.predict(featurizer([prompt]), num_threads=1), loops=300),
        "featurizer + Booster.predict",
        200.0,
    )

    module = ensemble_to_torch(refinement)
    h1, p1, b1 = ev.hidden[:1], ev.prompt_tokens[:1], ev.output_budget[:1]
    hb, pb, bb = ev.hidden[:128], ev.prompt_tokens[:128], ev.output_budget[:128]
    th1, tp1, tb1 = (torch.from_numpy(a) for a in (h1, p1, b1))
    thb, tpb, tbb = (torch.from_numpy(a) for a in (hb, pb, bb))
    with torch.inference_mode():
        add(
            "refinement numpy CPU, 1 request (H=2048)",
            per_call_us(lambda: refinement.predict(h1, p1, b1), loops=300),
            per_call_us(lambda: module(th1, tp1, tb1), loops=300),
            "torch path on CPU (same weights)",
            300.0,
        )
        ours_rb = per_call_us(lambda: refinement.predict(hb, pb, bb), loops=30)
        peer_rb = per_call_us(lambda: module(thb, tpb, tbb), loops=30)
        add(
            "refinement numpy CPU, batch of 128, per request (H=2048)",
            ours_rb / 128,
            peer_rb / 128,
            "torch path on CPU (same weights)",
            float("inf"),
        )
    training = {
        "figure": f"training, 3-member refinement ensemble, {n_train} x {hidden}",
        "seconds": t_ref,
        "peer": "admission LightGBM (same traces)",
        "peer_seconds": t_adm,
        "goal_seconds": 60.0,
        "meets_goal": t_ref <= 60.0,
        "epochs": refinement.info["config"]["epochs"],
        "torch_threads": refinement.info["config"]["num_threads"],
        "single_run": True,
    }

    rows = [
        [
            r["figure"],
            r["median_us"],
            r["peer"],
            r["peer_median_us"],
            f"{r['speedup_vs_peer']:.1f}x",
            "-" if r["goal_us"] == float("inf") else r["goal_us"],
        ]
        for r in results
    ]
    print(format_table(["figure", "median µs", "peer", "peer µs", "ours faster", "goal µs"], rows))
    print()
    print(
        format_table(
            ["training", "seconds", "peer", "peer seconds", "goal s"],
            [[training["figure"], t_ref, training["peer"], t_adm, 60.0]],
        )
    )
    payload = {
        "benchmark": "predictors",
        "data": "SYNTHETIC planted traces (tests/synthetic_traces.py)",
        "n_train": n_train,
        "hidden_size": hidden,
        "latency": [
            {**r, "goal_us": None if r["goal_us"] == float("inf") else r["goal_us"]}
            for r in results
        ],
        "training": training,
        "machine": {
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "load_avg": os.getloadavg(),
            "threads": {v: os.environ[v] for v in THREAD_VARS},
        },
        "command": "python benchmarks/predictors.py" + (" --quick" if args.quick else ""),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, payload)
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
