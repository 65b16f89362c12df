"""tiny-bd: the training layout matches decoding, training learns, data never touches eval,
checkpoints round-trip, and the shipped weights decode an easy prompt confidently."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dwise_predict.tracing.workload import WorkloadRecord, make_math, make_mcq
from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
from dwise_predict.zoo.tiny_bd.generate import _extend, generate, prefill
from dwise_predict.zoo.tiny_bd.io import WEIGHTS_DIR, from_pretrained, save_pretrained
from dwise_predict.zoo.tiny_bd.model import TinyBDModel
from dwise_predict.zoo.tiny_bd.recipe.data import (
    STRUCTURED_MATH_CLOSING,
    DataConfig,
    TrainingExample,
    build_training_set,
    encode_examples,
    generated_examples,
    render_prompt,
    structured_math_response,
    token_budget_batches,
)
from dwise_predict.zoo.tiny_bd.recipe.free_text import (
    BRIEF_CLOSINGS,
    BRIEF_OPENINGS,
    CATEGORY_WEIGHTS,
    CLARIFY,
    CLOSINGS,
    OPENINGS,
    STRUCTURED_CODE_CLOSING,
    STRUCTURED_CODE_OPENING,
    ContentPools,
    free_text_examples,
    free_text_sources,
)
from dwise_predict.zoo.tiny_bd.recipe.train import (
    diffusion_loss,
    lr_factor,
    parse_free_text_categories,
    parse_math_ops,
    parse_mcq_kinds,
    parse_mix,
)
from dwise_predict.zoo.tiny_bd.recipe.two_stream import (
    CLEAN,
    NOISY,
    PROMPT,
    absolute_layout,
    collate,
)
from dwise_predict.zoo.tiny_bd.tokenizer import EOS, MASK, build_tokenizer

from dwise_predict.errors import ModelError, TrainingError

BS = 8


def tiny_model(seed: int = 0) -> TinyBDModel:
    torch.manual_seed(seed)
    return TinyBDModel(
        TinyBDConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, block_size=BS)
    ).eval()


def test_noisy_block_sees_exactly_prompt_clean_prefix_and_itself() -> None:
    lp, lr = 11, 3 * BS  # prompt not a multiple of the block size: output blocks start at 11
    b = collate(
        [list(range(10, 10 + lp))],
        [list(range(40, 40 + lr))],
        BS,
        generator=torch.Generator().manual_seed(0),
    )
    mask, kind = b.attn_mask[0, 0], b.kind[0]
    assert (
        b.position_ids[0, lp : lp + lr].tolist()
        == b.position_ids[0, lp + lr : lp + 2 * lr].tolist()
        == list(range(lp, lp + lr))
    )
    for j in range(3):
        q = lp + lr + j * BS  # first noisy token of output block j
        seen = set(torch.nonzero(mask[q]).flatten().tolist())
        expected = (
            set(range(lp))
            | set(range(lp, lp + j * BS))
            | set(range(lp + lr + j * BS, lp + lr + (j + 1) * BS))
        )
        assert seen == expected
    # clean block j sees the prompt and clean blocks <= j; prompt chunk c sees chunks <= c
    q = lp + BS
    assert set(torch.nonzero(mask[q]).flatten().tolist()) == set(range(lp + 2 * BS))
    assert set(torch.nonzero(mask[3]).flatten().tolist()) == set(range(BS))
    assert set(torch.nonzero(mask[9]).flatten().tolist()) == set(range(lp))
    assert (
        (kind[:lp] == PROMPT).all()
        and (kind[lp : lp + lr] == CLEAN).all()
        and (kind[lp + lr :] == NOISY).all()
    )


def test_training_logits_equal_cached_block_by_block_inference() -> None:
    """The key consistency check: what training optimises is what decoding computes."""
    model = tiny_model()
    prompts = [list(range(10, 31)), list(range(12, 17))]
    responses = [list(range(40, 40 + 3 * BS)), list(range(50, 50 + BS))]
    batch = collate(prompts, responses, BS, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        logits = model(batch.input_ids, batch.position_ids, batch.attn_mask).logits
    for i, (p, r) in enumerate(zip(prompts, responses)):
        lp, lr = len(p), len(r)
        for j in range(lr // BS):
            cache = prefill(model, p, BS)
            for jj in range(j):
                x = torch.tensor(r[jj * BS : (jj + 1) * BS])[None]
                with torch.no_grad():
                    cache = _extend(
                        cache,
                        model(
                            x, torch.arange(lp + jj * BS, lp + (jj + 1) * BS)[None], None, cache
                        ).kv,
                    )
            noisy = batch.input_ids[i, lp + lr + j * BS : lp + lr + (j + 1) * BS][None]
            assert (noisy == MASK).any() or j >= 0  # noise is random; equality must hold either way
            with torch.no_grad():
                ref = model(
                    noisy, torch.arange(lp + j * BS, lp + (j + 1) * BS)[None], None, cache
                ).logits[0]
            got = logits[i, lp + lr + j * BS : lp + lr + (j + 1) * BS]
            torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_absolute_layout_trains_what_the_server_decodes() -> None:
    """Absolute layout (how SGLang serves tiny-bd): the prompt's tail opens the first output
    block as clean, unmasked input with no loss, every block starts at a multiple of the block
    size, and the logits still equal a cached block-by-block forward of that layout."""
    model = tiny_model()
    prompts = [list(range(10, 31)), list(range(12, 17)), list(range(20, 36))]  # 21, 5, 16 tokens
    responses = [
        list(range(40, 45)) + [EOS] * 3 + [EOS] * BS,  # enough EOS padding to take the tail
        [50, 51, 52, 53, 54, 55, 56, EOS],  # none: one more block of padding
        list(range(60, 60 + BS)),  # a prompt of whole blocks has no tail
    ]
    batch = collate(
        prompts,
        responses,
        BS,
        generator=torch.Generator().manual_seed(3),
        mask_ratios=None,
        absolute=[True, True, True],
    )
    with torch.no_grad():
        logits = model(batch.input_ids, batch.position_ids, batch.attn_mask).logits
    expected_tail = [21 % BS, 5 % BS, 0]
    for i, (p, m) in enumerate(zip(prompts, expected_tail)):
        head = p[: len(p) - m]
        noisy_at = torch.nonzero(batch.kind[i] == NOISY).flatten()
        r = batch.input_ids[i, len(head) : len(head) + len(noisy_at)].tolist()  # clean stream
        assert r[:m] == p[len(p) - m :] and len(r) % BS == 0
        first = int(noisy_at[0])
        assert int(batch.position_ids[i, first]) % BS == 0
        tail_q = noisy_at[:m]
        assert batch.input_ids[i, tail_q].tolist() == p[len(p) - m :]  # never masked
        assert (batch.targets[i, tail_q] == -100).all()
        for j in range(len(r) // BS):
            cache = prefill(model, head, BS)
            for jj in range(j):
                x = torch.tensor(r[jj * BS : (jj + 1) * BS])[None]
                pos = torch.arange(len(head) + jj * BS, len(head) + (jj + 1) * BS)[None]
                with torch.no_grad():
                    cache = _extend(cache, model(x, pos, None, cache).kv)
            q = noisy_at[j * BS : (j + 1) * BS]
            pos = torch.arange(len(head) + j * BS, len(head) + (j + 1) * BS)[None]
            with torch.no_grad():
                ref = model(batch.input_ids[i, q][None], pos, None, cache).logits[0]
            torch.testing.assert_close(logits[i, q], ref, atol=1e-5, rtol=1e-5)
    # the two padding cases keep a whole number of blocks
    assert absolute_layout(prompts[0], responses[0], BS)[1][-1] == EOS
    assert len(absolute_layout(prompts[1], responses[1], BS)[1]) == 2 * BS


def test_one_training_step_lowers_the_loss_on_a_tiny_batch() -> None:
    model = tiny_model(1).train()
    tok = build_tokenizer()
    examples = [
        TrainingExample("Copy the text exactly: abcab", "abcab", "synthetic", "generated"),
        TrainingExample("What is 2 + 3?", "The answer is 5.", "math", "generated"),
    ]
    enc, dropped = encode_examples(examples, block_size=BS)
    assert dropped == 0 and tok is not None
    batch = collate(
        [e.prompt_ids for e in enc],
        [e.response_ids for e in enc],
        BS,
        generator=torch.Generator().manual_seed(0),
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = diffusion_loss(model, batch)
    before.backward()
    opt.step()
    with torch.no_grad():
        after = diffusion_loss(model, batch)
    assert float(after) < float(before.detach()) - 0.05, (float(before.detach()), float(after))
    with torch.no_grad():
        weighted = diffusion_loss(model, batch, "inv_t")
    assert torch.isfinite(weighted) and float(weighted) >= float(after) - 1e-6  # 1/t >= 1


def test_pad_weight_scales_only_the_eos_padding_after_the_first_eos() -> None:
    model = tiny_model(2)
    resp = [40, 41, EOS] + [EOS] * (BS - 3)  # answer, its EOS, then padding
    batch = collate([[10, 11, 12]], [resp], BS, mask_ratios=[[1.0]])
    noisy = batch.targets != -100
    assert batch.eos_padding is not None
    assert batch.eos_padding[noisy].tolist() == [False, False, False] + [True] * (BS - 3)
    with torch.no_grad():
        logits = model(batch.input_ids, batch.position_ids, batch.attn_mask).logits[noisy]
        ce = torch.nn.functional.cross_entropy(logits, batch.targets[noisy], reduction="none")
        plain = diffusion_loss(model, batch, pad_weight=1.0)
        no_pad = diffusion_loss(model, batch, pad_weight=0.0)
        tenth = diffusion_loss(model, batch, pad_weight=0.1)
    assert torch.isclose(plain, ce.mean()) and torch.isclose(no_pad, ce[:3].mean())
    w = torch.tensor([1.0] * 3 + [0.1] * (BS - 3))
    assert torch.isclose(tenth, (ce * w).sum() / w.sum())


def test_encode_pads_with_eos_and_drops_responses_over_budget() -> None:
    ex = [
        TrainingExample("p", "x" * 40, "chat", "sharegpt"),
        TrainingExample("p", "y" * 300, "chat", "sharegpt"),
    ]
    enc, dropped = encode_examples(ex, block_size=32, max_new_tokens=256)
    assert dropped == 1 and len(enc) == 1
    resp = enc[0].response_ids
    assert len(resp) == 64 and resp[40:] == (EOS,) * 24 and EOS not in resp[:40]
    assert build_tokenizer().decode(
        list(enc[0].prompt_ids), skip_special_tokens=False
    ) == render_prompt("p")


def test_training_data_never_contains_an_eval_prompt() -> None:
    # an eval split that holds exactly what the generators would draw first for this seed
    fresh = generated_examples("mcq", 5, seed=7, exclude=set()) + generated_examples(
        "synthetic", 5, 7, set()
    )
    eval_recs = [
        WorkloadRecord(
            f"e{i}", e.category if e.category != "synthetic" else "mcq", "generated", e.prompt
        )
        for i, e in enumerate(fresh)
    ]
    train_recs = [
        WorkloadRecord("t0", "code", "humaneval", "Complete this: def f(): pass", "    return 1\n"),
        WorkloadRecord(
            "t1",
            "chat",
            "sharegpt",
            "hello there",
            "Hi! How can I help?",
            {"conversation_id": "c1"},
        ),
        WorkloadRecord("t2", "chat", "sharegpt", fresh[0].prompt, "leaked reply"),
    ]  # also in eval
    convs = {
        "c1": {
            "conversations": [
                {"from": "human", "value": "hello there"},
                {"from": "gpt", "value": "Hi!"},
                {"from": "human", "value": "and you?"},
                {"from": "gpt", "value": "Fine."},
            ]
        }
    }
    splits = SimpleNamespace(train=train_recs, eval=eval_recs)
    cfg = DataConfig(n_generated=400, real_repeats=2, mix={"mcq": 0.5, "synthetic": 0.5})
    ts = build_training_set(cfg, seed=7, splits=splits, conversations=convs)
    eval_ids = {tuple(build_tokenizer().encode(render_prompt(r.prompt)).ids) for r in eval_recs}
    assert not eval_ids & {e.prompt_ids for e in ts.examples}
    assert ts.counts["chat"] == 4  # first reply + the later turn, twice; the leaked one dropped
    assert ts.counts["code"] == 2 and ts.counts["mcq"] + ts.counts["synthetic"] == 400
    assert ts.eval_prompts_checked == len(eval_recs)
    again = build_training_set(cfg, seed=7, splits=splits, conversations=convs)
    assert [e.prompt_ids for e in again.examples] == [
        e.prompt_ids for e in ts.examples
    ]  # reproducible


def test_math_weights_steer_the_difficulty_of_generated_problems() -> None:
    easy = generated_examples("math", 200, seed=1, exclude=set(), math_weights=(1.0, 0.0, 0.0))
    assert {e.knobs["ops"] for e in easy} == {1} and max(e.knobs["digits"] for e in easy) <= 2
    mixed = generated_examples("math", 200, seed=1, exclude=set(), math_weights=(0.0, 0.0, 1.0))
    assert max(e.knobs["digits"] for e in mixed) == 5 and max(e.knobs["ops"] for e in mixed) == 3
    with pytest.raises(TrainingError, match="math_weights"):
        generated_examples("math", 5, seed=1, exclude=set(), math_weights=(1.0, -1.0, 0.0))


def test_parse_mix_reads_shares_and_names_bad_entries() -> None:
    assert parse_mix("math=0.45, mcq=0.35") == {"math": 0.45, "mcq": 0.35}
    with pytest.raises(TrainingError, match="unknown --mix families"):
        parse_mix("poetry=0.5")
    with pytest.raises(TrainingError, match="NAME=WEIGHT"):
        parse_mix("math=lots")
    with pytest.raises(TrainingError, match="NAME=WEIGHT"):
        parse_mix("math")
    with pytest.raises(TrainingError, match=">= 0"):
        parse_mix("math=-0.1")


def test_mcq_kind_weights_steer_the_generated_kinds() -> None:
    weights = parse_mcq_kinds("largest=3, smallest=1")
    assert weights == {"largest": 3.0, "smallest": 1.0}
    steered = generated_examples("mcq", 400, seed=4, exclude=set(), mcq_kind_weights=weights)
    kinds = Counter(e.knobs["kind"] for e in steered)
    assert set(kinds) == {"largest", "smallest"}
    assert 2.3 < kinds["largest"] / kinds["smallest"] < 4.0
    uniform = generated_examples("mcq", 60, seed=4, exclude=set())
    assert len({e.knobs["kind"] for e in uniform}) == 6
    with pytest.raises(TrainingError, match="unknown mcq kinds"):
        parse_mcq_kinds("biggest=1")
    with pytest.raises(TrainingError, match="positive sum"):
        parse_mcq_kinds("largest=0")


def test_math_op_weights_drill_one_operation_and_leave_the_default_draws_alone() -> None:
    weights = parse_math_ops("add=1, sub=1, mul=6, div=0")
    assert weights == {"add": 1.0, "sub": 1.0, "mul": 6.0, "div": 0.0}
    drilled = generated_examples("math", 300, seed=4, exclude=set(), math_op_weights=weights)
    ops = Counter(op for e in drilled for op in re.findall(r"\d ([-+*/]) \d", e.response))
    assert ops["/"] == 0 and ops["*"] > 2.5 * (ops["+"] + ops["-"])
    # unweighted, the generator draws exactly as before the knob existed (trained stages and the
    # eval split keep their problems), and as an explicit None does
    default = generated_examples("math", 50, seed=4, exclude=set())
    assert default == generated_examples("math", 50, seed=4, exclude=set(), math_op_weights=None)
    default_ops = Counter(op for e in default for op in re.findall(r"\d ([-+*/]) \d", e.response))
    assert default_ops["+"] + default_ops["-"] > default_ops["*"]
    with pytest.raises(TrainingError, match="unknown math operations"):
        parse_math_ops("pow=1")
    with pytest.raises(TrainingError, match="positive sum"):
        parse_math_ops("mul=0")


def test_token_budget_batches_respect_the_budget_and_cover_everything() -> None:
    rng = random.Random(0)
    examples = [
        TrainingExample("q" * rng.randint(1, 200), "a" * rng.randint(1, 100), "chat", "x")
        for _ in range(300)
    ]
    enc, _ = encode_examples(examples, block_size=BS)
    batches = token_budget_batches(enc, 2000, seed=0)
    assert sorted(i for b in batches for i in b) == list(range(len(enc)))
    assert all(len(b) * max(enc[i].n_tokens for i in b) <= 2000 for b in batches)
    assert (
        batches
        == token_budget_batches(enc, 2000, seed=0)
        != token_budget_batches(enc, 2000, seed=1)
    )


def test_lr_schedule_warms_up_then_decays_to_the_floor() -> None:
    f = [lr_factor(s, 10, 100, 0.05) for s in range(101)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(f[9:], f[10:])) and f[100] == pytest.approx(0.05)


def test_save_load_round_trip_gives_identical_logits(tmp_path) -> None:
    model = tiny_model(2)
    out = save_pretrained(model, tmp_path / "ckpt", card="# test\n")
    loaded = from_pretrained(out)
    x = torch.randint(8, 200, (1, 12))
    pos = torch.arange(12)[None]
    with torch.no_grad():
        torch.testing.assert_close(
            model(x, pos).logits, loaded.model(x, pos).logits, atol=0, rtol=0
        )
    assert loaded.revision and (out / "README.md").read_text() == "# test\n"
    with pytest.raises(ModelError, match="not a tiny-bd checkpoint"):
        from_pretrained(tmp_path / "nowhere")


def test_collate_refuses_unpadded_responses() -> None:
    with pytest.raises(TrainingError, match="multiple of block_size"):
        collate([[10, 11]], [[12, 13, 14]], BS)


@pytest.mark.skipif(
    not (WEIGHTS_DIR / "model.safetensors").exists(), reason="shipped weights not trained yet"
)
def test_shipped_weights_answer_an_easy_prompt_confidently_and_a_hard_one_slowly() -> None:
    tb = from_pretrained("tiny-bd")
    assert (WEIGHTS_DIR / "README.md").exists() and (WEIGHTS_DIR / "training.json").exists()
    rng = random.Random(3)
    easy = make_mcq(rng, kind="largest", n_options=4, digits=2)
    hard = make_math(rng, digits=5, ops=3)
    runs = {}
    for name, rec in (("easy", easy), ("hard", hard)):
        ids = tb.tokenizer.encode(render_prompt(rec.prompt)).ids
        runs[name] = generate(tb.model, ids, threshold=0.95)
    g = runs["easy"]
    out = tb.tokenizer.decode(g.tokens[: g.output_tokens])
    # the multiple-choice answer format, EOS in the first block, 32 positions in a handful of rounds
    assert re.fullmatch(r"The answer is \([A-D]\)\.", out), out
    assert g.finished_eos and len(g.rounds_per_block) == 1 and g.total_rounds <= 6
    # a five-digit, three-step word problem keeps the model unsure for many more rounds per block
    h = runs["hard"]
    assert h.total_rounds / len(h.rounds_per_block) > 2 * g.total_rounds


def test_training_learns_to_read_the_prompt_not_only_the_format() -> None:
    """The real Lightning loop, with the default padding weight and learning rate, must learn
    content: 'Say: x' -> 'x' over ten letters (chance ~2 of 20), 32-token blocks.

    Any run learns the format (one letter, then 31 EOS) in a few steps. Reading the prompt is
    what the stage-1/2 settings never learned: at full padding weight this toy reads back 0 of 20
    prompts (lr 6e-4) or 2 (lr 3e-3), and at lr 3e-3 with down-weighted padding 12 -- as the
    shipped stage-1/2 weights answered math and mcq at chance (``toys read-prompt`` prints the
    grid). So this guards the defaults.
    """
    from dwise_predict.zoo.tiny_bd.recipe.toys import read_prompt
    from dwise_predict.zoo.tiny_bd.recipe.train import TrainConfig

    assert read_prompt(TrainConfig.pad_weight, TrainConfig.lr, steps=300) >= 18


@pytest.mark.skipif(
    not (WEIGHTS_DIR / "model.safetensors").exists(), reason="shipped weights not trained yet"
)
def test_probe_reports_letter_accuracy_per_kind_and_easy_math_on_eval_requests() -> None:
    from dwise_predict.zoo.tiny_bd.recipe.probe import probe

    out = probe("tiny-bd", n_mcq=36, n_math=3)
    assert out["mcq_n"] == 36 and out["easy_math_n"] == 3
    kinds = out["mcq_letter_accuracy_by_kind"]
    assert len(kinds) >= 3 and all(0.0 <= v <= 1.0 for v in kinds.values())
    assert 0.2 <= out["mcq_chance"] <= 0.25  # 4 or 5 options
    assert 0.0 <= out["mcq_letter_accuracy"] <= 1.0 and 0.0 <= out["easy_math_exact_match"] <= 1.0
    # asked for nothing (--mcq 0 --math 0, as when only --math-chain is wanted): no figure, not 0.0
    none = probe("tiny-bd", n_mcq=0, n_math=0)
    assert none["mcq_letter_accuracy"] is None and none["easy_math_exact_match"] is None
    assert none["mcq_chance"] is None and none["mcq_n"] == 0 and none["easy_math_n"] == 0


def test_ensemble_of_one_checkpoint_with_itself_scores_as_the_checkpoint_does() -> None:
    from dwise_predict.zoo.tiny_bd.recipe.probe import ensemble_letters, probe

    from dwise_predict.errors import ConfigError

    out = ensemble_letters(["tiny-bd", "tiny-bd"], n_mcq=24)
    assert out["mcq_n"] == 24
    # averaging a distribution with itself changes nothing, and batching does not either
    assert out["right"]["tiny-bd"] == out["ensemble_right"]
    assert out["ensemble_gain_over_best"] == 0
    single = probe("tiny-bd", n_mcq=24, n_math=0)["mcq_letter_accuracy"]
    assert out["right"]["tiny-bd"] == round(24 * single)
    with pytest.raises(ConfigError, match="at least two"):
        ensemble_letters(["tiny-bd"])
    with pytest.raises(ConfigError, match="no questions"):
        ensemble_letters(["tiny-bd", "tiny-bd"], n_mcq=0)


def test_free_text_probe_counts_tokens_per_round_as_the_report_does() -> None:
    from dwise_predict.zoo.tiny_bd.recipe.probe import free_text

    out = free_text("tiny-bd", n_per_category=3, categories=("chat",))
    chat = out["chat"]
    assert chat["requests"] == 3 and 0.0 <= chat["budget_hit_share"] <= 1.0
    # every committed position counts (EOS padding included): at least one token a round
    assert chat["median_tokens_per_round"] >= 1.0 and chat["rounds_per_block_p90_over_p10"] >= 1.0
    assert "instruction" not in out


def test_validate_scores_checkpoints_on_requests_outside_the_reports_set(tmp_path: Path) -> None:
    """Choosing a checkpoint must not read the requests the report then measures it on."""
    from dwise_predict.tracing.workload import build_workload
    from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig
    from dwise_predict.zoo.tiny_bd.recipe.probe import compare_validations, validate
    from dwise_predict.zoo.tiny_bd.recipe.report import REPORT_REQUESTS

    from dwise_predict.errors import ConfigError
    from dwise_predict.traces import read_traces

    out = validate("tiny-bd", tmp_path / "val", n_scored=24, n_free_text=10, threads=1)
    dc = DataConfig()
    ev = build_workload(dc.workload_train_size, dc.workload_eval_size, dc.workload_seed).eval
    reported = {r.id for r in ev[:REPORT_REQUESTS]}
    traced = read_traces(tmp_path / "val", columns=["request_id", "category"]).to_pylist()
    assert traced and not reported & {t["request_id"] for t in traced}
    val = ev[REPORT_REQUESTS:]
    for cat in ("mcq", "math"):
        n = sum(r.category == cat for r in val[:24])
        assert out["accuracy"][cat]["requests"] == n > 0
        assert 0.0 <= out["accuracy"][cat]["exact_match"] <= 1.0
    chat = out["chat"]
    assert chat["requests"] == sum(r.category == "chat" for r in val[:10]) > 0
    assert chat["median_tokens_per_round"] >= 1.0 and chat["rounds_per_block_p90_over_p10"] >= 1.0
    # a rerun reuses the traces and scores the same
    assert validate("tiny-bd", tmp_path / "val", n_scored=24, n_free_text=10) == out
    with pytest.raises(ConfigError, match="no validation requests"):
        validate("tiny-bd", tmp_path / "none", n_scored=0, n_free_text=0)
    same = compare_validations(tmp_path / "val", tmp_path / "val")
    assert same["mcq"]["requests"] == out["accuracy"]["mcq"]["requests"]
    assert same["mcq"]["only_a_right"] == same["mcq"]["only_b_right"] == 0
    assert same["math"]["mcnemar_p"] == 1.0


def test_mcnemar_p_is_the_exact_two_sided_binomial_test() -> None:
    from dwise_predict.zoo.tiny_bd.recipe.probe import mcnemar_p

    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(3, 3) == 1.0
    assert mcnemar_p(10, 0) == pytest.approx(2 / 2**10)
    assert mcnemar_p(1, 4) == mcnemar_p(4, 1) == pytest.approx(2 * (1 + 5) / 32)
    assert mcnemar_p(65, 55) == pytest.approx(0.4114, abs=1e-4)  # stage 5 vs 10, docs


def test_model_card_lists_every_stage_of_a_continued_checkpoint() -> None:
    """A checkpoint continued twice nests its history two deep in training.json; the card must
    show all three commands in order, with the settings that moved since (lr, padding weight)."""
    from dwise_predict.zoo.tiny_bd.card import model_card, training_stages

    def stage(cmd: str, steps: int, lr: float, prev: dict | None, **extra: float) -> dict:
        return {
            "command": cmd,
            "train_config": {"lr": lr, **extra},
            "previous_stage": prev,
            "result": {"steps": steps, "seconds": 1.0, "final_loss": 0.5, "stopped_by_time": False},
        }

    s1 = stage("train --seed 0", 900, 3e-3, None)
    s2 = stage("train --seed 1 --init-from s1", 2000, 2e-3, s1)
    s3 = stage("train --seed 4 --init-from s2", 11000, 6e-4, s2, pad_weight=0.1)
    assert [s["result"]["steps"] for s in training_stages(s3)] == [900, 2000, 11000]
    card = model_card(TinyBDConfig(), s3)
    assert (
        card.index("train --seed 0") < card.index("train --seed 1") < card.index("train --seed 4")
    )
    assert "- stage 1: steps: 900" in card and "peak lr 0.003, EOS-padding loss weight 1.0" in card
    assert (
        "- stage 3: steps: 11000" in card and "peak lr 0.0006, EOS-padding loss weight 0.1" in card
    )
    assert "stage 2" not in model_card(TinyBDConfig(), s1)  # a single stage is not numbered
    # a run stopped by hand and shipped from its snapshot says so instead of a final loss
    s2["stopped"] = "by hand after its 60-minute snapshot"
    s2["result"] = {"steps": 2488, "seconds": 3600}
    line = next(x for x in model_card(TinyBDConfig(), s3).splitlines() if "stage 2:" in x)
    assert "stopped by hand after its 60-minute snapshot" in line and "final loss" not in line
    assert "peak lr 0.002" in line


def test_model_card_shows_recorded_commands_as_they_run_today() -> None:
    """Commands recorded before the recipe left the package are shown with its module path,
    and a removed candidate checkpoint a command names is pointed to in git history."""
    from dwise_predict.zoo.tiny_bd.card import model_card, recipe_command

    assert recipe_command("python -m dwise_predict.zoo.tiny_bd.train --out x") == (
        "python -m dwise_predict.zoo.tiny_bd.recipe.train --out x"
    )
    today = "python -m dwise_predict.zoo.tiny_bd.recipe.grow a --d-ff 768"
    assert recipe_command(today) == today
    old = {
        "command": "python -m dwise_predict.zoo.tiny_bd.train --teacher zoo/tiny_bd/candidates/s28",
        "train_config": {"lr": 1e-4},
        "result": {"steps": 1, "seconds": 1.0, "final_loss": 0.5, "stopped_by_time": False},
    }
    card = model_card(TinyBDConfig(), old)
    assert "tiny_bd.recipe.train --teacher" in card and "git history" in card


def test_report_rewrites_the_shipped_cards_measured_section_in_place(tmp_path) -> None:
    """The report, rerun on its recorded figures, must reproduce the shipped card byte for byte:
    one measured section, replaced rather than appended, under the heading card.py owns."""
    import json
    import shutil

    from dwise_predict.zoo.tiny_bd.card import MEASURED_HEADING
    from dwise_predict.zoo.tiny_bd.recipe.report import _update_card

    shutil.copy(WEIGHTS_DIR / "README.md", tmp_path / "README.md")
    recorded = json.loads((Path(__file__).parents[1] / "docs" / "reference-model.json").read_text())
    _update_card(tmp_path, recorded)
    card = (tmp_path / "README.md").read_text()
    assert card.count(MEASURED_HEADING) == 1
    assert card == (WEIGHTS_DIR / "README.md").read_text()


def test_math_skills_score_each_step_of_a_worked_answer():
    from dwise_predict.tracing.workload.generators import make_math
    from dwise_predict.zoo.tiny_bd.recipe.probe import MATH_SKILLS, score_math_steps

    rec = make_math(random.Random(3), digits=1, ops=2)
    ref = rec.reference
    assert score_math_steps(ref, ref) == dict.fromkeys(MATH_SKILLS, True)
    assert score_math_steps("8 + 9 = 17. The answer is 17.", "no numbers here") is None
    # a copy error in the second operand, arithmetic right on what was copied, answer copied
    wrong = score_math_steps("8 + 9 = 17. The answer is 17.", "8 + 5 = 13. The answer is 13.")
    assert wrong == {
        "first_operand": True,
        "operator": True,
        "second_operand": False,
        "own_arithmetic": True,
        "step_count": True,
        "answer_copies_last_step": True,
    }
    # everything copied, the sum wrong, the answer not the step's result, one step too many
    sloppy = score_math_steps(
        "8 + 9 = 17. The answer is 17.", "8 + 9 = 16. 16 - 1 = 15. The answer is 10."
    )
    assert {k for k, ok in sloppy.items() if not ok} == {
        "own_arithmetic",
        "step_count",
        "answer_copies_last_step",
    }


def test_math_skills_run_on_the_shipped_model_over_the_reports_problems():
    from dwise_predict.zoo.tiny_bd.recipe.probe import MATH_SKILLS, math_skills

    out = math_skills("tiny-bd", n_requests=40)
    assert out["problems"] >= 3 and out["max_digits"] == 2
    assert set(out["share_right"]) == set(MATH_SKILLS)
    assert all(0.0 <= v <= 1.0 for v in out["share_right"].values())
    assert out["no_parseable_step"] <= out["problems"]


def test_math_chain_separates_facts_from_steps_that_do_not_chain():
    from dwise_predict.zoo.tiny_bd.recipe.probe import MATH_CHAIN, score_math_chain

    ref = "5 + 3 = 8. 8 + 6 = 14. The answer is 14."
    assert score_math_chain(ref, ref, 14) == dict.fromkeys(MATH_CHAIN, True)
    # what tiny-bd decodes when it commits a result digit before the operand it depends on:
    # the steps neither compute nor chain, and the answer copies the last one
    out = "5 + 4 = 12. 11 + 6 = 10. The answer is 10."
    assert score_math_chain(ref, out, 14) == dict.fromkeys(MATH_CHAIN, False)
    # every step right on what it copied and chained: only the copy of an operand is wrong
    copied = score_math_chain(ref, "5 + 4 = 9. 9 + 6 = 15. The answer is 15.", 14)
    assert copied == {
        "exact": False,
        "first_step": False,
        "own_arithmetic_every_step": True,
        "steps_chained": True,
    }
    assert score_math_chain(ref, "no steps", 14) == dict.fromkeys(MATH_CHAIN, False)


def test_math_chain_runs_on_the_shipped_model():
    from dwise_predict.zoo.tiny_bd.recipe.probe import MATH_CHAIN, math_chain

    out = math_chain("tiny-bd", per_ops=4)
    again = math_chain("tiny-bd", per_ops=4)
    assert out == again  # fresh problems, but drawn from a fixed seed
    assert set(out["share_right_by_ops"]) == {"1", "2", "3"}
    for shares in out["share_right_by_ops"].values():
        assert set(shares) == set(MATH_CHAIN)
        assert all(0.0 <= v <= 1.0 for v in shares.values())
    # a one-step answer is chained by definition; the shipped model gets most one-digit facts
    assert out["share_right_by_ops"]["1"]["steps_chained"] == 1.0
    assert out["share_right_by_ops"]["1"]["exact"] >= 0.5
    # the step breakdown: counts are consistent, and the shipped model gets most of the steps of
    # one-operation problems (one-digit facts) right on their own operands
    steps = out["step_arithmetic_by_ops"]
    assert set(steps) == {"1", "2", "3"}
    one_op = list(steps["1"].values())
    assert sum(c["steps"] for c in one_op) >= 4
    assert all(0 <= c["right"] <= c["steps"] for s in steps.values() for c in s.values())
    assert sum(c["right"] for c in one_op) >= 0.5 * sum(c["steps"] for c in one_op)


def test_step_kind_names_operand_digits_and_operator():
    from dwise_predict.zoo.tiny_bd.recipe.probe import _STEP, step_kind

    steps = _STEP.findall("8 + 6 = 14. 14 - 5 = 9. 9 * 7 = 63. 63 / 9 = 7.")
    assert [step_kind(s) for s in steps] == ["1-digit +", "2-digit -", "1-digit *", "2-digit /"]


# ---------------------------------------------------------------- free text and long contexts


def _pools() -> ContentPools:
    sentences = tuple(f"Sentence number {i} talks about topic {i % 7}." for i in range(200))
    lines = tuple(f"value_{i} = compute({i})" for i in range(40))
    return ContentPools(sentences, lines)


def test_free_text_responses_mix_scaffolding_and_content_and_fit_the_budget() -> None:
    prompts = [
        ("How do I bake bread at home?", "chat"),
        ("Write a haiku about rain, all lowercase.", "instruction"),
        ("Complete the following Python function:\n\ndef add_two(a, b):\n    pass", "code"),
    ]
    ex = free_text_examples(prompts, 600, seed=3, pools=_pools(), max_chars=230)
    assert len(ex) == 600 and all(len(e.response) <= 230 for e in ex)
    share = {c: sum(e.category == c for e in ex) / len(ex) for c in ("chat", "instruction", "code")}
    assert share["chat"] > share["instruction"] > share["code"] > 0.08
    for e in ex:
        opening, closing = OPENINGS[e.category], CLOSINGS[e.category]
        assert e.response.startswith(opening) and e.response.endswith(closing)
        if e.category == "code":
            assert "def add_two(a, b):" in e.response  # the signature is copied
        else:
            content = [s for s in _pools().sentences if s in e.response]
            assert 1 <= len(content) <= 3
    echoes = [e for e in ex if e.category == "chat" and 'You asked: "How do I' in e.response]
    assert len(echoes) > 50  # the prompt's first words, copied
    assert len({e.response for e in ex}) > 500  # distinct responses, not a few repeated
    again = free_text_examples(prompts, 600, seed=3, pools=_pools(), max_chars=230)
    assert [e.response for e in again] == [e.response for e in ex]
    with pytest.raises(TrainingError, match="no free-text prompts"):
        free_text_examples([], 5, seed=0, pools=_pools())


def test_by_ending_style_lets_the_prompts_last_character_pick_the_share_of_fixed_text() -> None:
    prompts = [
        ("How do I bake bread at home?", "chat"),
        ("Tell me about bread.", "chat"),
        ("bread recipe ideas", "chat"),
        ("Write a haiku about rain, all lowercase.", "instruction"),
        ("Can you write a haiku about rain?", "instruction"),
        ("haiku: rain", "instruction"),
    ]
    ex = free_text_examples(prompts, 900, seed=5, pools=_pools(), style="by_ending")
    assert len(ex) == 900 and all(len(e.response) <= 230 for e in ex)
    shapes: dict[tuple[str, str], set[str]] = {}
    for e in ex:
        content = [s for s in _pools().sentences if s in e.response]
        if e.response in CLARIFY[e.category]:
            shape = "fixed"
            assert not content
        elif e.response.startswith(BRIEF_OPENINGS[e.category]):
            shape = "brief"
            assert len(content) == 1 and e.response.endswith(BRIEF_CLOSINGS[e.category])
        else:
            shape = "list"
            assert e.response.startswith(OPENINGS[e.category]) and 1 <= len(content) <= 3
        shapes.setdefault((e.category, e.prompt), set()).add(shape)
    # one shape per prompt, and the ending decides it
    assert shapes == {
        ("chat", "How do I bake bread at home?"): {"brief"},
        ("chat", "Tell me about bread."): {"list"},
        ("chat", "bread recipe ideas"): {"fixed"},
        ("instruction", "Write a haiku about rain, all lowercase."): {"brief"},
        ("instruction", "Can you write a haiku about rain?"): {"list"},
        ("instruction", "haiku: rain"): {"fixed"},
    }
    with pytest.raises(TrainingError, match="unknown free-text style 'short'"):
        free_text_examples(prompts, 5, seed=0, pools=_pools(), style="short")


def test_free_text_sources_skip_eval_prompts_and_their_conversations() -> None:
    from dwise_predict.tracing.workload.sources import load_humaneval

    he = load_humaneval()
    eval_prompts = {"secret eval question", he[0].prompt}
    convs = {
        "a": {
            "conversations": [
                {"from": "human", "value": "a training question"},
                {"from": "gpt", "value": "A training reply sentence goes here. Another one!"},
            ]
        },
        "b": {
            "conversations": [
                {"from": "human", "value": "secret eval question"},
                {"from": "gpt", "value": "An eval reply that must stay out of training."},
                {"from": "human", "value": "a follow-up in the eval conversation"},
                {"from": "gpt", "value": "Also kept out of training, every word of it."},
            ]
        },
    }
    prompts, pools = free_text_sources(convs, eval_prompts)
    texts = {p for p, _ in prompts}
    assert ("a training question", "chat") in prompts
    assert not texts & eval_prompts and "a follow-up in the eval conversation" not in texts
    assert "A training reply sentence goes here." in pools.sentences
    assert not any("eval" in s.lower() for s in pools.sentences)
    assert sum(c == "code" for _, c in prompts) == len(he) - 1
    assert {c for _, c in prompts} == {"chat", "instruction", "code"}


def test_long_context_share_draws_eval_length_haystacks_that_are_kept() -> None:
    long = generated_examples(
        "long_context", 6, seed=2, exclude=set(), long_share=1.0, long_chars=(4000, 6000)
    )
    assert all(4000 <= len(e.prompt) <= 6300 for e in long)
    short = generated_examples("long_context", 6, seed=2, exclude=set())
    assert all(len(e.prompt) <= 1300 for e in short)
    splits = SimpleNamespace(train=[], eval=[])
    cfg = DataConfig(
        n_generated=20,
        real_repeats=0,
        mix={"long_context": 1.0},
        long_context_long_share=0.5,
        long_context_long_chars=(4000, 6000),
    )
    ts = build_training_set(cfg, seed=1, splits=splits, conversations={})
    lengths = sorted(e.n_tokens for e in ts.examples)
    assert ts.counts["long_context"] == 20 and ts.dropped_too_long == 0
    assert lengths[-1] > 4000 > cfg.max_len  # kept under long_max_len, not max_len
    with pytest.raises(TrainingError, match="unknown task families"):
        build_training_set(
            DataConfig(n_generated=5, mix={"poetry": 1.0}), splits=splits, conversations={}
        )


def test_free_text_category_weights_are_settable_and_checked() -> None:
    prompts = [
        ("How do I bake bread at home?", "chat"),
        ("Write a haiku about rain, all lowercase.", "instruction"),
        ("Complete the following Python function:\n\ndef add_two(a, b):\n    pass", "code"),
    ]
    weights = parse_free_text_categories("chat=0.2, instruction=0.8")
    assert weights == {"chat": 0.2, "instruction": 0.8}
    ex = free_text_examples(prompts, 500, seed=3, pools=_pools(), category_weights=weights)
    share = {c: sum(e.category == c for e in ex) / len(ex) for c in ("chat", "instruction", "code")}
    assert share["code"] == 0 and 0.72 < share["instruction"] < 0.88
    # the default is the module's weights, so earlier stages' data reproduces
    default = free_text_examples(prompts, 50, seed=3, pools=_pools())
    explicit = free_text_examples(
        prompts, 50, seed=3, pools=_pools(), category_weights=dict(CATEGORY_WEIGHTS)
    )
    assert [e.response for e in default] == [e.response for e in explicit]
    with pytest.raises(TrainingError, match="unknown free-text categories"):
        parse_free_text_categories("chat=0.5,poetry=0.5")
    with pytest.raises(TrainingError, match="NAME=WEIGHT"):
        parse_free_text_categories("chat")
    with pytest.raises(TrainingError, match="positive sum"):
        parse_free_text_categories("chat=0,instruction=0")
    with pytest.raises(TrainingError, match="no free-text prompts in the weighted"):
        free_text_examples(prompts[:1], 5, seed=0, pools=_pools(), category_weights={"code": 1})


def test_structured_code_and_math_are_fixed_text_around_the_uncertain_part() -> None:
    # math: the workload's reference as written (steps, answer), then one fixed closing;
    # every response fits the output budget
    rng = random.Random(4)
    for _ in range(300):
        rec = make_math(rng)
        text = structured_math_response(rec.reference)
        assert text == f"{rec.reference}\n{STRUCTURED_MATH_CLOSING}"
        assert len(text) < 255  # with its EOS, inside the 256-token budget
    with pytest.raises(TrainingError, match="not a math reference"):
        structured_math_response("(B)")
    # code: the body of the function over its first argument, one real code line of content
    prompts = [('def add_two(values: list, b):\n    """Add."""\n', "code")]
    ex = free_text_examples(
        prompts, 200, seed=2, pools=_pools(), category_weights={"code": 1}, structured_code=True
    )
    for e in ex:
        assert e.response.startswith(STRUCTURED_CODE_OPENING)
        assert e.response.endswith(STRUCTURED_CODE_CLOSING)
        assert "    for item in values:\n" in e.response and len(e.response) <= 230
        assert sum(line in e.response for line in _pools().code_lines) >= 1
    assert len({e.response for e in ex}) > 5  # the content line varies
    # a training set with both structured: no real code reply, every math example framed
    splits = SimpleNamespace(train=[], eval=[])
    cfg = DataConfig(n_generated=30, real_repeats=0, mix={"math": 1.0}, structured=("math",))
    ts = build_training_set(cfg, seed=1, splits=splits, conversations={})
    tok = build_tokenizer()
    closing = tok.encode("\n" + STRUCTURED_MATH_CLOSING, add_special_tokens=False).ids
    assert ts.counts == {"math": 30}
    for e in ts.examples:
        ids = [i for i in e.response_ids if i != EOS]
        assert ids[-len(closing) :] == closing
    with pytest.raises(TrainingError, match="unknown structured categories"):
        build_training_set(
            DataConfig(n_generated=5, structured=("chat",)), splits=splits, conversations={}
        )


def test_report_plots_the_loss_curves_in_training_order() -> None:
    from dwise_predict.zoo.tiny_bd.recipe.report import _stage_order

    names = ["train_log_stage10.csv", "train_log_stage2.csv", "train_log_stage1.csv"]
    ordered = sorted((Path(n) for n in names), key=_stage_order)
    assert [p.name for p in ordered] == [
        "train_log_stage1.csv",
        "train_log_stage2.csv",
        "train_log_stage10.csv",
    ]


def test_loss_plot_draws_every_stage_log_and_skips_a_folder_without_one(tmp_path: Path) -> None:
    """Twenty stages do not fit a legend; the plot numbers each span instead. A checkpoint folder
    without logs (a grown or merged checkpoint) gets no plot rather than an empty one."""
    from dwise_predict.zoo.tiny_bd.recipe.report import plot_training_loss

    weights, img = tmp_path / "w", tmp_path / "img"
    weights.mkdir()
    assert plot_training_loss(weights, img) is None and not img.exists()
    for stage in (1, 2, 19):
        rows = "\n".join(f"{10 * i},{i}.0,{2.0 / (i + 1):.4f},0.001" for i in range(1, 30))
        (weights / f"train_log_stage{stage}.csv").write_text("step,seconds,loss,lr\n" + rows)
    assert plot_training_loss(weights, img) == "tiny-bd-train-loss.png"
    assert (img / "tiny-bd-train-loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_writes_the_weighted_mean_of_one_chains_checkpoints(tmp_path: Path) -> None:
    """A merge is a checkpoint like any other: the weighted mean of its inputs' weights, a
    training.json that keeps the heaviest input's history, and a card that names the merge."""
    import json

    from dwise_predict.zoo.tiny_bd.io import from_pretrained, save_pretrained
    from dwise_predict.zoo.tiny_bd.recipe.merge import MergeInput, merge_checkpoints, parse_input

    from dwise_predict.errors import TrainingError

    a, b = (
        save_pretrained(tiny_model(0), tmp_path / "a"),
        save_pretrained(tiny_model(1), tmp_path / "b"),
    )
    (b / "training.json").write_text(
        json.dumps({"command": "train --seed 1", "result": {"steps": 9}})
    )
    out = merge_checkpoints([parse_input(f"{a}=1"), parse_input(f"{b}=3")], tmp_path / "m", "merge")
    sa, sb = tiny_model(0).state_dict(), tiny_model(1).state_dict()
    merged = from_pretrained(out).model.state_dict()
    for k, v in merged.items():
        torch.testing.assert_close(v, 0.25 * sa[k] + 0.75 * sb[k])
    training = json.loads((out / "training.json").read_text())
    assert [m["weight"] for m in training["merge"]] == [0.25, 0.75]
    assert training["previous_stage"]["command"] == "train --seed 1"  # b weighs most
    card = (out / "README.md").read_text()
    assert "train --seed 1" in card and "weighted average of the weights" in card

    other = TinyBDModel(TinyBDConfig(d_model=16, n_layers=1, n_heads=2, d_ff=16, block_size=BS))
    c = save_pretrained(other, tmp_path / "c")
    with pytest.raises(TrainingError, match="another architecture"):
        merge_checkpoints([MergeInput(a, 1.0), MergeInput(c, 1.0)], tmp_path / "x")
    with pytest.raises(TrainingError, match="not all zero"):
        merge_checkpoints([MergeInput(a, 0.0), MergeInput(b, 0.0)], tmp_path / "x")
    with pytest.raises(TrainingError, match="must be a number"):
        parse_input(f"{a}=half")
    with pytest.raises(TrainingError, match="at least two"):
        merge_checkpoints([MergeInput(a, 1.0)], tmp_path / "x")
    assert not (tmp_path / "x").exists()  # a refused merge writes nothing


def test_grow_widens_the_mlp_without_changing_what_the_model_computes(tmp_path: Path) -> None:
    """A grown checkpoint has the wider shape, the same logits, new units that receive gradient,
    a history that names the growth, and refuses to shrink."""
    import json

    from dwise_predict.zoo.tiny_bd.io import from_pretrained, save_pretrained
    from dwise_predict.zoo.tiny_bd.recipe.grow import grow_checkpoint

    cfg = tiny_model(0).config
    src = save_pretrained(tiny_model(0), tmp_path / "src")
    (src / "training.json").write_text(json.dumps({"command": "train --seed 0", "result": {}}))
    out, change = grow_checkpoint(src, tmp_path / "grown", d_ff=2 * cfg.d_ff, seed=3)
    grown = from_pretrained(out).model
    assert grown.config.d_ff == 2 * cfg.d_ff and change == 0.0
    ids = torch.randint(3, cfg.vocab_size, (3, 3 * BS))
    pos = torch.arange(3 * BS).expand_as(ids)
    with torch.no_grad():
        torch.testing.assert_close(grown(ids, pos).logits, tiny_model(0)(ids, pos).logits)
    grown.train()
    grown(ids, pos).logits.logsumexp(-1).sum().backward()
    down = grown.layers[0].mlp.down.weight.grad
    assert down is not None and float(down[:, cfg.d_ff :].abs().sum()) > 0  # new units learn
    training = json.loads((out / "training.json").read_text())
    assert training["grow"]["d_ff"] == [cfg.d_ff, 2 * cfg.d_ff]
    assert training["previous_stage"]["command"] == "train --seed 0"
    assert "feed-forward width" in (out / "README.md").read_text()
    with pytest.raises(TrainingError, match="does not grow"):
        grow_checkpoint(src, tmp_path / "small", d_ff=cfg.d_ff)
    assert not (tmp_path / "small").exists()
