"""The cost model's figures: planted-profile recovery, tiny-bd's profiled fit, and transfer.

1. **Planted recovery.** Synthetic requests priced by the shipped ``paper-llada2.0-mini``
   profile (1% or 2% log-normal noise per phase) are fitted back, 10 seeds each; relative
   errors of alpha, beta, delta and of K (mean over all N x S cells, mean weighted by how
   often each cell ran, max) for 200 and 400 requests.
2. **tiny-bd, profiled.** The profile traces of a ``dwise-predict profile`` run are fitted
   with each prefill form; 5-fold R^2, MAPE, Spearman rho, pairwise ordering, and how flat K
   is (step 0 vs last step, first vs last output block).
3. **Transfer.** Deployment A = the tiny-bd profile; deployment B = the same requests priced
   by ``paper-llada2.0-mini`` (a different cost structure: MoE-like rising step costs). The
   requests are split in half: B is re-profiled from the first half only, and the cost MAE
   on the second half's true B costs is reported for A's profile unchanged (stale), for A's
   profile rescaled by one constant fitted on the first half (what a direct-cost regressor
   can do without retraining), and for the re-profiled B. Activity is the true activity
   matrix here (the DWS predictor's own error comes on top, in the DWS benchmark).

    python benchmarks/cost_model.py --profile-traces runs/profile

Prints tables and writes benchmarks/results/cost_model.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from dwise_predict.trainers.cost_profile import (
    FitConfig,
    ProfiledRequest,
    fit_cost_profile,
    planted_paper_profile,
    synthetic_requests,
)
from dwise_predict.trainers.profile_traces import read_profile_traces

from dwise_predict.cost import CostProfile
from dwise_predict.tables import format_table

RESULTS = Path(__file__).parent / "results" / "cost_model.json"


def planted(sizes: list[int], noises: list[float], seeds: int) -> list[dict]:
    """Recovery errors over ``seeds`` independent synthetic samples per (size, noise)."""
    truth = planted_paper_profile()
    rows = []
    for n in sizes:
        for noise in noises:
            errs: dict[str, list[float]] = {
                k: []
                for k in (
                    "alpha",
                    "beta",
                    "delta",
                    "K_mean",
                    "K_activity_weighted",
                    "K_max",
                    "cv_r2",
                    "cv_mape",
                )
            }
            t0 = time.perf_counter()
            for seed in range(seeds):
                reqs = synthetic_requests(truth, n, noise=noise, seed=seed)
                fit = fit_cost_profile(
                    reqs,
                    block_size=32,
                    hardware="synthetic",
                    config=FitConfig(n_blocks=truth.n_blocks, seed=seed),
                )
                rel_k = np.abs(fit.K_ms - truth.K_ms) / truth.K_ms
                act = np.zeros_like(rel_k)
                for r in reqs:
                    for b, steps in enumerate(r.rounds_per_block):
                        act[b, :steps] += 1
                for name in ("alpha", "beta", "delta"):
                    got, want = getattr(fit, f"{name}_ms"), getattr(truth, f"{name}_ms")
                    errs[name].append(abs(got - want) / want)
                errs["K_mean"].append(float(rel_k.mean()))
                errs["K_activity_weighted"].append(float((rel_k * act).sum() / act.sum()))
                errs["K_max"].append(float(rel_k.max()))
                errs["cv_r2"].append(fit.cv["r2"] if fit.cv else float("nan"))
                errs["cv_mape"].append(fit.cv["mape"] if fit.cv else float("nan"))
            row: dict = {
                "requests": n,
                "noise": noise,
                "seeds": seeds,
                "fit_s_per_seed": (time.perf_counter() - t0) / seeds,
            }
            for k, v in errs.items():
                row[f"{k}_median"] = float(np.median(v))
                row[f"{k}_max"] = float(np.max(v))
                if k in ("alpha", "beta", "delta", "K_mean"):
                    row[f"{k}_within_5pct"] = float(np.mean(np.array(v) < 0.05))
            rows.append(row)
    return rows


def profiled(
    requests: list[ProfiledRequest], fingerprint: dict, hardware: str, seed: int
) -> dict[str, dict]:
    out = {}
    bs = int(fingerprint.get("block_size", 32))
    for form in ("linear", "quadratic", "auto"):
        fit = fit_cost_profile(
            requests,
            block_size=bs,
            fingerprint=fingerprint,
            hardware=hardware,
            config=FitConfig(prefill=form, seed=seed),
        )
        K = fit.K_ms
        out[form] = {
            "cv": fit.cv,
            "alpha_ms": fit.alpha_ms,
            "alpha2_ms": fit.alpha2_ms,
            "beta_ms": fit.beta_ms,
            "delta_ms": fit.delta_ms,
            "K_block0_step0_ms": float(K[0, 0]),
            "K_block0_last_step_ms": float(K[0, -1]),
            "K_last_block_step0_ms": float(K[-1, 0]),
            "K_min_ms": float(K.min()),
            "K_max_ms": float(K.max()),
            "K_shape": list(K.shape),
            "profile": fit,
        }
    return out


def _costs(profile: CostProfile, reqs: list[ProfiledRequest]) -> np.ndarray:
    return np.array([profile.request_cost(r.rounds_per_block, r.prompt_blocks) for r in reqs])


def transfer(requests: list[ProfiledRequest], profile_a: CostProfile, seed: int) -> dict:
    paper = planted_paper_profile()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(requests))
    half = len(order) // 2
    fit_idx, eval_idx = order[:half], order[half:]

    def on_b(r: ProfiledRequest) -> ProfiledRequest:  # B's measurement of the same request
        nb = len(r.rounds_per_block)
        A = np.arange(paper.max_steps)[None, :] < np.array(r.rounds_per_block)[:, None]
        den = float(np.sum(A * (paper.cell_costs(nb) + paper.delta_ms * r.prompt_blocks)))
        noise = np.exp(rng.normal(0.0, 0.02, size=3))
        return ProfiledRequest(
            r.prompt_blocks,
            r.rounds_per_block,
            paper.alpha_ms * r.prompt_blocks * noise[0],
            den * noise[1],
            paper.beta_ms * nb * noise[2],
        )

    b_reqs = [on_b(r) for r in requests]
    b_fit = [b_reqs[i] for i in fit_idx]
    b_eval = [b_reqs[i] for i in eval_idx]
    true_eval = np.array([r.total_ms for r in b_eval])
    stale = _costs(profile_a, b_eval)
    scale = float(
        np.sum(np.array([r.total_ms for r in b_fit]) * _costs(profile_a, b_fit))
        / np.sum(_costs(profile_a, b_fit) ** 2)
    )
    reprofiled = fit_cost_profile(
        b_fit,
        block_size=profile_a.block_size,
        hardware="deployment B",
        config=FitConfig(n_blocks=profile_a.n_blocks, seed=seed),
    )
    fresh = _costs(reprofiled, b_eval)
    a_true = np.array([requests[i].total_ms for i in eval_idx])
    a_pred = _costs(profile_a, [requests[i] for i in eval_idx])

    def mae(p: np.ndarray, t: np.ndarray) -> float:
        return float(np.mean(np.abs(p - t)))

    return {
        "requests_fit": int(half),
        "requests_eval": int(len(eval_idx)),
        "A_cost_mae_ms_on_A": mae(a_pred, a_true),
        "B_mean_cost_ms": float(true_eval.mean()),
        "B_cost_mae_ms": {
            "stale_A_profile": mae(stale, true_eval),
            "A_profile_rescaled": mae(scale * stale, true_eval),
            "reprofiled_B": mae(fresh, true_eval),
        },
        "rescale_factor": scale,
        "reprofiled_cv": reprofiled.cv,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--profile-traces",
        type=Path,
        required=True,
        help="a `dwise-predict profile --out` folder (or its profile.parquet)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=10, help="synthetic samples per planted setting")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    rows = planted([200, 400], [0.01, 0.02], args.seeds)
    print(
        f"Planted paper-llada2.0-mini profile, recovered over {args.seeds} seeds: median "
        "relative error (share of seeds within 5%)"
    )

    def cell(r: dict, k: str) -> str:
        share = r.get(f"{k}_within_5pct")
        return f"{r[f'{k}_median']:.2%}" + ("" if share is None else f" ({share:.0%})")

    print(
        format_table(
            [
                "requests",
                "noise",
                "alpha",
                "beta",
                "delta",
                "K mean",
                "K act-wtd",
                "K max",
                "CV R2",
                "CV MAPE",
            ],
            [
                [
                    r["requests"],
                    f"{r['noise']:.0%}",
                    cell(r, "alpha"),
                    cell(r, "beta"),
                    cell(r, "delta"),
                    cell(r, "K_mean"),
                    cell(r, "K_activity_weighted"),
                    cell(r, "K_max"),
                    f"{r['cv_r2_median']:.4f}",
                    f"{r['cv_mape_median']:.2%}",
                ]
                for r in rows
            ],
        )
    )

    requests, fingerprint, hardware = read_profile_traces(args.profile_traces)
    fits = profiled(requests, fingerprint, hardware, args.seed)
    print(f"\n{fingerprint.get('model_id')} profiled ({len(requests)} requests, {hardware}):")
    print(
        format_table(
            [
                "prefill",
                "R2",
                "MAPE",
                "Spearman",
                "pairwise",
                "alpha",
                "alpha2",
                "beta",
                "delta",
                "K b0 s0",
                "K b0 last",
                "K last b s0",
            ],
            [
                [
                    f,
                    f"{v['cv']['r2']:.4f}",
                    f"{v['cv']['mape']:.2%}",
                    f"{v['cv']['spearman']:.4f}",
                    f"{v['cv']['pairwise']:.2%}",
                    f"{v['alpha_ms']:.3g}",
                    f"{v['alpha2_ms']:.3g}",
                    f"{v['beta_ms']:.3g}",
                    f"{v['delta_ms']:.3g}",
                    f"{v['K_block0_step0_ms']:.3g}",
                    f"{v['K_block0_last_step_ms']:.3g}",
                    f"{v['K_last_block_step0_ms']:.3g}",
                ]
                for f, v in fits.items()
            ],
        )
    )

    tr = transfer(requests, fits["auto"]["profile"], args.seed)
    b = tr["B_cost_mae_ms"]
    print(
        f"\nTransfer to deployment B (paper-llada2.0-mini costs; re-profiled from "
        f"{tr['requests_fit']} requests, evaluated on {tr['requests_eval']}; "
        f"mean B cost {tr['B_mean_cost_ms']:.0f} ms):"
    )
    print(
        format_table(
            ["pricing on B", "cost MAE ms", "MAE / mean cost"],
            [[k, f"{v:.1f}", f"{v / tr['B_mean_cost_ms']:.1%}"] for k, v in b.items()],
        )
    )

    for v in fits.values():
        v.pop("profile")
    result = {
        "planted": rows,
        "profiled": fits,
        "transfer": tr,
        "profile_traces": str(args.profile_traces),
        "hardware": hardware,
        "fingerprint": fingerprint,
        "command": f"python benchmarks/cost_model.py --profile-traces {args.profile_traces}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
