"""The simulator on the paper-matched workload, arrivals, the round-time fit, traces, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from dwise_predict.cli import main
from dwise_predict.errors import ConfigError, SchedulerError, TraceError
from dwise_predict.runtime import (
    DWISE,
    FCFS,
    ArrivalSpec,
    OracleSRPT,
    RoundTimeModel,
    Workload,
    compare_policies,
    describe,
    make_arrivals,
    requests_from_traces,
    simulate,
    spearman,
    summarize,
    synthetic_workload,
)


@pytest.fixture(scope="module")
def paper_workload() -> Workload:
    return synthetic_workload("paper-llada2.1-mini", seed=0)


@pytest.fixture(scope="module")
def burst_runs(paper_workload):
    return {
        p.name: summarize(simulate(paper_workload, p, arrivals="burst", slots=128, k=8))
        for p in (FCFS(), DWISE(), OracleSRPT())
    }


def test_synthetic_workload_matches_the_papers_shape(paper_workload):
    d = describe(paper_workload)
    assert d["requests"] == 4096
    assert (d["rounds_p25"], d["rounds_p50"], d["rounds_p90"], d["rounds_max"]) == (
        14,
        46,
        149,
        279,
    )
    assert d["mcq_request_frac"] == pytest.approx(0.23, abs=0.005)
    assert d["mcq_work_frac"] == pytest.approx(0.031, abs=0.006)
    assert d["chat_instruction_mean_rounds"] == pytest.approx(115, rel=0.05)
    assert d["code_math_mean_rounds"] == pytest.approx(45, rel=0.05)
    assert d["full_budget_frac"] == pytest.approx(0.57, abs=0.02)
    assert d["long_context_requests"] == 150
    assert d["long_context_mean_tokens"] == pytest.approx(10_000, rel=0.03)
    assert d["admission_spearman"] == pytest.approx(0.74, abs=0.005)
    assert d["refined_spearman"] == pytest.approx(0.87, abs=0.005)
    assert set(paper_workload.block_size.tolist()) == {32}


def test_synthetic_workload_is_reproducible_and_seeded():
    a, b, c = (synthetic_workload(n=300, seed=s) for s in (1, 1, 2))
    assert np.array_equal(a.rounds_flat, b.rounds_flat) and np.array_equal(a.refined, b.refined)
    assert not np.array_equal(a.rounds_flat, c.rounds_flat)
    with pytest.raises(ConfigError, match="Spearman"):
        synthetic_workload(n=300, spearman=1.5)
    with pytest.raises(ConfigError, match="preset"):
        synthetic_workload("nope")


def test_paper_round_composition_and_makespans_under_burst(burst_runs):
    fcfs, dwise, oracle = burst_runs["fcfs"], burst_runs["dwise"], burst_runs["oracle"]
    # SGLang FCFS prefill-first: paper 94.6% prefill-only rounds, 5.0 filled slots per round
    assert fcfs["prefill_only_round_frac"] >= 0.85
    assert fcfs["filled_slots_per_round"] <= 10
    # DWISE with oracle estimates: paper 113.2 slots per round, 2,819 vs 63,926 rounds
    assert oracle["filled_slots_per_round"] >= 100
    assert fcfs["rounds"] >= 5 * oracle["rounds"]
    # makespans within 15% of the paper's ~1,050 s and ~510 s; median round ~95 ms
    assert fcfs["makespan"] == pytest.approx(1050, rel=0.15)
    assert dwise["makespan"] == pytest.approx(510, rel=0.15)
    assert dwise["median_round_ms"] == pytest.approx(95, rel=0.15)
    # mean-latency gain (paper: 7.1x burst)
    assert fcfs["mean_latency"] / dwise["mean_latency"] >= 3.5
    assert oracle["mean_latency"] <= dwise["mean_latency"]
    # refining once: the paper measured 0.34 preemptions per request
    assert 0.05 <= dwise["preemptions_per_request"] <= 1.0


def test_context_term_is_needed_to_reproduce_the_median_round(paper_workload):
    """Without the context term, the two makespans force ≈1.6 ms per slot and a ≈210 ms round."""
    runs = {p.name: simulate(paper_workload, p, arrivals="burst") for p in (FCFS(), DWISE())}
    f, d = runs["fcfs"], runs["dwise"]
    a = (1050e3 - 510e3) / (f.round_ms.size - d.round_ms.size)
    b = (510e3 - a * d.round_ms.size) / d.round_filled.sum()
    flat = RoundTimeModel(a, b, 0.0)
    assert np.median(flat.round_ms(d.round_filled, 0.0)) > 1.5 * 95


def test_round_time_fit_recovers_known_coefficients():
    rng = np.random.default_rng(0)
    filled = rng.integers(1, 129, 500)
    ctx = rng.uniform(0, 400_000, 500)
    truth = RoundTimeModel(9.0, 0.6, 1.1)
    wall = truth.round_ms(filled, ctx) + rng.normal(0, 0.5, 500)
    fit = RoundTimeModel.fit(filled, ctx, wall)
    assert fit.overhead_ms == pytest.approx(9.0, abs=0.3)
    assert fit.per_slot_ms == pytest.approx(0.6, abs=0.01)
    assert fit.per_slot_per_1k_context_ms == pytest.approx(1.1, abs=0.01)
    # a negative coefficient has no meaning: NNLS clamps it to zero
    nonneg = RoundTimeModel.fit(filled, ctx, 20.0 - 0.01 * filled + rng.normal(0, 0.1, 500))
    assert nonneg.per_slot_ms == 0.0 and nonneg.overhead_ms > 0
    with pytest.raises(ConfigError, match="NaN"):
        RoundTimeModel.fit([1, 2, 3], [1, 2, np.nan], [1, 2, 3])


def test_arrivals_parse_and_generate():
    assert ArrivalSpec.parse("burst+poisson:16") == ArrivalSpec("burst+poisson", 16.0)
    for bad in (
        "poisson:0",
        "poisson:-1",
        "poisson",
        "poisson:abc",
        "uniform",
        "burst:3",
        "poisson:nan",
    ):
        with pytest.raises(ConfigError):
            ArrivalSpec.parse(bad)
    a = make_arrivals("burst+poisson:16", 1000, seed=3)
    assert np.all(np.diff(a.times) >= 0) and np.sum(a.times == 0) >= 500
    assert (a.times[-1] / 500) == pytest.approx(1 / 16, rel=0.15)
    b = make_arrivals("burst+poisson:16", 1000, seed=3)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.times, b.times)
    assert sorted(a.order.tolist()) == list(range(1000))


def test_poisson_arrivals_under_light_load_keep_latency_near_service_time():
    w = synthetic_workload(n=200, seed=4)
    light = summarize(simulate(w, DWISE(), arrivals="poisson:0.5", slots=128))
    heavy = summarize(simulate(w, DWISE(), arrivals="burst", slots=128))
    assert light["mean_latency"] < heavy["mean_latency"]
    assert light["makespan"] > 200 / 0.5 * 0.8  # the arrivals, not the work, set the makespan


def _trace_table(w: Workload) -> pa.Table:
    rpb = [w.rounds_flat[a:b].tolist() for a, b in zip(w.block_offsets[:-1], w.block_offsets[1:])]
    return pa.table(
        {
            "request_id": [str(x) for x in w.request_ids],
            "category": [str(c) for c in w.category],
            "prompt_tokens": pa.array(w.prompt_tokens, pa.int32()),
            "prompt_blocks": pa.array(w.prompt_blocks, pa.int32()),
            "output_budget": pa.array(w.output_budget, pa.int32()),
            "block_size": pa.array(w.block_size, pa.int32()),
            "rounds_per_block": pa.array(rpb, pa.list_(pa.int32())),
            "output_tokens": pa.array(w.output_tokens, pa.int32()),
        }
    )


def test_requests_from_traces_round_trips_and_rejects_bad_traces():
    w = synthetic_workload(n=64, seed=5)
    table = _trace_table(w)
    reqs = requests_from_traces(table, admission=w.admission, refined=w.refined)
    back = Workload.from_requests(reqs)
    assert np.array_equal(back.rounds_flat, w.rounds_flat) and np.allclose(back.refined, w.refined)
    a = summarize(simulate(back, DWISE()))
    b = summarize(simulate(w.with_estimates(cost=None), DWISE()))
    assert a["mean_latency"] == pytest.approx(b["mean_latency"])
    with pytest.raises(TraceError, match="rounds_per_block"):
        requests_from_traces(table.drop(["rounds_per_block"]))
    bad = table.set_column(
        table.column_names.index("rounds_per_block"),
        "rounds_per_block",
        pa.array(
            [[0, 2]] + [r for r in table.column("rounds_per_block").to_pylist()[1:]],
            pa.list_(pa.int32()),
        ),
    )
    with pytest.raises(SchedulerError, match="< 1 round"):
        requests_from_traces(bad)
    with pytest.raises(SchedulerError, match="NaN means"):
        requests_from_traces(table, admission=np.full(64, np.nan))
    with pytest.raises(SchedulerError, match="one per request"):
        requests_from_traces(table, admission=np.ones(3))


def test_compare_policies_report_json_and_plots(tmp_path):
    w = synthetic_workload(n=256, seed=6)
    report = compare_policies(
        w, "fcfs,mlfq,sjf,dwise,oracle,dws-sjf", "burst+poisson:8", slots=16, k=4, seed=1
    )
    text = report.table()
    assert "dwise" in text and "paper, LLaDA2.1-mini: 7.1x burst, 10.7x burst+Poisson" in text
    assert report.gain() > 1.0
    d = json.loads(report.to_json(tmp_path / "s.json").read_text())
    for name in ("fcfs", "mlfq", "sjf", "dwise", "oracle", "dws-sjf"):
        for key in (
            "mean_latency",
            "p50_latency",
            "p99_latency",
            "mean_ttft",
            "throughput",
            "rounds",
            "prefill_only_round_frac",
            "filled_slots_per_round",
            "preemptions_per_request",
        ):
            assert np.isfinite(d["policies"][name][key])
    assert d["per_category"]["dwise"]["chat"]["requests"] > 0
    pngs = report.plot(tmp_path)
    assert all(p.stat().st_size > 10_000 and p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    with pytest.raises(ConfigError, match="unknown policy"):
        compare_policies(w, "fcfs,lifo")


def test_cli_simulate_synthetic(tmp_path, capsys):
    rc = main(
        [
            "simulate",
            "--synthetic",
            "paper-llada2.1-mini",
            "--requests",
            "300",
            "--policies",
            "fcfs,dwise,oracle",
            "--arrival",
            "burst",
            "--slots",
            "32",
            "--k",
            "4",
            "--out",
            str(tmp_path),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0 and "DWISE mean-latency gain over FCFS" in out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["policies"]) == {"fcfs", "dwise", "oracle"}
    assert (tmp_path / "latency_cdf.png").exists() and (tmp_path / "round_composition.png").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["--arrival", "poisson:0"],
        ["--arrival", "poisson:-2"],
        ["--slots", "0"],
        ["--k", "0"],
        ["--policies", "fcfs,bogus"],
    ],
)
def test_cli_simulate_bad_arguments_fail_cleanly(tmp_path, capsys, argv):
    rc = main(
        [
            "simulate",
            "--synthetic",
            "paper-llada2.1-mini",
            "--requests",
            "50",
            "--out",
            str(tmp_path),
            "--no-plots",
            "--quiet",
            *argv,
        ]
    )
    err = capsys.readouterr().err
    assert rc != 0 and "error:" in err and "Traceback" not in err


def test_spearman_matches_definition():
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    assert spearman(x, x**3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert spearman(np.array([1.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0])) == pytest.approx(
        0.8660254
    )


def test_spearman_agrees_with_scipy_on_ties_and_is_none_when_undefined():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 6, 200), rng.integers(0, 9, 200) + rng.integers(0, 6, 200)
    assert spearman(a, b) == pytest.approx(float(spearmanr(a, b).statistic), abs=1e-12)
    assert spearman([4.0, 4.0, 4.0, 4.0], [1.0, 2.0, 3.0, 4.0]) is None  # a constant side
    assert spearman([1.0, 2.0], [2.0, 1.0]) is None  # two points always give ±1
    assert spearman([1.0, float("nan"), 3.0], [1.0, 2.0, 3.0]) is None


def test_the_component_ladder_rungs_read_what_their_names_say():
    """dwise-r0 ranks by prompt blocks alone, dwise-admission never refines, dwise-uncapped (the
    paper's DWISE) does both: the same names the SGLang plugin serves under."""
    from dwise_predict.runtime import DWISE, make_policy
    from dwise_predict.runtime.simulator import policy_inputs

    w = synthetic_workload(n=400, seed=3)
    r0, adm, full = (make_policy(n) for n in ("dwise-r0", "dwise-admission", "dwise-uncapped"))
    assert (r0.name, adm.name, full.name) == ("dwise-r0", "dwise-admission", "dwise-uncapped")
    i0, ia, i_full = (policy_inputs(w, p) for p in (r0, adm, full))
    assert not np.any(i0["admission"]) and i0["refined"] is None
    assert np.array_equal(ia["admission"], w.admission) and ia["refined"] is None
    assert np.array_equal(i_full["refined"], w.refined)
    assert make_policy("dwise-uncapped", aging=0.5).aging == 0.5
    assert make_policy("mlfq-mixed").batch_former == "mixed"
    with pytest.raises(ConfigError, match="estimates="):
        DWISE(estimates="some")
    # on the paper-matched workload, each rung adds to the one below it, and the oracle bounds it
    mean = {
        name: summarize(simulate(w, make_policy(name), arrivals="burst", slots=32))["mean_latency"]
        for name in ("dwise-r0", "dwise-admission", "dwise-uncapped", "oracle")
    }
    assert mean["oracle"] <= mean["dwise-uncapped"] <= mean["dwise-admission"] <= mean["dwise-r0"]


def test_arrivals_priced_late_when_full_join_the_next_round():
    """The SGLang plugin prices arrivals with DWS's text encoder on a worker thread once B
    requests are resident: they join the plan a round later. With room, they join at once."""
    from dwise_predict.runtime import Arrivals, SimRequest

    def req(rid: str, rounds: tuple[int, ...]) -> SimRequest:
        est = float(sum(rounds))
        return SimRequest(rid, 0, 16, rounds, 32 * len(rounds), 32, admission_estimate=est)

    # a long request runs alone from round 0; a short one arrives at round 5 and preempts it
    w = Workload.from_requests([req("long", (10, 10)), req("short", (3,))])
    arrivals = Arrivals(np.array([0, 1]), np.array([0.0, 5e-3]))
    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)

    def rounds(slots: int, late: bool) -> tuple[float, float]:
        run = simulate(
            w,
            DWISE(),
            arrivals=arrivals,
            slots=slots,
            k=2,
            round_time=rt,
            priced_late_when_full=late,
        )
        return round(run.first_block_time[1] * 1e3, 6), round(run.finish_time[1] * 1e3, 6)

    assert rounds(1, late=False) == (8.0, 8.0)  # runs rounds 5, 6, 7
    assert rounds(1, late=True) == (9.0, 9.0)  # priced during round 5, runs 6, 7, 8
    assert rounds(2, late=True) == rounds(2, late=False) == (8.0, 8.0)  # a free row: at once
    # every request still finishes, with the same work
    run = simulate(
        w, DWISE(), arrivals=arrivals, slots=1, k=2, round_time=rt, priced_late_when_full=True
    )
    assert np.all(np.isfinite(run.finish_time)) and run.round_filled.sum() == 23


def test_arrivals_on_round_boundaries_join_their_round_after_thousands_of_rounds():
    """A served run's arrivals fall on round boundaries (round k at k ms in the replay). The
    clock must still read exactly k ms at round k after thousands of rounds, or some arrivals
    are seen a round late and the replay runs a different schedule (it did: a running sum of
    1 ms rounds in seconds drifted below 1.236 s by round 1,236)."""
    from dwise_predict.runtime import FCFS, Arrivals, SimRequest

    def req(rid: str, rounds: tuple[int, ...]) -> SimRequest:
        return SimRequest(rid, 0, 16, rounds, 32 * len(rounds), 32, admission_estimate=1.0)

    # one request keeps the server busy (no idle jump resets the clock); a one-round request
    # arrives at every 7th round from 1,000 to 4,000: each runs in its arrival round
    at = list(range(1000, 4000, 7))
    w = Workload.from_requests([req("busy", (5000,)), *(req(f"r{k}", (1,)) for k in at)])
    arrivals = Arrivals(np.arange(w.n), np.array([0, *at], dtype=np.float64) / 1e3)
    rt = RoundTimeModel(overhead_ms=1.0, per_slot_ms=0.0, per_slot_per_1k_context_ms=0.0)
    for policy in (FCFS(batch_former="mixed"), DWISE()):
        run = simulate(w, policy, arrivals=arrivals, slots=4, k=2, round_time=rt)
        latency_rounds = (run.finish_time[1:] - arrivals.times[1:]) * 1e3
        assert np.allclose(latency_rounds, 1.0, rtol=0, atol=1e-9), policy.name
        assert run.finish_time[1:].tolist() == [(k + 1) / 1e3 for k in at]
        assert run.finish_time[0] * 1e3 == 5000.0
