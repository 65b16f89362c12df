"""Stock SGLang vs the dwise plugin on a GPU box, with SGLang's own bench_serving (not CI).

Launches ``sglang.launch_server`` twice on the same model and port, once stock
(``--max-running-requests B``) and once with the plugin (``DWISE_SGLANG_*`` set,
``--max-running-requests k*B``), runs ``python -m sglang.bench_serving`` with the same dataset,
prompt count and seed against each, and prints mean/median E2E latency, TTFT and throughput
side by side. Needs a CUDA machine with ``sglang==0.5.23`` and ``dwise-predict`` installed and
a bundle trained for the model (docs/sglang.md).

    python benchmarks/sglang_gpu.py --model inclusionAI/LLaDA2.1-mini \
        --bundle hf://ORG/llada2.1-mini-tau095@v1 --slots 128 --k 8 --num-prompts 1000 \
        --out benchmarks/results/sglang_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def _wait_ready(port: int, proc: subprocess.Popen, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                return
        except OSError:
            time.sleep(5)
    raise SystemExit(f"the server was not ready after {timeout_s:.0f} s")


def run_one(
    name: str, args: argparse.Namespace, env: dict[str, str], max_running: int, out_dir: Path
) -> dict[str, Any]:
    server = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        args.model,
        "--dllm-algorithm",
        args.algorithm,
        "--max-running-requests",
        str(max_running),
        "--port",
        str(args.port),
        *args.server_args,
    ]
    with open(out_dir / f"{name}.server.log", "w") as log:
        proc = subprocess.Popen(server, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(args.port, proc, args.startup_timeout)
            result = out_dir / f"{name}.jsonl"
            result.unlink(missing_ok=True)
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "sglang.bench_serving",
                    "--backend",
                    "sglang",
                    "--port",
                    str(args.port),
                    "--dataset-name",
                    args.dataset,
                    "--num-prompts",
                    str(args.num_prompts),
                    "--request-rate",
                    args.request_rate,
                    "--seed",
                    str(args.seed),
                    "--output-file",
                    str(result),
                ],
                check=True,
            )
            return dict(json.loads(result.read_text().strip().splitlines()[-1]))
        finally:
            proc.terminate()
            proc.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--bundle", required=True, help="bundle path, hf://ORG/NAME@REV or zoo name")
    ap.add_argument("--algorithm", default="LowConfidence")
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--dataset", default="sharegpt")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--request-rate", default="inf", help="inf = one burst")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--startup-timeout", type=float, default=1800)
    ap.add_argument("--out", default="benchmarks/results/sglang_gpu.json")
    ap.add_argument("server_args", nargs="*", help="extra launch_server flags, after --")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    stock_env = {k: v for k, v in os.environ.items() if not k.startswith("DWISE_SGLANG_")}
    plugin_env = {
        **stock_env,
        "DWISE_SGLANG_BUNDLE": args.bundle,
        "DWISE_SGLANG_SLOTS": str(args.slots),
        "DWISE_SGLANG_K": str(args.k),
        "DWISE_SGLANG_MONITOR_FILE": str(out.with_suffix(".monitor.json")),
    }
    runs = {
        "sglang-fcfs": run_one("stock", args, stock_env, args.slots, out.parent),
        "dwise-plugin": run_one("dwise", args, plugin_env, args.slots * args.k, out.parent),
    }
    keys = ("mean_e2e_latency_ms", "median_e2e_latency_ms", "mean_ttft_ms", "request_throughput")
    print(f"{'':24s}{'sglang-fcfs':>16s}{'dwise-plugin':>16s}")
    for key in keys:
        a, b = runs["sglang-fcfs"].get(key), runs["dwise-plugin"].get(key)
        print(f"{key:24s}{a!s:>16.10s}{b!s:>16.10s}")
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "bundle": args.bundle,
                "slots": args.slots,
                "k": args.k,
                "dataset": args.dataset,
                "num_prompts": args.num_prompts,
                "request_rate": args.request_rate,
                "seed": args.seed,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
