"""ONNX / INT8 export of the predictors: parity and latency against the native predictors.

Per predictor, in one run, single-threaded (a scheduler's thread; numpy/BLAS and onnxruntime both
pinned to 1 thread): the max abs error of the ONNX FP32 file against the native predictor on
probes (admission: log total rounds at every split threshold; refinement: raw mean remaining
rounds), and the median latency of native vs ONNX at batch 1 and 128. For the refinement
ensemble, INT8 dynamic quantization: speed-up over FP32 ONNX and the change of the estimates
(max / mean abs change, Spearman rank agreement with the native estimate); the INT8 file is kept
only when its parity gate passes and it is faster (``export/parity.py``). The admission forest has
no weight matrix, so INT8 does not apply to it (reported as such).

Default models are synthetic with the paper's shapes (admission: LightGBM, 100 trees, 15 leaves,
3 count features; refinement: 3 members, hidden 2,048 + 2, width 256, K = 279); ``--bundle DIR``
measures a trained bundle's predictors instead.

    python benchmarks/export.py [--bundle DIR] [--repeats 30]

Prints a table and writes benchmarks/results/export.json.
"""

from __future__ import annotations

import os

for _var in (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
):  # before numpy loads BLAS
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from dwise_predict.export.onnx_admission import admission_to_onnx, check_admission  # noqa: E402
from dwise_predict.export.onnx_refinement import (  # noqa: E402
    check_refinement,
    refinement_probes,
    refinement_to_onnx,
)
from dwise_predict.export.parity import gate_int8  # noqa: E402
from dwise_predict.export.quantize import NotQuantizable, quantize_int8  # noqa: E402

from dwise_predict.atomic import write_json  # noqa: E402
from dwise_predict.bundle import load_bundle  # noqa: E402
from dwise_predict.predictors import AdmissionModel, IsotonicMap, MLPWeights, RefinementEnsemble  # noqa: E402
from dwise_predict.predictors.onnx_runtime import OnnxRefinement  # noqa: E402
from dwise_predict.ranking import spearman  # noqa: E402
from dwise_predict.tables import format_table  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "export.json"


def synthetic_admission(seed: int = 0) -> AdmissionModel:
    """LightGBM, 100 trees, <= 15 leaves, on word/newline/token counts -> log(rounds) with noise."""
    import lightgbm as lgb

    rng = np.random.default_rng(seed)
    n = 4096
    tokens = rng.integers(8, 2048, n)
    words = np.floor(tokens * rng.uniform(0.6, 0.8, n))
    newlines = rng.poisson(tokens / 60)
    y = np.log(4 + 0.05 * tokens + 3 * newlines) + rng.normal(0, 0.4, n)
    X = np.stack([words, newlines, tokens], axis=1).astype(np.float64)
    params = {
        "objective": "regression",
        "num_leaves": 15,
        "learning_rate": 0.1,
        "verbose": -1,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": 1,
        "seed": seed,
    }
    booster = lgb.train(params, lgb.Dataset(X, y), num_boost_round=100)
    return AdmissionModel(booster.model_to_string())


def synthetic_refinement(
    seed: int = 0, hidden: int = 2048, width: int = 256, k: int = 279, members: int = 3
) -> RefinementEnsemble:
    """Paper-shaped ensemble with torch-default-like init and hazards near 1/40 (not trained)."""
    rng = np.random.default_rng(seed)

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return rng.uniform(-1, 1, shape).astype(np.float32) / np.sqrt(fan_in, dtype=np.float32)

    ms = [
        MLPWeights(
            uniform((hidden + 2, width), hidden + 2),
            uniform((width,), hidden + 2),
            uniform((width, k), width) * 4,
            (uniform((k,), width) - 3.7).astype(np.float32),
        )
        for _ in range(members)
    ]
    x = np.linspace(0, 200, 64)
    iso = IsotonicMap(x, np.log1p(0.85 * x), "log1p")
    return RefinementEnsemble(
        ms,
        rng.normal(0, 1, hidden).astype(np.float32),
        rng.uniform(0.5, 2.0, hidden).astype(np.float32),
        1024.0,
        256.0,
        iso,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--bundle",
        type=Path,
        default=None,
        help="a trained bundle folder (default: synthetic models)",
    )
    ap.add_argument(
        "--repeats", type=int, default=30, help="timed repetitions per median (default 30)"
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    if args.bundle is not None:
        bundle = load_bundle(args.bundle)
        admission, refinement = bundle.need(AdmissionModel), bundle.need(RefinementEnsemble)
        source = str(args.bundle)
    else:
        admission, refinement = synthetic_admission(), synthetic_refinement()
        source = "synthetic (paper shapes)"

    rows, records = [], []
    with tempfile.TemporaryDirectory(prefix="dwise-bench-export-") as tmp:
        t0 = time.perf_counter()
        adm_path = admission_to_onnx(admission, Path(tmp) / "admission.onnx")
        t_adm = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref_path = refinement_to_onnx(refinement, Path(tmp) / "refinement.onnx")
        t_ref = time.perf_counter() - t0
        t0 = time.perf_counter()
        int8_path = quantize_int8(ref_path)
        t_q = time.perf_counter() - t0
        try:
            quantize_int8(adm_path)
            adm_int8 = "quantized"
        except NotQuantizable as e:
            adm_int8 = f"not applicable: {e}"

        adm = check_admission(admission, adm_path, repeats=args.repeats)
        probes = refinement_probes(refinement, n=512)
        ref32 = check_refinement(refinement, ref_path, probes=probes, repeats=args.repeats)
        ref8 = gate_int8(
            check_refinement(
                refinement, int8_path, probes=probes, peer=ref_path, repeats=args.repeats
            )
        )

        native = refinement.predict(*probes, raw=True)
        q = OnnxRefinement(int8_path).predict(*probes, raw=True)
        int8_change = {
            "max_abs_change": float(np.max(np.abs(q - native))),
            "mean_abs_change": float(np.mean(np.abs(q - native))),
            "mean_rel_change": float(np.mean(np.abs(q - native) / np.maximum(native, 1e-9))),
            "spearman_vs_native": spearman(native, q),
            "speedup_vs_fp32": {b: v["peer"] / v["exported"] for b, v in ref8.latency_us.items()},
        }
        sizes = {p.name: p.stat().st_size for p in (adm_path, ref_path, int8_path)}

    for c in (adm, ref32, ref8):
        lat = c.latency_us
        rows.append(
            [
                c.predictor,
                c.precision,
                c.parity.max_abs_error,
                c.parity.tolerance.abs,
                lat["1"]["native"],
                lat["1"]["exported"],
                lat["128"]["native"],
                lat["128"]["exported"],
                "yes" if c.kept else "no",
            ]
        )
        records.append(c.to_dict())
    print(f"models: {source}; 1 thread; medians of {args.repeats} timings")
    print(
        format_table(
            [
                "predictor",
                "precision",
                "max abs err",
                "tolerance",
                "native µs b=1",
                "onnx µs b=1",
                "native µs b=128",
                "onnx µs b=128",
                "kept",
            ],
            rows,
        )
    )
    print(
        f"INT8 refinement: speed-up vs FP32 b=1 {int8_change['speedup_vs_fp32']['1']:.2f}x, "
        f"b=128 {int8_change['speedup_vs_fp32']['128']:.2f}x; estimate change max "
        f"{int8_change['max_abs_change']:.3g} rounds, mean {int8_change['mean_abs_change']:.3g} "
        f"rounds; Spearman vs native {int8_change['spearman_vs_native']:.5f}; kept: {ref8.kept} "
        f"({ref8.reason})"
    )
    print(f"admission INT8: {adm_int8}")

    out = {
        "source": source,
        "threads": 1,
        "repeats": args.repeats,
        "export_seconds": {"admission": t_adm, "refinement": t_ref, "int8": t_q},
        "file_bytes": sizes,
        "checks": records,
        "refinement_int8": int8_change,
        "admission_int8": adm_int8,
        "shapes": {
            "refinement_hidden": refinement.hidden_size,
            "K": refinement.K,
            "members": len(refinement.members),
            "admission_trees": admission.forest.n_trees,
        },
        "environment": {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "onnxruntime": _version("onnxruntime"),
            "torch": _version("torch"),
            "lightgbm": _version("lightgbm"),
            "onnxmltools": _version("onnxmltools"),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, out, sort_keys=False)
    print(f"wrote {args.out}")


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


if __name__ == "__main__":
    main()
