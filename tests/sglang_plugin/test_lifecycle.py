"""Hot swap in SGLang 0.5.23's real loop (tiny-bd on CPU): a new bundle revision is loaded off
the scheduler thread, shadows, is promoted between rounds; bad revisions never serve.

The watched ``DWISE_SGLANG_BUNDLE`` is a symlink flipped to each revision (revisions.py), the
revisions are the zoo's tiny-bd bundle re-published with other admission models or another
fingerprint. Requests are served round by round while the revisions arrive.
"""

from __future__ import annotations

import logging
import time

import pytest
from harness import CpuServer, TinyBDRunner, environ, eval_requests, plugin_env, serve
from prometheus_client import CollectorRegistry
from revisions import publish, random_text, revision, scaled_copy_text, split_text

from dwise_predict import load_bundle
from dwise_predict.errors import ConfigError
from dwise_predict.sglang import metrics, plugin, seam
from dwise_predict.sglang.config import PluginConfig, load_config
from dwise_predict.sglang.prompt import served_prompt

B, K = 4, 2
LABELS = {"model_name": "tiny-bd"}


@pytest.fixture(scope="module")
def runner() -> TinyBDRunner:
    return TinyBDRunner(memo=True)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("revisions")
    r1 = revision("tiny-bd", root / "r1", 1)
    return {
        "r1": r1,
        # the same ranking, 1.25x the estimates: a revision that predicts differently
        "r2": revision(r1, root / "r2", 2, admission_text=scaled_copy_text(r1, 1.25)),
        "worse": revision(r1, root / "worse", 3, admission_text=random_text(r1)),
        "other-model": revision(r1, root / "other", 4, threshold=0.9),
    }


@pytest.fixture(scope="module")
def requests(runner):
    return eval_requests(40, runner, max_new_tokens=32, max_prompt_tokens=160)


@pytest.fixture(scope="module")
def stock(runner, requests):
    """Each request's output under stock SGLang (no plugin), the same arrivals."""
    from harness import remove_hooks

    remove_hooks()
    res, _ = serve(
        requests, max_running_requests=B, runner=runner, arrival_rounds=_arrivals(len(requests))
    )
    return res.output_ids


def _arrivals(n: int) -> list[int]:
    return [i // 8 for i in range(n)]  # 8 a round: a queue builds behind k*B = 8 residents


def _wait_loaded(lifecycle, n: int, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while len(lifecycle.watcher.loads) < n:
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"the watcher loaded {len(lifecycle.watcher.loads)} of {n}")
        time.sleep(0.01)


def _serve(requests, runner, link, *, before_round, arrivals=None, **settings):
    """Serve ``requests`` with the plugin watching ``link``; ``before_round(server, state)``
    runs before every round (the test's hand on the revisions)."""
    from harness import remove_hooks
    from sglang.srt.plugins import load_plugins

    remove_hooks()
    env = plugin_env(str(link), slots=B, k=K, watch_seconds=0.02, **settings)
    arrive = _arrivals(len(requests)) if arrivals is None else arrivals
    outputs: dict[str, list[int]] = {}
    with environ({**env, "SGLANG_PLUGINS": None}):
        load_plugins()
        with CpuServer(
            max_running_requests=B * K,
            runner=runner,
            on_scheduler=lambda s: plugin.attach(s, load_config()),
        ) as server:
            state = server.scheduler.dwise_serving
            nxt = 0
            while len(outputs) < len(requests):
                assert server.rounds < 5000, "requests left unfinished"
                while nxt < len(requests) and arrive[nxt] <= server.rounds:
                    server.submit(requests[nxt])
                    nxt += 1
                before_round(server, state)
                batch = server.step()
                for req in [] if batch is None else batch.reqs:
                    if req.finished():
                        outputs[req.rid] = list(req.output_ids)
                assert server.kv_balanced()
            server.drain()
            kv_back = server.kv_free == server.kv_free_before
            state.lifecycle.close()
    return outputs, state, kv_back


def _estimate(bundle, state, req) -> float:
    text = served_prompt(req, state.decoder, state.featurizer)
    return float(
        bundle.predict_admission_one(bundle.admission_row(text, len(seam.prompt_ids(req))))
    )


def _swap_checker(link, bundles, seen):
    """``before_round``: publish r2 before the first round, and after the round that swapped
    bundles (promotion, then a rollback if one comes) check every request the core holds:
    waiting ones carry the incoming bundle's estimate, residents admitted before the swap
    keep the outgoing one's."""
    r1, r2 = load_bundle(bundles["r1"]), load_bundle(bundles["r2"])
    incoming_of = {"promoted": r2, "rolled_back": r1}

    def before_round(server, state):
        lc = state.lifecycle
        if server.rounds == 0:
            publish(link, bundles["r2"])
            _wait_loaded(lc, 1)  # loaded on the watcher thread; taken at the next round
        for event, incoming in incoming_of.items():
            if lc.counts[event] and event not in seen:
                t = state.core.table
                waiting = t.ids[t.waiting].tolist()
                seen[event] = len(waiting)
                for rid in waiting:
                    est = _estimate(incoming, state, server.reqs[rid])
                    assert state.tracks[rid].admission == pytest.approx(est)
                    assert t.r_hat_arrival[state.core.row_of(rid)] == pytest.approx(est)
                for rid in seen["resident_before"]:
                    if rid in state.tracks and rid not in waiting:
                        tr = state.tracks[rid]
                        assert t.r_hat_arrival[state.core.row_of(rid)] == tr.admission
                        assert tr.shadow_epoch != lc.epoch  # not re-estimated
        seen["resident_before"] = [r.rid for r in seam.residents(server.scheduler)]

    return before_round


def test_a_revision_shadows_then_serves_and_the_waiting_queue_takes_its_estimates(
    runner, bundles, requests, stock, tmp_path
):
    link = tmp_path / "current"
    publish(link, bundles["r1"])
    seen: dict[str, object] = {}
    outputs, state, kv_back = _serve(
        requests,
        runner,
        link,
        before_round=_swap_checker(link, bundles, seen),
        shadow_requests=8,
        promote_margin=0.5,
        rollback_drop=2.0,  # no fall of ρ can pass 2: the promoted revision stays
    )
    lc = state.lifecycle
    assert [e.kind for e in lc.events] == ["loaded", "promoted", "kept"]
    assert "on dwise-bundle-watch" in lc.events[0].reason  # not the scheduler thread
    assert lc.label.startswith("bundle-tiny-bd@r2:") and state.bundle.manifest["revision"] == 2
    assert seen["promoted"] > 0
    # the swap re-estimated every request then waiting; the check a round later finds those
    # the round after the swap did not admit
    (switched,) = lc.reestimated
    assert switched >= seen["promoted"] and lc.served[lc.label] >= switched
    assert sum(lc.served.values()) == len(requests) + switched  # re-estimated, counted
    assert outputs == stock and kv_back


def test_a_promoted_revision_that_degrades_on_probation_is_rolled_back(runner, bundles, tmp_path):
    """The revision ranks short prompts as r1 does and long ones in reverse. Requests come
    shortest prompt first, the short third one every 4 rounds: the revision shadows on them and
    is promoted; once they have finished the long ones come one a round, faster than the
    server serves them, its ρ falls past the rollback drop while r1 ranks them well, so r1
    comes back and the queue takes r1's estimates."""
    reqs = sorted(
        eval_requests(48, runner, max_new_tokens=32, max_prompt_tokens=160),
        key=lambda r: len(r.input_ids),
    )
    third = len(reqs) // 3
    cut = len(reqs[third].input_ids)
    # Each phase judges 16 finished requests, so the long third comes after the short one has
    # finished, and spread out: in a burst the first 16 to finish are the 16 least work, among
    # them every multiple-choice question (two rounds each), whose order no estimate knows.
    arrive = [4 * i for i in range(third)] + [
        4 * third + 80 + (i - third) for i in range(third, len(reqs))
    ]
    flipping = revision(
        bundles["r1"], tmp_path / "flip", 2, admission_text=split_text(bundles["r1"], cut)
    )
    link = tmp_path / "current"
    publish(link, bundles["r1"])
    seen: dict[str, object] = {}
    outputs, state, kv_back = _serve(
        reqs,
        runner,
        link,
        before_round=_swap_checker(link, {**bundles, "r2": flipping}, seen),
        arrivals=arrive,
        shadow_requests=16,
        promote_margin=0.5,
    )
    lc = state.lifecycle
    assert [e.kind for e in lc.events] == ["loaded", "promoted", "rolled_back"], lc.events
    assert "fell more than 0.1 below its shadow ρ" in lc.events[2].reason
    assert "the previous bundle does better" in lc.events[2].reason
    assert lc.label.startswith("bundle-tiny-bd@r1:") and state.bundle.manifest["revision"] == 1
    assert seen["rolled_back"] > 0
    from harness import remove_hooks

    remove_hooks()
    stock, _ = serve(reqs, max_running_requests=B, runner=runner, arrival_rounds=arrive)
    assert outputs == stock.output_ids and kv_back


def test_bad_revisions_never_serve_and_are_reported(
    runner, bundles, requests, stock, tmp_path, monkeypatch, caplog
):
    link = tmp_path / "current"
    publish(link, bundles["r1"])
    registry = CollectorRegistry()
    monkeypatch.setattr(
        metrics, "lifecycle_gauges_for", lambda s: metrics.LifecycleGauges(LABELS, registry)
    )

    def before_round(server, state):
        lc = state.lifecycle
        if server.rounds == 0:
            publish(link, bundles["other-model"])  # fails the fingerprint check
            _wait_loaded(lc, 1)
        if server.rounds == 2:
            publish(link, bundles["worse"])  # ranks by noise: shadows, then rejected
            _wait_loaded(lc, 2)

    with caplog.at_level(logging.ERROR, logger="dwise_predict.sglang.lifecycle"):
        outputs, state, kv_back = _serve(
            requests, runner, link, before_round=before_round, shadow_requests=8
        )
    lc = state.lifecycle
    assert [e.kind for e in lc.events] == ["refused", "loaded", "rejected"]
    assert "threshold" in lc.events[0].reason and "refused" in caplog.text
    assert "candidate ρ" in lc.events[2].reason
    live = lc.label
    assert live.startswith("bundle-tiny-bd@r1:") and state.bundle.manifest["revision"] == 1
    assert lc.served == {live: len(requests), lc.events[1].revision: 0}
    state.background.drain()
    events = {
        e: registry.get_sample_value("dwise:bundle_events", {**LABELS, "event": e})
        for e in ("refused", "loaded", "rejected", "promoted")
    }
    assert events == {"refused": 1, "loaded": 1, "rejected": 1, "promoted": 0}
    assert registry.get_sample_value("dwise:bundle_revision", {**LABELS, "role": "live"}) == 1
    assert outputs == stock and kv_back


def test_hot_swap_settings():
    cfg = load_config({"DWISE_SGLANG_BUNDLE": "tiny-bd"})
    assert cfg is not None and cfg.watch_seconds == 0  # off unless asked
    with pytest.raises(ConfigError, match="WATCH_SECONDS"):
        PluginConfig(bundle="tiny-bd", watch_seconds=-1)
    with pytest.raises(ConfigError, match="SHADOW_REQUESTS"):
        PluginConfig(bundle="tiny-bd", shadow_requests=2)
    with pytest.raises(ConfigError, match="ADMISSION=lightgbm"):
        PluginConfig(bundle="tiny-bd", watch_seconds=5, admission="lightgbm+dws")
