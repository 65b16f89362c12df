"""The SGLang plugin's SGLang-free parts: settings, the quality monitor, the entry point.

The integration with SGLang's real scheduler is in tests/sglang_plugin/ (``make test-sglang``).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.sglang.config import PluginConfig, load_config
from dwise_predict.sglang.monitor import QualityMonitor
from dwise_predict.sglang.state import PluginState


def test_unset_means_plugin_off():
    assert load_config({}) is None
    assert load_config({"DWISE_SGLANG_SLOTS": "16"}) is None


def test_env_settings_parse_and_override_the_file(tmp_path):
    f = tmp_path / "dwise.json"
    f.write_text(json.dumps({"bundle": "tiny-bd", "slots": 32, "k": 4, "refine": False}))
    env = {"DWISE_SGLANG_CONFIG": str(f), "DWISE_SGLANG_SLOTS": "8", "DWISE_SGLANG_AGING": "0.5"}
    cfg = load_config({**env, "DWISE_SGLANG_POLICY": "dwise-uncapped"})
    assert cfg == PluginConfig(
        bundle="tiny-bd", policy="dwise-uncapped", slots=8, k=4, refine=False, aging=0.5
    )
    assert cfg.max_residents == 32
    # the monitor's hold reaches the monitor a plugin state builds (0: four windows)
    held = load_config(
        {**env, "DWISE_SGLANG_POLICY": "dwise-uncapped", "DWISE_SGLANG_MONITOR_HOLD": "256"}
    )
    assert held.monitor_hold == 256 and cfg.monitor_hold == 0
    assert PluginState(held, None, block_size=32).monitor.hold == 256


@pytest.mark.parametrize(
    "env, match",
    [
        ({"DWISE_SGLANG_POLICY": "lifo"}, "POLICY"),
        ({"DWISE_SGLANG_SLOTS": "0"}, "SLOTS"),
        ({"DWISE_SGLANG_K": "two"}, "K="),
        ({"DWISE_SGLANG_REFINE": "maybe"}, "REFINE"),
        ({"DWISE_SGLANG_AGING": "-1", "DWISE_SGLANG_POLICY": "dwise-uncapped"}, "AGING"),
        ({"DWISE_SGLANG_AGING": "0.5"}, "POLICY=dwise: policy 'dwise' has no setting aging"),
        ({"DWISE_SGLANG_MONITOR_HOLD": "-1"}, "MONITOR_HOLD=-1 must be a whole number"),
    ],
)
def test_bad_settings_name_the_variable(env, match):
    with pytest.raises(ConfigError, match=match):
        load_config({"DWISE_SGLANG_BUNDLE": "tiny-bd", **env})


def test_config_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read as JSON"):
        load_config({"DWISE_SGLANG_CONFIG": str(bad)})
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"bundle": "tiny-bd", "slot": 3}))
    with pytest.raises(ConfigError, match="unknown settings \\['slot'\\]"):
        load_config({"DWISE_SGLANG_CONFIG": str(unknown)})


def test_monitor_tracks_calibration_and_rank_and_warns_on_drift(tmp_path, caplog):
    rng = np.random.default_rng(0)
    m = QualityMonitor(window=50, drift_threshold=1.5)
    actual = rng.integers(5, 200, size=50).astype(float)
    for a in actual:  # admission: right scale, noisy order; refinement: exact
        m.record(a, {"admission": a * float(rng.uniform(0.8, 1.25)), "refinement": a})
    snap = m.publish(tmp_path / "monitor.json")
    assert 0.9 < snap["admission"]["median_ratio"] < 1.1
    assert snap["refinement"]["median_ratio"] == 1.0 and snap["refinement"]["spearman"] == 1.0
    assert snap["drifted"] == []
    assert json.loads((tmp_path / "monitor.json").read_text()) == snap
    for a in actual:  # the admission estimate now doubles: past the 1.5 threshold
        m.record(a, {"admission": 2.0 * a, "refinement": a})
    with caplog.at_level(logging.WARNING):
        snap = m.publish(None)
    assert snap["drifted"] == ["admission"] and snap["admission"]["n"] == 50
    assert "retrain" in caplog.text


def test_entry_point_is_declared_and_import_stays_light():
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("dwise") == "dwise_predict.sglang.plugin:register"
    code = (
        "import sys, dwise_predict.sglang.plugin, dwise_predict.sglang.serving; "
        "print(sorted(m for m in ('torch', 'sglang', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_arrivals_are_found_after_the_last_request_seen_or_by_a_full_scan():
    """SGLang appends arrivals; an abort or a retraction changes the queue otherwise."""
    from types import SimpleNamespace

    from dwise_predict import load_bundle
    from dwise_predict.sglang.serving import DwiseServing

    def req(i: int) -> SimpleNamespace:
        return SimpleNamespace(
            rid=f"r{i}",
            origin_input_ids=[0] * (40 + i),
            sampling_params=SimpleNamespace(max_new_tokens=64),
        )

    cfg = PluginConfig(bundle="tiny-bd", slots=2, k=2)
    st = DwiseServing(
        cfg,
        load_bundle("tiny-bd"),
        block_size=32,
        kv_pool_tokens=1 << 20,
        req_slots=4,
        refine=False,
    )
    queue = [req(i) for i in range(5)]
    assert st.register_arrivals(queue) == 5
    queue += [req(5), req(6)]  # appended: only the tail is looked at
    assert st.register_arrivals(queue) == 2 and {"r5", "r6"} <= set(st.reqs)
    assert st.register_arrivals(queue) == 0
    del queue[1]  # an abort in the middle, then an arrival: a full scan
    queue.append(req(7))
    assert st.register_arrivals(queue) == 1 and "r7" in st.reqs
    queue.pop()  # the last request left and another came: same length, another tail
    queue.append(req(8))
    assert st.register_arrivals(queue) == 1 and "r8" in st.reqs


def test_served_prompts_lose_the_chat_template_before_their_features():
    """SGLang 0.5.23's requests hold only the prompt's ids, after the chat template; the bundle
    was trained on raw prompts, so a served request must get the raw prompt's estimate."""
    from types import SimpleNamespace

    from dwise_predict import load_bundle
    from dwise_predict.sglang.prompt import PromptDecoder, served_prompt
    from dwise_predict.sglang.serving import DwiseServing

    bundle = load_bundle("tiny-bd")
    f = bundle.admission.featurizer
    raw = "Summarise the following notes.\nfirst note\nsecond note"
    templated = f.render(raw)
    ids = f.tokenizer.encode(templated).ids
    sp = SimpleNamespace(max_new_tokens=64)
    by_text = SimpleNamespace(rid="t", origin_input_ids=ids, sampling_params=sp)
    by_ids = SimpleNamespace(rid="i", origin_input_ids=list(ids), sampling_params=sp)
    assert served_prompt(by_ids, PromptDecoder(f.tokenizer), f) == raw
    assert served_prompt(by_ids, None, f) == ""  # no tokenizer: the token count only
    st = DwiseServing(
        PluginConfig(bundle="tiny-bd", slots=2, k=2),
        bundle,
        block_size=32,
        kv_pool_tokens=1 << 20,
        req_slots=4,
        refine=False,
    )
    assert st.register_arrivals([by_text, by_ids], tokenizer=f.tokenizer) == 2
    expected = float(bundle.predict_admission([raw])[0])
    assert st.tracks["t"].admission == pytest.approx(expected)
    assert st.tracks["i"].admission == pytest.approx(expected)


def test_prompt_decoder_reads_byte_level_ids_as_decode_does_and_falls_back_on_a_difference():
    from array import array
    from types import SimpleNamespace

    import tokenizers

    from dwise_predict import load_bundle
    from dwise_predict.sglang.prompt import PromptDecoder, served_prompt

    tok = load_bundle("tiny-bd").admission.featurizer.tokenizer
    fast = PromptDecoder(tok, verify=0)
    assert fast.fast
    texts = [
        "<|user|>\nSum 12 and 30.\n\nThen   stop.<|eos|>",
        "héllo 日本語\u3000wide space, tabs\tand\r\nnewlines",
        "",
    ]
    for text in texts:
        ids = tok.encode(text).ids
        want = tok.decode(ids, skip_special_tokens=False)
        assert fast(ids) == fast(array("q", ids)) == want
    # served prompts keep their words and newlines through the fast path and the frame
    f = load_bundle("tiny-bd").admission.featurizer
    for raw in ["two  words\n\tthree\r\nfour", "fünf wörter hier", "sep\x1carated", "", "x"]:
        ids = tok.encode(f.render(raw)).ids
        assert served_prompt(SimpleNamespace(origin_input_ids=ids), fast, f) == raw
    # a table that disagrees with the tokenizer is caught on a verified call, then dropped
    wrong = PromptDecoder(tok, verify=1)
    wrong.table = wrong.table.copy()
    wrong.table[tok.token_to_id("Ġ") or 0] = b"#"
    ids = tok.encode("a b c").ids
    assert wrong(ids) == tok.decode(ids, skip_special_tokens=False) and not wrong.fast
    # a tokenizer that is not byte-level BPE is decoded by the tokenizer itself
    wp = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    assert not PromptDecoder(wp).fast
