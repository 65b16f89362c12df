r"""Why rounds, not tokens: the learned output-length schedulers (SSJF, S³, LTR, TRAIL) compared.

Writes ``benchmarks/results/baselines.json`` (issue 54):

* ``offline[PREDICTOR]``: the paper's Table 12 on the reference model's traces: Spearman ρ of
  each score with the work it ranks (``rho_all``; ``rho_other`` without multiple choice) for
  ``ssjf``, ``s3``, ``ltr``, ``trail``, ``dwise-admission`` and ``dwise-refined``, plus the
  true output length (``output_length``, any output-length ranker's ceiling). Every predictor
  is trained by the library's pipeline (``train_bundle(only="admission,refinement,ssjf,s3,
  ltr,trail")``) on the same traces, in ``--folds`` category-stratified folds (train on the
  others, score the held-out fold; figures are the folds' mean, each fold's kept too).
  ``offline_zoo`` adds the shipped zoo bundle's two estimates on every trace of a request
  outside the workload's train split (the zoo bundle is trained on that split).
* ``reference_model``: ``rho_tokens_rounds`` (output tokens vs total rounds over code, math,
  chat and instruction) and each category's median tokens per round and rounds.
* ``simulated[REGIME][POLICY]``: the paper-matched synthetic workload (4,096 requests, B = 128,
  k = 8, all on the mixed batch former) in rounds (one round = one time unit, as served):
  regimes ``burst`` and ``poisson-overload`` (Poisson at 1.5 x fcfs-mixed's burst capacity);
  ``simulated[...]["table12"]`` is Table 12 on that workload. ``simulated_seconds`` prices the
  rounds with the paper-matched round-time model and adds ``burst+poisson`` (half at t = 0, the
  rest Poisson at 16 / s: the paper's Table 4). The synthetic workload has no prompts or hidden
  states: each baseline's predicted output tokens are the true ones with noise solved for the ρ
  with the true output tokens the trained baselines reach here (``token_rho``, measured above),
  stated in rounds with the workload's tokens per round (``dwise_predict.runtime.lengths``).
* ``replayed[REGIME][POLICY]`` (with ``--served-tracks``): the served ladder's 512 split-mix
  requests, B = 16, k = 8, replayed from the work and arrival rounds SGLang's loop recorded
  (the replay reproduces the served runs in ``served_reference`` to the digit); the baselines
  rank by their out-of-fold estimates, ``dwise`` by the plugin's recorded ones.
* ``served[REGIME][POLICY]`` (with ``--serve``, under ``.venv-sglang``; or ``--served-from`` the
  progress file such a run writes, ``baselines.served.json``): the same 512 requests in
  SGLang's real loop on CPU (``tests/sglang_plugin/harness.py``), ``fcfs-mixed``, the four
  baselines and ``dwise``, burst and ``poisson-overload`` (see ``served_note``).

The committed JSON (tiny-bd v1.0.0) reads the traces the zoo release's rebuild writes (the
whole train split and the report's 1,000 eval requests: ``python -m
dwise_predict.zoo.tiny_bd.recipe.rebuild``), about 40 s, then serves in ``.venv-sglang``
(about 15 minutes on two shared cores) and merges::

    .venv/bin/python benchmarks/baselines.py --traces runs/traces-train runs/tiny-bd-eval/tau0.95 \
        --served-bundle runs/bl/bundle-served --out runs/bl/baselines.json
    .venv-sglang/bin/python benchmarks/baselines.py --served-bundle runs/bl/bundle-served \
        --serve-only --served-policies fcfs-mixed,ssjf,s3,ltr,trail,dwise,dwise-uncapped \
        --out runs/bl/baselines.json
    .venv/bin/python benchmarks/baselines.py --traces runs/traces-train runs/tiny-bd-eval/tau0.95 \
        --served-from runs/bl/baselines.served.json

``--prepare-traces DIR`` traces, with tiny-bd and hidden states in SGLang's absolute layout,
the eval requests the served ladder serves (its 512 stratified requests and the split's first
512: 691 distinct; resumable) and exits: the previous release's JSON
(``baselines_v0.9.0.json``) was measured on 597 of them with ``--served-tracks``, the request
tracks ``benchmarks/sglang_tails.py --save-tracks DIR`` wrote for the split mix. ``--traces``
are trace folders of the reference model with hidden states.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("ssjf", "s3", "ltr", "trail")
#: offline name -> the estimate name in the eval metrics
OFFLINE = {
    "output_length": "output_length",
    "ssjf": "ssjf",
    "s3": "s3",
    "ltr": "ltr",
    "trail": "trail",
    "dwise-admission": "admission",
    "dwise-refined": "refined",
}
POLICIES = (
    "fcfs-mixed",
    "ssjf",
    "s3",
    "ltr",
    "trail",
    "dwise-r0",
    "dwise-uncapped",
    "dwise",
    "oracle",
)


def folds_of(table: pa.Table, folds: int) -> np.ndarray:
    """A category-stratified fold per row: within a category, rows in sha256(request id)
    order are dealt round-robin (no randomness, the same folds on every machine)."""
    ids = [str(x) for x in table.column("request_id").to_pylist()]
    cats = [str(x) for x in table.column("category").to_pylist()]
    out = np.zeros(len(ids), dtype=np.int64)
    for c in sorted(set(cats)):
        rows = [i for i in range(len(ids)) if cats[i] == c]
        rows.sort(key=lambda i: hashlib.sha256(ids[i].encode()).hexdigest())
        for j, i in enumerate(rows):
            out[i] = j % folds
    return out


def offline(table: pa.Table, folds: int, workdir: Path) -> dict[str, Any]:
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.evaluate import evaluate_arrays, rounds_vs_tokens
    from dwise_predict.trainers.pipeline import train_bundle

    from dwise_predict.bundle import load_bundle
    from dwise_predict.ranking import spearman

    fold = folds_of(table, folds)
    ids = np.asarray([str(x) for x in table.column("request_id").to_pylist()], dtype=object)
    #: each request's estimates from the fold bundle that did not train on it, in rounds
    oof: dict[str, dict[str, float]] = {}
    per_fold: list[dict[str, Any]] = []
    token_rho: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for f in range(folds):
        train = table.filter(pa.array(fold != f))
        held = table.filter(pa.array(fold == f))
        t0 = time.perf_counter()
        path = train_bundle(
            train,
            workdir / f"bundle-{f}",
            only="admission,refinement," + ",".join(KINDS),
            seed=0,
            overwrite=True,
        )
        seconds[f"fold{f}_train"] = time.perf_counter() - t0
        bundle = load_bundle(path)
        arrays = trace_arrays(held, need_hidden=True)
        _, preds = evaluate_arrays(bundle, arrays)
        assert arrays.output_tokens is not None
        tokens = arrays.output_tokens
        rvt = rounds_vs_tokens(preds, arrays.category, tokens, arrays.total_rounds)
        per_fold.append({"n_train": train.num_rows, "n_eval": held.num_rows, **rvt})
        # each baseline's predicted tokens against the true output tokens (the synthetic
        # workload's noise is solved for these)
        for kind in KINDS:
            model: Any = getattr(bundle, kind)
            token_rho.setdefault(kind, []).append(
                spearman(model.predict_tokens(arrays.features), tokens) or 0.0
            )
        trail: Any = bundle.trail
        again = trail.remaining_tokens(arrays.hidden, arrays.prompt_tokens, arrays.output_budget)
        token_rho.setdefault("trail:refined", []).append(spearman(again, tokens) or 0.0)
        for name, (pred, _) in preds.items():
            for rid, v in zip(ids[fold == f], pred):
                oof.setdefault(str(rid), {})[name] = float(v)
    out: dict[str, Any] = {}
    for name, est in OFFLINE.items():
        vals = [p[est] for p in per_fold]
        out[name] = {
            k: float(np.mean([v[k] for v in vals if v[k] is not None]))
            for k in ("rho_all", "rho_other")
        }
        out[name]["per_fold"] = vals
    return {
        "offline": out,
        "oof": oof,
        "token_rho": {k: float(np.mean(v)) for k, v in token_rho.items()},
        "folds": [{"n_train": p["n_train"], "n_eval": p["n_eval"]} for p in per_fold],
        "seconds": seconds,
    }


def offline_zoo(table: pa.Table) -> dict[str, Any]:
    """The shipped zoo bundle's DWISE estimates on the traces of requests outside the
    workload's train split, which the zoo bundle is trained on (so every one is held out)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from block_alignment import tiny_bd_workload
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.evaluate import evaluate_arrays, rounds_vs_tokens

    from dwise_predict.bundle import load_bundle

    bundle = load_bundle("tiny-bd")
    train = {r.prompt for r in tiny_bd_workload().train}
    table = table.filter(pa.array([p not in train for p in table.column("prompt").to_pylist()]))
    arrays = trace_arrays(table, need_hidden=True)
    _, preds = evaluate_arrays(bundle, arrays)
    assert arrays.output_tokens is not None
    rvt = rounds_vs_tokens(preds, arrays.category, arrays.output_tokens, arrays.total_rounds)
    return {
        "bundle": "tiny-bd (zoo)",
        "n": arrays.n,
        "dwise-admission": rvt["admission"],
        "dwise-refined": rvt["refined"],
    }


def simulated(
    token_rho: dict[str, float], n: int, slots: int, k: int, *, seconds: bool
) -> dict[str, Any]:
    """Every policy under each regime on the synthetic workload. ``seconds``: rounds priced by
    the paper-matched round-time model (latency in s); else every round costs the same, so
    completion is counted in rounds, as in SGLang's loop (``served``)."""
    from dwise_predict.runtime.lengths import synthetic_lengths
    from dwise_predict.runtime.metrics import summarize
    from dwise_predict.runtime.registry import make_policy
    from dwise_predict.runtime.roundtime import RoundTimeModel
    from dwise_predict.runtime.simulator import simulate
    from dwise_predict.runtime.synthetic import synthetic_workload

    w = synthetic_workload(n=n, seed=0)
    w = w.with_estimates(lengths=synthetic_lengths(w, token_rho, seed=0))
    table12 = synthetic_table12(w)
    # one round = 1 s: latency reads as completion rounds
    model = RoundTimeModel() if seconds else RoundTimeModel(1000.0, 0.0, 0.0)
    unit = "s" if seconds else "rounds"
    name = "latency_s" if seconds else "completion_rounds"

    def run(policy: str, arrival: str) -> dict[str, float]:
        r = simulate(
            w, make_policy(policy), arrivals=arrival, slots=slots, k=k, seed=0, round_time=model
        )
        s = summarize(r)
        return {
            f"mean_{name}": s["mean_latency"],
            f"p99_{name}": s["p99_latency"],
            "rounds": s["rounds"],
            f"makespan_{unit}": s["makespan"],
            "finished": int(np.isfinite(r.finish_time).sum()),
            "requests": int(s["requests"]),
        }

    out: dict[str, Any] = {"table12": table12, "burst": {p: run(p, "burst") for p in POLICIES}}
    # fcfs-mixed's capacity under the burst, in requests per unit (s, or round)
    capacity = n / out["burst"]["fcfs-mixed"][f"makespan_{unit}"]
    regimes = {"poisson-overload": f"poisson:{1.5 * capacity:.6g}"}
    if seconds:
        regimes = {"burst+poisson": "burst+poisson:16", **regimes}
    for regime, arrival in regimes.items():
        out[regime] = {p: run(p, arrival) for p in POLICIES}
    out["arrivals"] = {"burst": "burst", **regimes}
    out["setting"] = {
        "requests": n,
        "slots": slots,
        "k": k,
        "workload": "paper-llada2.1-mini",
        "unit": unit,
        "round_time": "paper-matched RoundTimeModel()" if seconds else "1 per round",
    }
    return out


def synthetic_table12(w: Any) -> dict[str, dict[str, float | None]]:
    """Table 12 on the synthetic workload: each score's ρ with the work it ranks, all and
    without its two multiple-choice categories."""
    from dwise_predict.ranking import spearman

    other = ~np.isin(w.category.astype(str), ("mcq", "hard_mcq"))
    total = w.total_rounds.astype(np.float64)
    scores = {
        "output_length": (w.output_tokens.astype(np.float64), total),
        **{k: (w.lengths[k], total) for k in ("ssjf", "s3", "ltr")},
        "trail": (w.lengths["trail:refined"], total - 1),
        "dwise-admission": (w.admission, total),
        "dwise-refined": (w.refined, total - 1),
    }
    return {
        name: {"rho_all": spearman(p, a), "rho_other": spearman(p[other], a[other])}
        for name, (p, a) in scores.items()
    }


#: the served runs' KV pool (tokens; sglang_tails.json's kv_free_before)
SERVED_KV_POOL = 1 << 20
REPLAYED = POLICIES


def replayed(
    tracks_dir: Path, oof: dict[str, dict[str, float]], slots: int, k: int
) -> dict[str, Any]:
    """The served requests in the simulator, as the SGLang ladder replays them (its replays
    reproduce the served runs to about 0.1 round): each request's served work (SGLang's r + 1
    forwards per block) and arrival round, one round = one time unit, the served KV pool. DWISE
    ranks by the estimates the plugin recorded while serving (the zoo bundle's); each baseline
    by its out-of-fold estimate (the fold bundle that did not train on the request);
    ``dwise@folds`` by DWISE's out-of-fold estimates from the same fold bundles."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sglang_ladder import sim_workload

    from dwise_predict.runtime import Arrivals, RoundTimeModel, make_policy, simulate

    out: dict[str, Any] = {}
    for regime in ("burst", "poisson-overload"):
        doc = json.loads((tracks_dir / f"{regime}.dwise-uncapped.tracks.json").read_text())
        order = list(zip(doc["order"], doc["categories"]))
        missing = [rid for rid, _ in order if rid not in oof]
        if missing:
            raise SystemExit(f"{len(missing)} served requests have no traces (e.g. {missing[0]})")
        wl = sim_workload(doc["tracks"], order, {})
        ests = [oof[rid] for rid, _ in order]
        lengths = {
            kind: np.array([e[kind] for e in ests], dtype=np.float64)
            for kind in ("ssjf", "s3", "ltr")
        }
        lengths["trail"] = np.array([e["ssjf"] for e in ests])  # TRAIL's arrival = a prompt model
        lengths["trail:refined"] = np.array([e["trail"] for e in ests], dtype=np.float64)
        wl = wl.with_estimates(lengths=lengths)
        folds = wl.with_estimates(
            admission=np.array([e["admission"] for e in ests]),
            refined=np.array([e["refined"] for e in ests]),
        )
        arrive = np.asarray(doc["arrival_rounds"], dtype=np.float64)
        arrivals = Arrivals(np.arange(wl.n, dtype=np.int64), arrive / 1e3)
        runs: dict[str, Any] = {}
        for label in (*REPLAYED, "dwise@folds"):
            policy = make_policy(label.split("@")[0])
            run = simulate(
                folds if label.endswith("@folds") else wl,
                policy,
                arrivals=arrivals,
                slots=slots,
                k=k,
                round_time=RoundTimeModel(1.0, 0.0, 0.0),
                kv_pool_tokens=SERVED_KV_POOL,
            )
            lat = (np.asarray(run.finish_time) - arrive / 1e3) * 1e3
            runs[label] = {
                "mean_completion_rounds": round(float(np.mean(lat)), 2),
                "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
                "finished": int(np.isfinite(run.finish_time).sum()),
                "requests": wl.n,
            }
        out[regime] = runs
    out["setting"] = {
        "requests": wl.n,
        "slots": slots,
        "k": k,
        "tracks": str(tracks_dir),
        "work": "served rounds per block + 1 (SGLang's forwards), served arrival rounds",
    }
    return out


def served_reference() -> dict[str, Any]:
    """The earlier served runs of the same 512 requests (benchmarks/results/sglang_tails.json,
    split mix): what the replay of fcfs-mixed and the DWISE policies should reproduce."""
    doc = json.loads((ROOT / "benchmarks/results/sglang_tails.json").read_text())
    regimes = doc["mixes"]["split"]["regimes"]
    return {
        regime: {
            p: {k: r[k] for k in ("mean_completion_rounds", "p99_completion_rounds", "finished")}
            for p, r in regimes[regime]["runs"].items()
        }
        for regime in ("burst", "poisson-overload")
    }


SERVED = ("fcfs-mixed", "ssjf", "s3", "ltr", "trail", "dwise")


def served_bundle(table: pa.Table, workdir: Path, model: str = "tiny-bd") -> Path:
    """The served bundle: DWISE's admission and refinement predictors and the four baselines
    trained on every trace of ``table`` (deterministic: the same files each time).

    For the shipped model, DWISE's two are the zoo bundle's (trained on the train split); for
    a candidate checkpoint (``model`` a folder) they are trained on the same traces as the
    baselines, so every predictor is in-sample alike."""
    from dwise_predict.trainers.baselines import train_ltr, train_s3, train_ssjf, train_trail
    from dwise_predict.trainers.dataset import trace_arrays
    from dwise_predict.trainers.pipeline import train_bundle

    from dwise_predict import load_bundle
    from dwise_predict.bundle import save_bundle

    if model != "tiny-bd":
        only = "admission,refinement," + ",".join(KINDS)
        return train_bundle(table, workdir / "bundle-served", only=only, seed=0, overwrite=True)
    arrays = trace_arrays(table, need_hidden=True)
    zoo = load_bundle("tiny-bd")
    parts = [zoo.admission, zoo.refinement]
    parts += [fit(arrays) for fit in (train_ssjf, train_s3, train_ltr, train_trail)]
    return save_bundle(workdir / "bundle-served", parts, fingerprint=zoo.fingerprint)


def replay_check(table: pa.Table, tracks_dir: Path, workdir: Path) -> dict[str, Any]:
    """The served runs replayed with the served bundle's estimates computed from the traces
    (features and first-round hidden states) and DWISE's as the plugin recorded them: equal to
    ``served`` when the plugin fed each request what the simulator's replay feeds it.

    Beside them, each baseline held to the default's tail rule (``KIND+guard``:
    :class:`~dwise_predict.runtime.tails.TailGuard` ranking by that baseline's estimates), so
    the baselines can be compared with ``dwise`` at equal tails as well as without a tail rule
    (``dwise-uncapped`` against the plain baselines)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sglang_ladder import sim_workload

    from dwise_predict.bundle import load_bundle
    from dwise_predict.runtime import Arrivals, RoundTimeModel, make_policy, simulate
    from dwise_predict.runtime.lengths import lengths_from_bundle
    from dwise_predict.runtime.tails import TailGuard

    bundle = load_bundle(served_bundle(table, workdir))
    ids = [str(x) for x in table.column("request_id").to_pylist()]
    policies: dict[str, Any] = {
        **{p: make_policy(p) for p in ("fcfs-mixed", *KINDS, "dwise", "dwise-uncapped")},
        **{
            f"{k}+guard": TailGuard(predictor=k, refines=k == "trail", name=f"{k}+guard")
            for k in KINDS
        },
    }
    out: dict[str, Any] = {}
    for regime in ("burst", "poisson-overload"):
        doc = json.loads((tracks_dir / f"{regime}.dwise-uncapped.tracks.json").read_text())
        order = list(zip(doc["order"], doc["categories"]))
        rows = table.take(pa.array([ids.index(rid) for rid, _ in order]))
        wl = sim_workload(doc["tracks"], order, {})
        wl = wl.with_estimates(lengths=lengths_from_bundle(bundle, rows))
        arrive = np.asarray(doc["arrival_rounds"], dtype=np.float64)
        out[regime] = {}
        for label, policy in policies.items():
            run = simulate(
                wl,
                policy,
                arrivals=Arrivals(np.arange(wl.n, dtype=np.int64), arrive / 1e3),
                slots=16,
                k=8,
                round_time=RoundTimeModel(1.0, 0.0, 0.0),
                kv_pool_tokens=SERVED_KV_POOL,
            )
            lat = (np.asarray(run.finish_time) - arrive / 1e3) * 1e3
            out[regime][label] = {
                "mean_completion_rounds": round(float(np.mean(lat)), 2),
                "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
                "finished": int(np.isfinite(run.finish_time).sum()),
            }
    return out


def serve(
    bundle: Path, progress: Path, model: str = "tiny-bd", policies: tuple[str, ...] = SERVED
) -> dict[str, Any]:
    """The served ladder's 512 split-mix requests in SGLang's loop (B = 16, k = 8; run with
    ``.venv-sglang``), under ``fcfs-mixed``, the four baselines and ``dwise``, burst and Poisson
    at 1.5x ``fcfs-mixed``'s capacity (the ladder's rate). The bundle: the zoo's admission and
    refinement predictors and the four baselines trained on every trace given, these 512
    requests included (in-sample for the baselines: it can only flatter them), is ``bundle``
    (:func:`served_bundle`); ``model`` is the served checkpoint. Each run's figures go to
    ``progress`` as soon as it ends."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests" / "sglang_plugin"))
    from harness import install_torchvision_shim

    install_torchvision_shim()
    from harness import TinyBDRunner, eval_requests
    from sglang_ladder import arrival_rounds, serve_policy

    from dwise_predict.atomic import write_json

    ladder = json.loads((ROOT / "benchmarks/results/sglang_ladder_split.json").read_text())
    rate = 1.5 * ladder["fcfs_mixed_capacity_requests_per_round"]
    runner = TinyBDRunner(block_size=32, checkpoint=model, memo=True)
    reqs = eval_requests(512, runner, max_new_tokens=256, stratified=False)
    arrivals = {
        "burst": arrival_rounds("burst", len(reqs), None, 0),
        "poisson-overload": arrival_rounds("poisson-overload", len(reqs), rate, 0),
    }
    slots, k = 16, 8
    doc: dict[str, Any] = {"requests": len(reqs), "slots": slots, "k": k}
    doc.update(rate_per_round=rate, runs={})

    for policy in policies:
        for regime, arrive in arrivals.items():
            t0 = time.perf_counter()
            res, _ = serve_policy(policy, reqs, arrive, runner, slots, k, None, bundle=str(bundle))
            done = [q.rid for q in reqs if q.rid in res.completion_round]
            lat = np.array([res.completion_round[r] - res.arrival_round[r] for r in done], float)
            doc["runs"].setdefault(regime, {})[policy] = {
                "mean_completion_rounds": round(float(lat.mean()), 2),
                "p99_completion_rounds": round(float(np.percentile(lat, 99)), 2),
                "finished": len(done),
                "requests": len(reqs),
                "rounds": res.rounds,
                "kv_free_before": res.kv_free_before,
                "kv_free_after": res.kv_free_after,
                "wall_s": round(time.perf_counter() - t0, 1),
            }
            write_json(progress, doc)
            print(regime, policy, doc["runs"][regime][policy], flush=True)
    return doc


def prepare_traces(folder: Path, model: str = "tiny-bd", shards: int = 1) -> int:
    """Trace the served ladder's eval requests (its 512 stratified ones and the split's first
    512, each once) with ``model`` (tiny-bd or a checkpoint folder of it) into
    ``folder/traces``; resumes an interrupted run. ``shards`` > 1 runs that many one-thread
    tracing processes side by side (the CLI's ``--num-shards``), faster on a few cores than
    one process with as many threads."""
    import subprocess

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from block_alignment import stratified, tiny_bd_workload

    from dwise_predict.atomic import write_text
    from dwise_predict.cli import main as cli

    split = [
        {"id": r.id, "category": r.category, "source": r.source, "prompt": r.prompt}
        for r in tiny_bd_workload().eval[:512]
    ]
    seen: set[str] = set()
    records = []
    for r in stratified(512) + split:
        if r["id"] not in seen:
            seen.add(r["id"])
            records.append(r)
    folder.mkdir(parents=True, exist_ok=True)
    workload = folder / "workload.jsonl"
    write_text(workload, "".join(json.dumps(r) + "\n" for r in records))
    argv = ["trace", "--model", model, "--workload", str(workload)]
    argv += ["--out", str(folder / "traces"), "--max-new-tokens", "256", "--batch-size", "8"]
    if (folder / "traces").exists() or shards > 1:
        argv.append("--resume")  # the shards share one folder: none may refuse another's files
    print(f"tracing {len(records)} eval requests into {folder / 'traces'}", flush=True)
    if shards <= 1:
        return int(cli(argv))
    exe = str(Path(sys.executable).with_name("dwise-predict"))
    procs = [
        subprocess.Popen(
            [exe, *argv, "--threads", "1", "--num-shards", str(shards), "--shard-index", str(i)]
        )
        for i in range(shards)
    ]
    return max(p.wait() for p in procs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, nargs="+", help="reference-model trace folders")
    ap.add_argument(
        "--prepare-traces",
        type=Path,
        metavar="DIR",
        help="trace the served ladder's eval requests into DIR/traces (resumable), then exit",
    )
    ap.add_argument(
        "--served-tracks",
        type=Path,
        help="the served split mix's request tracks (sglang_tails.py --save-tracks DIR/split): "
        "replays them under every policy",
    )
    ap.add_argument(
        "--serve",
        action="store_true",
        help="also serve the split mix's 512 requests in SGLang's loop under every policy "
        "(run with .venv-sglang; an hour or more on a CPU): writes 'served'",
    )
    ap.add_argument(
        "--served-bundle",
        type=Path,
        help="the served bundle's folder: built there from the traces when missing, "
        "served from when it exists",
    )
    ap.add_argument(
        "--serve-only",
        action="store_true",
        help="serve with an existing --served-bundle and write only the progress file "
        "(under .venv-sglang, which cannot train the refinement predictor); then rerun "
        "without it and with --served-from that file",
    )
    ap.add_argument(
        "--served-policies",
        default=",".join(SERVED),
        help="with --serve-only: the policies to serve (default: %(default)s)",
    )
    ap.add_argument(
        "--served-from",
        type=Path,
        nargs="+",
        help="take 'served' from the progress file of an earlier --serve run "
        "(benchmarks/results/baselines.served.json) instead of serving again; further files "
        "add their runs (other --served-policies)",
    )
    ap.add_argument(
        "--model",
        default="tiny-bd",
        help="the reference model traced and served: tiny-bd (the shipped weights) or a "
        "checkpoint folder of it (a candidate stage; its DWISE predictors are then trained on "
        "the traces given, and the zoo bundle's figures are left out)",
    )
    ap.add_argument(
        "--shards",
        type=int,
        default=1,
        help="with --prepare-traces: tracing processes side by side, one thread each",
    )
    ap.add_argument("--folds", type=int, default=2)
    ap.add_argument("--sim-requests", type=int, default=4096)
    ap.add_argument("--slots", type=int, default=128)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/baselines.json")
    args = ap.parse_args(argv)
    if args.prepare_traces is not None:
        return prepare_traces(args.prepare_traces, args.model, args.shards)
    if args.serve_only:
        if args.served_bundle is None or not args.served_bundle.exists():
            ap.error("--serve-only needs an existing --served-bundle (built by a run without it)")
        policies = tuple(args.served_policies.split(","))
        serve(args.served_bundle, args.out.with_suffix(".served.json"), args.model, policies)
        return 0
    if not args.traces:
        ap.error("--traces is required (make them with --prepare-traces DIR)")

    from dwise_predict.trainers.evaluate import tokens_and_rounds
    from dwise_predict.trainers.pipeline import canonical_order

    from dwise_predict.atomic import write_json
    from dwise_predict.bundle.record import json_safe
    from dwise_predict.traces import read_traces

    t0 = time.perf_counter()
    table = canonical_order(pa.concat_tables([read_traces(t) for t in args.traces]))
    cats = np.asarray(table.column("category").to_pylist(), dtype=object)
    doc: dict[str, Any] = {
        "traces": {
            "folders": [str(t) for t in args.traces],
            "requests": table.num_rows,
            "categories": {str(c): int((cats == c).sum()) for c in sorted(set(cats.tolist()))},
            "model": args.model,
            "model_revision": table.column("model_revision")[0].as_py(),
        }
    }
    with tempfile.TemporaryDirectory(prefix="baselines-") as tmp:
        doc.update(offline(table, args.folds, Path(tmp)))
    if args.model == "tiny-bd":
        doc["offline_zoo"] = offline_zoo(table)
    doc["reference_model"] = tokens_and_rounds(
        cats,
        table.column("output_tokens").to_numpy(),
        table.column("total_rounds").to_numpy(),
    )
    sim = (doc["token_rho"], args.sim_requests, args.slots, args.k)
    doc["simulated"] = simulated(*sim, seconds=False)
    doc["simulated_seconds"] = simulated(*sim, seconds=True)
    oof = doc.pop("oof")
    if args.served_tracks is not None:
        doc["replayed"] = replayed(args.served_tracks, oof, 16, 8)
        doc["served_reference"] = served_reference()
    progress = args.out.with_suffix(".served.json")
    served: dict[str, Any] = {}
    if args.served_bundle is not None and not args.served_bundle.exists():
        args.served_bundle.parent.mkdir(parents=True, exist_ok=True)
        built = served_bundle(table, args.served_bundle.parent, args.model)
        built.rename(args.served_bundle)
    if args.serve:
        with tempfile.TemporaryDirectory(prefix="baselines-served-") as tmp:
            bundle = args.served_bundle or served_bundle(table, Path(tmp), args.model)
            served = serve(bundle, progress, args.model)
    elif args.served_from:
        served = json.loads(args.served_from[0].read_text())
        for more in args.served_from[1:]:  # further policies' runs (--served-policies)
            for regime, runs in json.loads(more.read_text())["runs"].items():
                served["runs"].setdefault(regime, {}).update(runs)
    doc["served"] = served.get("runs", {})
    doc["served_setting"] = {k: v for k, v in served.items() if k not in ("runs", "bundle")}
    if doc["served"] and args.served_tracks is not None:
        with tempfile.TemporaryDirectory(prefix="baselines-check-") as tmp:
            doc["served_replay_check"] = replay_check(table, args.served_tracks, Path(tmp))
    doc["served_note"] = (
        "SGLang's loop on CPU (tiny-bd), the bundle's baselines trained on every trace given, "
        "the served requests included (in-sample: it can only flatter them). 'replayed' replays "
        "the same 512 requests' served work and arrivals in the simulator with out-of-fold "
        "baseline estimates (as benchmarks/sglang_ladder.py checks its replays against served "
        "runs; 'served_reference' holds the earlier served runs of fcfs-mixed and the DWISE "
        "policies). Runs missing from 'served' did not finish in the time box."
        if args.model == "tiny-bd"
        else f"SGLang's loop on CPU serving the checkpoint {args.model}; DWISE's predictors and "
        "the four baselines all trained on every trace given (served requests among them are "
        "in-sample for every predictor alike). Poisson at the rate the shipped model's ladder "
        "uses (rate_per_round). Runs missing from 'served' did not finish in the time box."
    )
    doc["seconds"]["total"] = time.perf_counter() - t0
    write_json(args.out, json_safe(doc))
    print_tables(doc)
    print(f"\nwritten to {args.out}")
    return 0


def print_tables(doc: dict[str, Any]) -> None:
    print("Table 12 on our traces (held-out folds' mean): ρ with work")
    for name, v in doc["offline"].items():
        print(f"  {name:16s} all {v['rho_all']:+.3f}   without mcq {v['rho_other']:+.3f}")
    z = doc.get("offline_zoo", {})
    for name in ("dwise-admission", "dwise-refined") if z else ():
        a, o = z[name]["rho_all"], z[name]["rho_other"]
        print(f"  zoo {name:12s} all {a:+.3f}   without mcq {o:+.3f}")
    ref = doc["reference_model"]
    rho = ref["rho_tokens_rounds"]
    print(f"reference model: ρ(tokens, rounds) over {ref['categories']} = {rho:.3f}")
    for c, v in ref["per_category"].items():
        tpr, med = v["median_tokens_per_round"], v["median_rounds"]
        print(f"  {c:12s} n {v['n']:4d}  tokens/round {tpr:.2f}  median rounds {med:.0f}")
    print(
        "token ρ (synthetic noise):",
        json.dumps({k: round(v, 3) for k, v in doc["token_rho"].items()}),
    )
    for regime, runs in doc.get("served", {}).items():
        print(f"served in SGLang's loop, {regime} (replayed with the served bundle in brackets):")
        check = doc.get("served_replay_check", {}).get(regime, {})
        for p, r in runs.items():
            again = check.get(p, {}).get("mean_completion_rounds")
            print(
                f"  {p:15s} mean {r['mean_completion_rounds']:9.2f}  p99 "
                f"{r['p99_completion_rounds']:9.2f}  finished {r['finished']}/{r['requests']}"
                + (f"  [{again}]" if again is not None else "")
            )
    for regime, runs in doc.get("served_replay_check", {}).items():
        guarded = {p: r for p, r in runs.items() if p.endswith("+guard") or p == "dwise"}
        print(f"at equal tails ({regime}, replayed): each baseline under the default's tail rule")
        for p, r in guarded.items():
            print(
                f"  {p:15s} mean {r['mean_completion_rounds']:9.2f}  p99 "
                f"{r['p99_completion_rounds']:9.2f}"
            )
    for regime, runs in doc.get("replayed", {}).items():
        if regime == "setting":
            continue
        print(f"replayed {regime} (served reference in brackets):")
        ref = doc["served_reference"][regime]
        for p, r in runs.items():
            seen = ref.get(p, {}).get("mean_completion_rounds")
            print(
                f"  {p:15s} mean {r['mean_completion_rounds']:9.2f}  p99 "
                f"{r['p99_completion_rounds']:9.2f}  finished {r['finished']}/{r['requests']}"
                + (f"  [served mean {seen}]" if seen is not None else "")
            )
    for key, name in (("simulated", "completion_rounds"), ("simulated_seconds", "latency_s")):
        for regime, runs in doc[key].items():
            if regime in ("arrivals", "setting", "table12"):
                continue
            print(f"{key} {regime} ({doc[key]['arrivals'][regime]}):")
            for p, r in runs.items():
                print(
                    f"  {p:15s} mean {r[f'mean_{name}']:9.2f}  p99 {r[f'p99_{name}']:9.2f}  "
                    f"finished {r['finished']}/{r['requests']}"
                )


if __name__ == "__main__":
    raise SystemExit(main())
