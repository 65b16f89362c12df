"""Distilling a skill from earlier tiny-bd checkpoints (zoo/tiny_bd/recipe/distill.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _tiny_bd_helpers import BS, CONFIG, examples, quick_config, training_set
from dwise_predict.zoo.tiny_bd.config import TinyBDConfig
from dwise_predict.zoo.tiny_bd.io import save_pretrained
from dwise_predict.zoo.tiny_bd.model import TinyBDModel
from dwise_predict.zoo.tiny_bd.recipe.data import DataConfig, EncodedExample
from dwise_predict.zoo.tiny_bd.recipe.distill import Teachers, distillation_loss
from dwise_predict.zoo.tiny_bd.recipe.train import (
    BatchListDataset,
    TrainConfig,
    check_distillation,
    diffusion_loss,
    parse_distill_categories,
    train,
)
from dwise_predict.zoo.tiny_bd.recipe.two_stream import NOISY, TwoStreamBatch, collate

from dwise_predict.errors import TrainingError


def tiny_model(seed: int, sharpen: float = 1.0) -> TinyBDModel:
    """A random tiny model; ``sharpen`` scales its logits so it is confident."""
    torch.manual_seed(seed)
    model = TinyBDModel(CONFIG).eval()
    with torch.no_grad():
        model.norm.weight.mul_(sharpen)  # logits = norm(x) @ embed.T (tied)
    return model


def batch_of(enc: list[EncodedExample], seed: int = 0) -> TwoStreamBatch:
    return collate(
        [e.prompt_ids for e in enc],
        [e.response_ids for e in enc],
        BS,
        generator=torch.Generator().manual_seed(seed),
    )


def kl_to(teacher: TinyBDModel, student: TinyBDModel, batch: TwoStreamBatch) -> float:
    """Mean KL(teacher || student) over the masked positions of ``batch``."""
    noisy = batch.targets != -100
    rows = torch.ones(batch.input_ids.shape[0], dtype=torch.bool)
    with torch.no_grad():
        t = Teachers([teacher]).log_probs(batch, rows)[noisy]
        s = student(batch.input_ids, batch.position_ids, batch.attn_mask).logits[noisy]
        return float(distillation_loss(s, t, torch.ones(t.shape[0])))


def test_distillation_loss_is_zero_at_the_teacher_and_weights_positions() -> None:
    logits = torch.randn(5, 11)
    at_teacher = distillation_loss(logits, logits.log_softmax(-1), torch.ones(5))
    assert abs(float(at_teacher)) < 1e-6
    other = torch.randn(5, 11).log_softmax(-1)
    per_position = torch.stack(
        [distillation_loss(logits[i : i + 1], other[i : i + 1], torch.ones(1)) for i in range(5)]
    )
    assert bool((per_position > 0).all())
    w = torch.tensor([1.0, 0.0, 0.1, 1.0, 0.5])
    weighted = distillation_loss(logits, other, w)
    assert torch.isclose(weighted, (per_position * w).sum() / w.sum())
    # T**2 keeps the size comparable across temperatures: same order of magnitude at T = 2
    soft = distillation_loss(logits, other, torch.ones(5), temperature=2.0)
    assert 0.1 < float(soft) / float(per_position.mean()) < 10
    assert float(distillation_loss(logits[:0], other[:0], w[:0])) == 0.0


def test_teachers_average_probabilities_and_stay_frozen() -> None:
    a, b = tiny_model(1, sharpen=4.0), tiny_model(2, sharpen=4.0)
    teachers = Teachers([a, b])
    batch = batch_of(examples(4, seed=0))
    rows = torch.tensor([True, False, True, True])
    got = teachers.log_probs(batch, rows)
    args = (batch.input_ids[rows], batch.position_ids[rows], batch.attn_mask[rows])
    with torch.no_grad():
        mean_p = (a(*args).logits.softmax(-1) + b(*args).logits.softmax(-1)) / 2
    assert got.shape == mean_p.shape
    assert torch.allclose(got.exp(), mean_p, atol=1e-6)
    teachers.train()
    assert not teachers.training and not any(m.training for m in teachers.modules())
    assert not any(p.requires_grad for p in teachers.parameters())


def test_only_the_distilled_rows_add_the_teachers_term() -> None:
    student, teacher = tiny_model(3), tiny_model(4, sharpen=4.0)
    teachers = Teachers([teacher])
    batch = batch_of(examples(4, seed=1))
    c = TrainConfig(distill_weight=2.0)
    with torch.no_grad():
        plain = diffusion_loss(student, batch, c.loss_weighting, c.pad_weight)

        def distilled(t: Teachers) -> torch.Tensor:
            return diffusion_loss(
                student, batch, c.loss_weighting, c.pad_weight, t, c.distill_weight
            )

        batch.distill_rows = torch.zeros(4, dtype=torch.bool)
        assert torch.isclose(distilled(teachers), plain)
        batch.distill_rows = torch.tensor([False, True, False, True])
        with_kd = distilled(teachers)
        to_itself = distilled(Teachers([tiny_model(3)]))
    assert float(with_kd) > float(plain) + 0.01
    assert torch.isclose(to_itself, plain, atol=1e-5)  # the KL to an identical teacher is zero


def test_batches_mark_the_rows_of_the_distilled_categories() -> None:
    enc = examples(6, seed=2)
    ds = BatchListDataset(enc, [[0, 1, 2, 3, 4, 5]], BS, 0.0, seed=0, distill_categories=["math"])
    rows = ds[0].distill_rows
    assert rows is not None
    assert rows.tolist() == [e.category == "math" for e in enc]
    assert BatchListDataset(enc, [[0, 1]], BS, 0.0, seed=0)[0].distill_rows is None


def test_batches_lay_examples_out_in_the_stage_s_block_alignment() -> None:
    """``--block-alignment``: absolute batches start every output block at a multiple of the
    block size, response batches right after the prompt, mixed ones draw each row (seeded)."""
    enc = [e for e in examples(24, seed=4) if len(e.prompt_ids) % BS]
    idx = [list(range(len(enc)))]

    def block_starts(alignment: str, i: int = 0) -> list[int]:
        b = BatchListDataset(enc, idx, BS, 0.0, seed=i, block_alignment=alignment)[0]
        firsts = []
        for row in range(len(enc)):
            noisy = torch.nonzero(b.kind[row] == NOISY).flatten()
            firsts.append(int(b.position_ids[row, noisy[0]]))
        return firsts

    lengths = [len(e.prompt_ids) for e in enc]
    assert block_starts("response") == lengths
    assert block_starts("absolute") == [n - n % BS for n in lengths]
    mixed = block_starts("mixed")
    assert mixed == block_starts("mixed")  # seeded
    assert 0 < sum(m != n for m, n in zip(mixed, lengths)) < len(enc)
    # teachers and anchors judge only the response-aligned rows of a mixed stage
    b = BatchListDataset(
        enc, idx, BS, 0.0, seed=0, anchor_categories=["math", "mcq"], block_alignment="mixed"
    )[0]
    assert b.anchor_rows is not None
    for row, e in enumerate(enc):
        noisy = torch.nonzero(b.kind[row] == NOISY).flatten()
        response_aligned = int(b.position_ids[row, noisy[0]]) == len(e.prompt_ids)
        assert bool(b.anchor_rows[row]) == (e.category in ("math", "mcq") and response_aligned)
    with pytest.raises(TrainingError, match="unknown block alignment 'aligned'"):
        BatchListDataset(enc, idx, BS, 0.0, seed=0, block_alignment="aligned")


def test_a_lightning_run_with_a_teacher_moves_the_student_toward_it(tmp_path: Path) -> None:
    """The real training loop: 40 steps with a confident teacher on the math rows bring the
    student's math distribution much closer to it than the same 40 steps on labels alone."""
    teacher = tiny_model(7, sharpen=6.0)
    save_pretrained(teacher, tmp_path / "teacher")
    ts = training_set(examples(400, seed=3))
    held_out = batch_of([e for e in examples(40, seed=4) if e.category == "math"], seed=9)
    tc = quick_config(max_steps=40, distill_weight=5.0, distill_categories=("math",))
    runs = {}
    for name, teachers in (("labels", ()), ("distilled", (tmp_path / "teacher",))):
        model, _ = train(
            CONFIG,
            tc,
            DataConfig(block_size=BS),
            tmp_path / f"{name}.csv",
            training_set=ts,
            snapshot_dir=None,
            teachers=teachers,
        )
        runs[name] = kl_to(teacher, model, held_out)
    assert runs["distilled"] < 0.5 * runs["labels"], runs


def test_distillation_settings_are_checked_with_the_fix_in_the_message() -> None:
    assert parse_distill_categories("mcq, math") == ("mcq", "math")
    with pytest.raises(TrainingError, match="poetry"):
        parse_distill_categories("mcq,poetry")
    with pytest.raises(TrainingError, match="comma-separated"):
        parse_distill_categories(" , ")
    with pytest.raises(TrainingError, match="--distill-weight"):
        check_distillation(TrainConfig(distill_weight=-1.0))
    with pytest.raises(TrainingError, match="--distill-temperature"):
        check_distillation(TrainConfig(distill_temperature=0.0))
    with pytest.raises(TrainingError, match="at least one teacher"):
        Teachers([])
    other = TinyBDModel(TinyBDConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, block_size=16))
    with pytest.raises(TrainingError, match="vocabulary or block size"):
        Teachers([tiny_model(0), other])
    with pytest.raises(TrainingError, match="--init-from"):
        Teachers([tiny_model(0)]).check_student(other.config)


def test_the_anchor_holds_its_rows_while_the_teachers_pull_theirs() -> None:
    """Each KL term reads only the rows its categories mark: an anchor identical to the student
    adds nothing, another anchor adds its KL on the chat rows only, and categories given to both
    are refused."""
    student, teacher = tiny_model(3), tiny_model(4, sharpen=4.0)
    enc = examples(6, seed=2)
    ds = BatchListDataset(
        enc,
        [[0, 1, 2, 3, 4, 5]],
        BS,
        0.0,
        seed=0,
        distill_categories=["math"],
        anchor_categories=["chat"],
    )
    batch = ds[0]
    assert batch.anchor_rows is not None and batch.distill_rows is not None
    assert batch.anchor_rows.tolist() == [e.category == "chat" for e in enc]
    assert not bool((batch.anchor_rows & batch.distill_rows).any())
    with torch.no_grad():
        only_teacher = diffusion_loss(student, batch, teachers=Teachers([teacher]))
        same_anchor = diffusion_loss(
            student, batch, teachers=Teachers([teacher]), anchor=Teachers([tiny_model(3)])
        )
        other_anchor = diffusion_loss(
            student,
            batch,
            teachers=Teachers([teacher]),
            anchor=Teachers([teacher]),
            anchor_weight=3,
        )
        chat = batch.anchor_rows
        batch.distill_rows = torch.zeros_like(chat)
        batch.anchor_rows = torch.zeros_like(chat)
        plain = diffusion_loss(student, batch)
        batch.anchor_rows = chat
        anchor_alone = diffusion_loss(student, batch, anchor=Teachers([teacher]), anchor_weight=3)
    assert torch.isclose(same_anchor, only_teacher, atol=1e-5)
    assert other_anchor > only_teacher + 0.1
    # the two terms add: (teacher on math) + (anchor on chat) - labels counted once
    torch.testing.assert_close(other_anchor - only_teacher, anchor_alone - plain)
    both = TrainConfig(distill_categories=("mcq", "chat"))
    with pytest.raises(TrainingError, match="one of --distill-categories and --anchor-categories"):
        check_distillation(both, anchored=True, taught=True)
    check_distillation(both, taught=True)  # without an anchor the anchor categories do not matter
    check_distillation(both, anchored=True)  # without a teacher the distilled ones do not
    with pytest.raises(TrainingError, match="--anchor-weight"):
        check_distillation(TrainConfig(anchor_weight=float("nan")))
