"""`dwise-predict profile`: measure a deployment's cost profile, or re-profile a bundle.

    dwise-predict profile --model tiny-bd --workload runs/workload --limit 300 --out runs/profile
    dwise-predict profile --bundle runs/bundle --traces runs/profile     # refit, new revision
    dwise-predict profile --bundle runs/bundle --model tiny-bd --workload runs/workload

Composes :func:`dwise_predict.tracing.profile.profile_workload` (serve one request at a time,
time every phase), :func:`dwise_predict.trainers.cost_profile.fit_cost_profile` (NNLS with
smoothing, k-fold metrics) and :func:`dwise_predict.bundle.update.write_bundle_cost_profile`
(new bundle revision, predictor files untouched). torch/scipy load inside :func:`run` only.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..tables import format_table
from ._common import progress

log = logging.getLogger(__name__)


def register(subparsers: Any, name: str, common: argparse.ArgumentParser) -> None:
    p = subparsers.add_parser(
        name,
        parents=[common],
        help="Profile a deployment's cost factors, or re-profile a bundle",
        description="Serve requests one at a time, time prefill, every denoising step and every "
        "KV refresh, and fit the cost profile (alpha, beta, K, delta) by non-negative "
        "least squares. With --bundle, write the bundle's new revision holding it.",
    )
    p.add_argument(
        "--model",
        metavar="NAME_OR_PATH",
        help="dLLM to profile: 'tiny-bd', a tiny-bd "
        "folder or hf-mask-predict:PATH (with --workload)",
    )
    p.add_argument("--workload", type=Path, metavar="FILE", help="workload JSONL file or folder")
    p.add_argument(
        "--split",
        default="train",
        choices=("train", "eval"),
        help="which file of a workload folder to profile (default: train)",
    )
    p.add_argument(
        "--limit",
        type=int,
        default=300,
        help="requests to profile (default: 300; a few hundred suffice)",
    )
    p.add_argument(
        "--traces",
        type=Path,
        metavar="PATH",
        help="refit from these traces instead of "
        "serving: a profile.parquet (or its folder) or ordinary `trace` output",
    )
    p.add_argument("--bundle", metavar="DIR", help="re-profile this bundle: write its new revision")
    p.add_argument(
        "--bundle-out",
        type=Path,
        metavar="DIR",
        help="write the re-profiled bundle here instead of replacing --bundle",
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="write profile.parquet and cost_profile.json here"
    )
    p.add_argument("--max-new-tokens", type=int, default=256, help="output budget (default: 256)")
    p.add_argument("--threshold", type=float, default=None, help="LowConfidence threshold (0.95)")
    p.add_argument("--block-size", type=int, default=None, help="block size (default: the model's)")
    p.add_argument(
        "--device",
        default="cpu",
        help="where the model runs: cpu (default) or cuda[:N]",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="CPU threads for the model (default: 1 with --clock cpu, else torch's choice)",
    )
    p.add_argument(
        "--clock",
        default="auto",
        choices=("auto", "wall", "cpu"),
        help="time phases by this thread's CPU time (steady on a shared machine) or by wall "
        "clock (what a server sees); auto (default): CPU time on one thread when the model "
        "runs on the CPU, wall clock on a GPU, whose work no CPU clock sees",
    )
    p.add_argument("--warmup", type=int, default=3, help="unrecorded warm-up requests (default: 3)")
    p.add_argument(
        "--speed-probe",
        type=int,
        default=3,
        metavar="N",
        help="time N forwards of a fixed block between requests, so that the fit can price "
        "every request at the run's median machine speed (default: 3; 0: no probe)",
    )
    p.add_argument(
        "--n-blocks",
        type=int,
        default=None,
        help="output blocks N the profile prices (default: the most seen)",
    )
    p.add_argument(
        "--smooth",
        type=float,
        default=1e-3,
        help="weight of K's smoothing across blocks and steps (default: 1e-3)",
    )
    p.add_argument(
        "--prefill",
        default="auto",
        choices=("auto", "linear", "quadratic"),
        help="prefill cost form: alpha*m (linear, the paper's), + alpha2*m^2 "
        "(quadratic), or whichever cross-validates better (auto, the default)",
    )
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (default: 5)")
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="attach a profile measured for another dLLM/decoder to --bundle anyway",
    )
    p.set_defaults(func=run)


#: a 5-fold R² under this means the timings, not the cost form, are what varies
MIN_GOOD_R2 = 0.9


def resolve_clock(clock: str, device: str, threads: int | None) -> tuple[str, int | None]:
    """(clock, threads) a profile measures with. On a CPU, wall-clock timings of a model that
    shares its cores with anything else scatter (R² 0.80 on a 2-core machine against 0.996
    for one thread's CPU time, on the same 200 requests), so ``auto`` means CPU time on one
    thread there; on a GPU the work happens off the CPU, so ``auto`` means wall clock."""
    on_cpu = str(device).split(":")[0] == "cpu"
    if clock == "auto":
        clock = "cpu" if on_cpu else "wall"
    if clock == "cpu" and not on_cpu:
        raise ConfigError(
            f"--clock cpu times this thread's CPU, which does not see work on {device}: "
            "use --clock wall (or auto) on a GPU"
        )
    if clock == "cpu" and threads is None:
        threads = 1  # one thread's CPU time is the model's whole cost only on one thread
    return clock, threads


def r2_warning(profile: Any, clock: str) -> str | None:
    """A warning naming the fix when the profile's cross-validated R² is poor."""
    r2 = (profile.cv or {}).get("r2")
    if r2 is None or not r2 < MIN_GOOD_R2:
        return None
    fix = (
        "profile again with --clock cpu --threads 1 (the default on a CPU), on a machine "
        "with nothing else running"
        if clock == "wall"
        else "profile again on a quieter machine, with more requests (--limit)"
    )
    return (
        f"the cost profile's 5-fold R² is {r2:.3f}, under {MIN_GOOD_R2}: its timings scatter "
        f"more than a cost model can explain, so DWS costs built on it will be noisy; {fix}"
    )


def _measure(args: argparse.Namespace) -> Any:
    """Serve the workload one request at a time; returns the ProfileRun (and writes it)."""
    args.clock, args.threads = resolve_clock(args.clock, args.device, args.threads)
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {args.threads}")
        import torch

        # for this command only: `demo` runs the next commands in the same process
        threads = torch.get_num_threads()
        torch.set_num_threads(args.threads)
        try:
            return _serve(args)
        finally:
            torch.set_num_threads(threads)
    return _serve(args)


def _serve(args: argparse.Namespace) -> Any:
    from dwise_predict.tracing.adapters import load_adapter
    from dwise_predict.tracing.profile import profile_workload

    from .trace import read_records

    records = read_records(args.workload, args.split)
    adapter = load_adapter(args.model, device=args.device)
    n = min(len(records), args.limit)
    bar = progress(total=n, desc="profile", unit="req", quiet=args.quiet)
    try:
        return profile_workload(
            adapter,
            records,
            limit=args.limit,
            threshold=args.threshold,
            block_size=args.block_size,
            max_new_tokens=args.max_new_tokens,
            warmup=args.warmup,
            clock=args.clock,
            progress=bar,
            probe_reps=args.speed_probe,
        )
    finally:
        bar.close()


def run(args: argparse.Namespace) -> int:
    from dwise_predict.trainers.cost_profile import (
        FitConfig,
        fit_cost_profile,
        fit_runs,
        prompt_coverage_warning,
    )
    from dwise_predict.trainers.profile_traces import read_profile_traces, write_profile_traces

    if args.out is None and args.bundle is None:
        raise ConfigError("give --out DIR (write the profile) and/or --bundle DIR (re-profile it)")
    if args.traces is not None and (args.model or args.workload):
        raise ConfigError(
            "give either --traces (refit) or --model and --workload (measure), not both"
        )
    if args.traces is None and not (args.model and args.workload):
        raise ConfigError("give --model and --workload to measure, or --traces to refit")
    if args.bundle_out is not None and args.bundle is None:
        raise ConfigError("--bundle-out needs --bundle")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out {args.out} is a file; pass a folder")
    if args.traces is not None:
        requests, fingerprint, hardware = read_profile_traces(args.traces)
        block_size = int(fingerprint.get("block_size") or args.block_size or 0)
        if block_size < 1:
            raise ConfigError(f"{args.traces} records no block size; pass --block-size")
    else:
        measured = _measure(args)
        requests, fingerprint, hardware = measured.requests, measured.fingerprint, measured.hardware
        block_size = measured.block_size
    config = FitConfig(
        n_blocks=args.n_blocks,
        smooth=args.smooth,
        folds=args.folds,
        seed=args.seed,
        prefill=args.prefill,
    )
    runs = fit_runs(requests, config)
    bar = progress(total=config.folds * runs, desc="fit", unit="fold", quiet=args.quiet)
    try:
        profile = fit_cost_profile(
            requests,
            block_size=block_size,
            fingerprint=fingerprint,
            hardware=hardware,
            config=config,
            progress=lambda _msg: bar.update(1),
        )
    finally:
        bar.close()
    # everything is measured and fitted before the first file is written
    written = []
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        if args.traces is None:
            written.append(
                write_profile_traces(
                    args.out,
                    measured.requests,
                    measured.request_ids,
                    measured.prompt_tokens,
                    measured.step_ms,
                    fingerprint,
                    hardware,
                )
            )
        written.append(args.out / profile.save(args.out)[0])
    if args.bundle is not None:
        from dwise_predict.bundle.update import write_bundle_cost_profile

        written.append(
            write_bundle_cost_profile(
                args.bundle, profile, out=args.bundle_out, allow_mismatch=args.allow_mismatch
            )
        )
    if (warning := prompt_coverage_warning(requests)) is not None:
        log.warning(warning)
    if (warning := r2_warning(profile, getattr(args, "clock", "auto"))) is not None:
        log.warning(warning)
    if not args.quiet:
        rows = summary_rows(profile, len(requests), config.folds)
        print(format_table(["cost profile", "value"], rows))
        for w in written:
            print(f"wrote {w}")
    return 0


def summary_rows(profile: Any, n_requests: int, folds: int) -> list[list[Any]]:
    K = profile.K_ms
    cv = profile.cv or {}
    return [
        ["requests", n_requests],
        ["alpha (ms per prompt block)", f"{profile.alpha_ms:.4g}"],
        ["alpha2 (ms per prompt block^2; 0 = linear prefill)", f"{profile.alpha2_ms:.4g}"],
        ["beta (ms per output block)", f"{profile.beta_ms:.4g}"],
        ["delta (ms per cell per prompt block)", f"{profile.delta_ms:.4g}"],
        [
            f"K ({K.shape[0]} x {K.shape[1]}) min / mean / max ms",
            f"{K.min():.4g} / {K.mean():.4g} / {K.max():.4g}",
        ],
        ["K step 0 -> last step, block 0 (ms)", f"{K[0, 0]:.4g} -> {K[0, -1]:.4g}"],
        [
            f"{folds}-fold R2 / MAPE",
            f"{cv.get('r2', float('nan')):.4f} / {100 * cv.get('mape', float('nan')):.2f}%",
        ],
        [
            "Spearman rho / pairwise order",
            f"{cv.get('spearman', float('nan')):.4f} / "
            f"{100 * cv.get('pairwise', float('nan')):.2f}%",
        ],
        [
            "speed correction (probe / median probe)^gamma",
            f"gamma {cv['speed_exponent']:g}" if "speed_exponent" in cv else "none (no probes)",
        ],
        ["hardware", profile.hardware],
    ]
