"""Train tiny-bd with Lightning: masked block-diffusion loss over a two-stream layout.

    python -m dwise_predict.zoo.tiny_bd.recipe.train --out zoo/tiny_bd/weights --minutes 60 --seed 0

Every output block of every example draws its own mask ratio t ~ U(0, 1] (LLaDA's forward
process, per block as in BD3-LM); the loss is cross-entropy on the masked positions of the
noisy stream (mean over masked tokens; ``--loss-weighting inv_t`` gives LLaDA's 1/t ELBO
weights instead). The two-stream layout (:mod:`.two_stream`) trains all output blocks of a
sequence in one forward with exactly the visibility the decoder has.

The run is time-boxed (``--minutes``) and step-boxed (``--max-steps``, which also sets the
cosine schedule): the same seed and the same number of steps give the same weights
(``seed_everything(seed, workers=True)``, ``Trainer(deterministic=True)``, fp32 on CPU).

``--accelerator gpu --devices N --strategy ddp --precision bf16-mixed`` (and ``--num-nodes``)
run the same training on GPUs or several processes; under N processes each step takes one
token-budget batch per process, so ``--batch-tokens`` is per process. Only global rank 0 writes
the loss log, snapshots and the checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from dwise_predict.trainers.devices import DeviceConfig, add_device_arguments, is_global_zero
from torch import nn
from torch.utils.data import DataLoader, Dataset

from dwise_predict.atomic import write_json
from dwise_predict.errors import TrainingError

from ..config import TinyBDConfig
from ..model import TinyBDModel
from .data import (
    DEFAULT_MIX,
    FAMILIES,
    FREE_TEXT_CATEGORY_WEIGHTS,
    DataConfig,
    EncodedExample,
    TrainingSet,
    build_training_set,
    check_math_op_weights,
    check_mcq_kind_weights,
    check_structured,
    token_budget_batches,
)
from .distill import Teachers, distillation_loss
from .free_text import STYLES, check_category_weights
from .two_stream import TwoStreamBatch, collate

#: the layouts a stage can train in (``mixed``: each example drawn from the other two)
BLOCK_ALIGNMENTS = ("response", "absolute", "mixed")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings (the model shape is a :class:`TinyBDConfig`)."""

    max_steps: int = 900
    minutes: float = 60.0
    lr: float = 6e-4
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    batch_tokens: int = 8_000
    loss_weighting: str = "none"  # or "inv_t"
    #: loss weight of the EOS padding after a response's first EOS (1.0 = plain mean over masked
    #: tokens)
    pad_weight: float = 0.1
    t_min: float = 0.0
    #: the block layout examples are trained in (docs/tracing.md): ``response``, ``absolute``
    #: (how SGLang serves the model) or ``mixed`` (each example drawn from the two, seeded)
    block_alignment: str = "response"
    threads: int = 2
    seed: int = 0
    log_every: int = 10
    #: weight of the distillation term, used only when teachers are given (:mod:`.distill`)
    distill_weight: float = 1.0
    distill_temperature: float = 1.0
    #: example categories distilled from the teachers; the others learn from labels alone
    distill_categories: tuple[str, ...] = ("mcq", "math")
    #: weight of the KL to the anchor checkpoint, used only when an anchor is given
    anchor_weight: float = 1.0
    #: example categories held to the anchor: the free text a stage must not lose
    anchor_categories: tuple[str, ...] = ("chat", "instruction", "code")


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warmup then cosine decay to ``min_ratio`` of the peak at ``total`` steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: nn.Module, c: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (norm gains are left undecayed)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": c.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=c.lr,
        betas=c.betas,
    )


def diffusion_loss(
    model: TinyBDModel,
    batch: TwoStreamBatch,
    weighting: str = "none",
    pad_weight: float = 0.1,
    teachers: Teachers | None = None,
    distill_weight: float = 1.0,
    distill_temperature: float = 1.0,
    anchor: Teachers | None = None,
    anchor_weight: float = 1.0,
) -> torch.Tensor:
    """Cross-entropy on the masked noisy positions (mean, or 1/t-weighted per token).

    ``pad_weight`` < 1 down-weights the EOS padding after a response's first EOS. Why: a short
    answer's last block is mostly padding (a multiple-choice answer is 18 tokens and 14 EOS), and
    padding is trivially predictable; at full weight its gradient drowns the few tokens that must
    be read from the prompt, and the model learns the format but not the content. The weighted
    loss is normalised by the sum of the weights, so it stays a mean.

    With ``teachers``, the rows ``batch.distill_rows`` marks add ``distill_weight`` x the KL from
    the teachers' distribution (:mod:`.distill`). One student forward serves both terms, and the
    teachers run only on those rows, so batches of free text cost no more than without them.
    With an ``anchor``, the rows ``batch.anchor_rows`` marks add ``anchor_weight`` x the KL to
    it the same way: the behaviour the stage must keep (free text) is held to the checkpoint
    that had it while the teachers pull the other categories toward theirs.
    """
    noisy = batch.targets != -100
    if not bool(noisy.any()):
        return torch.zeros((), requires_grad=True)
    logits = model(batch.input_ids, batch.position_ids, batch.attn_mask).logits
    slot_weights = position_weights(batch, pad_weight)  # shared by the label and KL terms
    ce = F.cross_entropy(logits[noisy].float(), batch.targets[noisy], reduction="none")
    if (
        pad_weight == 1.0 or batch.eos_padding is None
    ):  # the plain mean, computed as the shipped stages did
        if weighting == "inv_t":
            loss = (ce / batch.mask_ratio[noisy].clamp_min(1e-3)).sum() / noisy.sum()
        else:
            loss = ce.mean()
    else:
        weight = slot_weights[noisy]
        per_token = ce * weight
        if weighting == "inv_t":
            per_token = per_token / batch.mask_ratio[noisy].clamp_min(1e-3)
        loss = per_token.sum() / weight.sum()
    for frozen, rows, w in (
        (teachers, batch.distill_rows, distill_weight),
        (anchor, batch.anchor_rows, anchor_weight),
    ):
        if frozen is None or rows is None or not bool(rows.any()):
            continue
        sub = noisy[rows]
        if not bool(sub.any()):
            continue
        kd = distillation_loss(
            logits[rows][sub],
            frozen.log_probs(batch, rows)[sub],
            slot_weights[rows][sub],
            distill_temperature,
        )
        loss = loss + w * kd
    return loss


def position_weights(batch: TwoStreamBatch, pad_weight: float) -> torch.Tensor:
    """[B, T] loss weight of every slot: ``pad_weight`` on the EOS padding, 1 elsewhere."""
    ones = torch.ones(batch.targets.shape, device=batch.targets.device)
    if batch.eos_padding is None:
        return ones
    return torch.where(batch.eos_padding, torch.full_like(ones, pad_weight), ones)


class BatchListDataset(Dataset):
    """One item = one pre-bucketed batch of examples; noise is drawn at collate time."""

    def __init__(
        self,
        examples: list[EncodedExample],
        batches: list[list[int]],
        block_size: int,
        t_min: float,
        seed: int,
        distill_categories: Sequence[str] = (),
        anchor_categories: Sequence[str] = (),
        block_alignment: str = "response",
    ) -> None:
        self.examples, self.batches, self.block_size, self.t_min = (
            examples,
            batches,
            block_size,
            t_min,
        )
        self.seed = seed
        if block_alignment not in BLOCK_ALIGNMENTS:
            raise TrainingError(
                f"unknown block alignment {block_alignment!r}; choose one of "
                f"{', '.join(BLOCK_ALIGNMENTS)}"
            )
        self.block_alignment = block_alignment
        self.distill_categories = frozenset(distill_categories)
        self.anchor_categories = frozenset(anchor_categories)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> TwoStreamBatch:
        idx = self.batches[i]
        # noise depends only on (seed, batch index): reproducible whatever the worker layout
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        if self.block_alignment == "mixed":
            absolute = (torch.rand(len(idx), generator=gen) < 0.5).tolist()
        else:
            absolute = [self.block_alignment == "absolute"] * len(idx)
        batch = collate(
            [self.examples[j].prompt_ids for j in idx],
            [self.examples[j].response_ids for j in idx],
            self.block_size,
            generator=gen,
            t_min=self.t_min,
            absolute=absolute,
        )
        # in a mixed stage, teachers and the anchor (checkpoints of the response-aligned
        # layout) only judge the rows laid out as they were trained; absolute rows learn the
        # served layout from the labels
        judged = [not (a and self.block_alignment == "mixed") for a in absolute]
        if self.distill_categories:
            batch.distill_rows = torch.tensor(
                [
                    self.examples[j].category in self.distill_categories and ok
                    for j, ok in zip(idx, judged)
                ]
            )
        if self.anchor_categories:
            batch.anchor_rows = torch.tensor(
                [
                    self.examples[j].category in self.anchor_categories and ok
                    for j, ok in zip(idx, judged)
                ]
            )
        return batch


class TinyBDDataModule(pl.LightningDataModule):
    """The training set, bucketed into token-budget batches, served in a seeded order."""

    def __init__(
        self,
        data_config: DataConfig,
        batch_tokens: int,
        seed: int,
        t_min: float = 0.0,
        training_set: TrainingSet | None = None,
        distill_categories: Sequence[str] = (),
        anchor_categories: Sequence[str] = (),
        block_alignment: str = "response",
    ) -> None:
        super().__init__()
        self.block_alignment = block_alignment
        self.data_config, self.batch_tokens, self.seed, self.t_min = (
            data_config,
            batch_tokens,
            seed,
            t_min,
        )
        self.training_set = training_set
        self.distill_categories = tuple(distill_categories)
        self.anchor_categories = tuple(anchor_categories)

    def setup(self, stage: str | None = None) -> None:
        if self.training_set is None:
            self.training_set = build_training_set(self.data_config, seed=self.seed)
            _release_memory()  # the ShareGPT parse is gigabytes of short-lived objects
        if not self.training_set.examples:
            raise TrainingError(
                "the training set is empty: every example was longer than the budget"
            )
        self.batches = token_budget_batches(
            self.training_set.examples, self.batch_tokens, self.seed
        )

    def loaded(self) -> TrainingSet:
        """The training set ``setup`` built; refused before ``setup`` ran."""
        if self.training_set is None:
            raise TrainingError("the tiny-bd data module is not set up; call setup() first")
        return self.training_set

    def train_dataloader(self) -> DataLoader:
        ds = BatchListDataset(
            self.loaded().examples,
            self.batches,
            self.data_config.block_size,
            self.t_min,
            self.seed,
            self.distill_categories,
            self.anchor_categories,
            self.block_alignment,
        )
        # batches are already shuffled with the seed; epochs repeat the order (noise differs per
        # index only)
        return DataLoader(ds, batch_size=None, shuffle=False, num_workers=0, collate_fn=lambda b: b)


def _release_memory() -> None:
    """Return freed heap to the OS (glibc keeps it otherwise); a no-op elsewhere."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class TinyBDLightning(pl.LightningModule):
    """Masked block-diffusion training of :class:`TinyBDModel`."""

    def __init__(
        self,
        model_config: TinyBDConfig,
        train_config: TrainConfig,
        teachers: Teachers | None = None,
        anchor: Teachers | None = None,
    ) -> None:
        super().__init__()
        self.model = TinyBDModel(model_config)
        self.train_config = train_config
        self.teachers = teachers  # frozen; moved to the device with the module
        self.anchor = anchor

    def training_step(self, batch: TwoStreamBatch, batch_idx: int) -> torch.Tensor:
        c = self.train_config
        loss = diffusion_loss(
            self.model,
            batch,
            c.loss_weighting,
            c.pad_weight,
            self.teachers,
            c.distill_weight,
            c.distill_temperature,
            self.anchor,
            c.anchor_weight,
        )
        n_masked = int((batch.targets != -100).sum())
        self.log("loss", loss.detach(), prog_bar=True, batch_size=n_masked)
        return loss

    def transfer_batch_to_device(
        self, batch: TwoStreamBatch, device: torch.device, dataloader_idx: int
    ) -> TwoStreamBatch:
        moved: dict[str, Any] = {
            k: v.to(device) if v is not None else None for k, v in vars(batch).items()
        }
        return TwoStreamBatch(**moved)

    def configure_optimizers(self) -> Any:
        c = self.train_config
        opt = make_optimizer(self.model, c)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: lr_factor(s, c.warmup_steps, c.max_steps, c.min_lr_ratio)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class TimeBoxAndLog(pl.Callback):
    """Stops at the wall-clock budget and appends (step, seconds, loss, lr) rows to a CSV."""

    def __init__(
        self,
        minutes: float,
        csv_path: Path,
        every: int,
        snapshot_dir: Path | None = None,
        snapshot_minutes: float = 10.0,
    ) -> None:
        self.budget_s, self.csv_path, self.every = minutes * 60.0, csv_path, every
        self.snapshot_dir, self.snapshot_s = snapshot_dir, snapshot_minutes * 60.0
        self.last_snapshot = 0.0
        self.start = time.monotonic()
        self.rows: list[dict[str, Any]] = []
        self.stopped_by_time = False
        self.stop_requested = False  # set by the first Ctrl-C (see ``stop_on_interrupt``)
        self.stopped_by_hand = False
        self.writes = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = time.monotonic()
        self.writes = trainer.is_global_zero  # one process logs and snapshots
        if not self.writes:
            return
        self.csv_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.csv_path, "w", newline="") as f:
            csv.writer(f).writerow(["step", "seconds", "loss", "lr"])

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        elapsed = time.monotonic() - self.start
        loss = float(outputs["loss"]) if isinstance(outputs, dict) else float(outputs)
        if self.writes and (step % self.every == 0 or step == 1):
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            row = {"step": step, "seconds": round(elapsed, 1), "loss": round(loss, 5), "lr": lr}
            self.rows.append(row)
            with open(self.csv_path, "a", newline="") as f:
                csv.writer(f).writerow(row.values())
            print(
                f"step {step} t={elapsed:.0f}s loss={loss:.4f} lr={lr:.2e}",
                file=sys.stderr,
                flush=True,
            )
        due = elapsed - self.last_snapshot >= self.snapshot_s
        if self.writes and self.snapshot_dir is not None and due:
            # a loadable checkpoint mid-run, so decoding can be checked while training goes on
            from ..io import save_pretrained

            self.last_snapshot = elapsed
            save_pretrained(pl_module.model, self.snapshot_dir)  # type: ignore[arg-type]  # Lightning types it as Module
        if elapsed >= self.budget_s:
            self.stopped_by_time = True
            trainer.should_stop = True
        if self.stop_requested:
            self.stopped_by_hand = True
            trainer.should_stop = True


@contextlib.contextmanager
def stop_on_interrupt(cb: TimeBoxAndLog) -> Iterator[None]:
    """The first Ctrl-C ends the run at the end of the step in progress, like the time box, so
    the weights and ``training.json`` are written as for any finished stage; a second Ctrl-C
    aborts without saving. Lightning's own handling exits the process with the weights of a
    half-applied step and nothing written; a long CPU stage stopped early was otherwise only
    as good as its last 10-minute snapshot."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be installed from the main thread
        return
    previous = signal.getsignal(signal.SIGINT)

    def request_stop(signum: int, frame: Any) -> None:
        cb.stop_requested = True
        signal.signal(signal.SIGINT, previous)  # the next Ctrl-C interrupts as usual
        print(
            "\nCtrl-C: stopping after this step and saving (Ctrl-C again to abort unsaved)",
            file=sys.stderr,
            flush=True,
        )

    signal.signal(signal.SIGINT, request_stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class TrainResult:
    """What a run did, for the model card."""

    steps: int
    seconds: float
    final_loss: float
    stopped_by_time: bool
    n_params: int
    counts: dict[str, int]
    loss_curve: list[dict[str, Any]] = field(default_factory=list)
    stopped_by_hand: bool = False


def make_trainer(
    train_config: TrainConfig,
    devices: DeviceConfig | None = None,
    callbacks: list[pl.Callback] | None = None,
) -> pl.Trainer:
    """The Lightning trainer of a run: the step budget and clipping, on ``devices``.

    With the default devices (one CPU process, fp32) this is the trainer every shipped stage
    used, so a rerun reproduces its weights.
    """
    devices = devices or DeviceConfig()
    return pl.Trainer(
        deterministic=True,
        max_steps=train_config.max_steps,
        max_epochs=-1,
        gradient_clip_val=train_config.grad_clip,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks or [],
        **devices.trainer_kwargs(),
    )


def train(
    model_config: TinyBDConfig,
    train_config: TrainConfig,
    data_config: DataConfig,
    log_csv: Path,
    training_set: TrainingSet | None = None,
    snapshot_dir: Path | None = None,
    init_from: Path | None = None,
    devices: DeviceConfig | None = None,
    teachers: Sequence[Path] = (),
    anchor: Path | None = None,
) -> tuple[TinyBDModel, TrainResult]:
    """Train and return the model (eval mode) and a summary.

    ``init_from`` (a checkpoint folder) continues training from its weights -- a second stage
    with a fresh schedule; its shape then replaces ``model_config``. ``devices`` says where
    (default: one CPU process). ``teachers`` (checkpoint folders) are distilled on the
    ``train_config.distill_categories`` examples (:mod:`.distill`); ``anchor`` (a checkpoint
    folder) holds the ``train_config.anchor_categories`` examples to its distribution.
    """
    torch.set_num_threads(train_config.threads)
    pl.seed_everything(train_config.seed, workers=True)
    if init_from is not None:
        from ..io import from_pretrained

        start = from_pretrained(init_from)
        model_config = start.config
    frozen = Teachers.from_checkpoints(teachers) if teachers else None
    held = Teachers.from_checkpoints([anchor]) if anchor is not None else None
    for f in (frozen, held):
        if f is not None:
            f.check_student(model_config)
    module = TinyBDLightning(model_config, train_config, frozen, held)
    if init_from is not None:
        module.model.load_state_dict(start.model.state_dict())
    dm = TinyBDDataModule(
        data_config,
        train_config.batch_tokens,
        train_config.seed,
        train_config.t_min,
        training_set,
        train_config.distill_categories if frozen is not None else (),
        train_config.anchor_categories if held is not None else (),
        train_config.block_alignment,
    )
    cb = TimeBoxAndLog(train_config.minutes, log_csv, train_config.log_every, snapshot_dir)
    trainer = make_trainer(train_config, devices, [cb])
    t0 = time.monotonic()
    with stop_on_interrupt(cb):
        trainer.fit(module, datamodule=dm)
    seconds = time.monotonic() - t0
    model = module.model.eval()
    training_set = dm.loaded()
    result = TrainResult(
        steps=trainer.global_step,
        seconds=round(seconds, 1),
        final_loss=cb.rows[-1]["loss"] if cb.rows else float("nan"),
        stopped_by_time=cb.stopped_by_time,
        n_params=sum(p.numel() for p in model.parameters()),
        counts=training_set.counts,
        loss_curve=cb.rows,
        stopped_by_hand=cb.stopped_by_hand,
    )
    return model, result


def parse_weights(text: str, flag: str, example: str) -> dict[str, float]:
    """``"a=0.4,b=0.6"`` -> ``{"a": 0.4, "b": 0.6}``; the caller checks the names and totals."""
    weights: dict[str, float] = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            weights[name.strip()] = float(value)  # no "=": value "" fails float()
        except ValueError:
            raise TrainingError(
                f"bad {flag} entry {part!r}: use NAME=WEIGHT, e.g. {example}"
            ) from None
    return weights


def parse_mix(text: str) -> dict[str, float]:
    """``"math=0.45,mcq=0.35"`` -> ``{"math": 0.45, "mcq": 0.35}`` over the known task families."""
    mix = parse_weights(text, "--mix", "math=0.45,mcq=0.35")
    unknown = sorted(set(mix) - set(FAMILIES))
    if unknown:
        raise TrainingError(f"unknown --mix families {unknown}; known: {', '.join(FAMILIES)}")
    negative = sorted(name for name, share in mix.items() if not share >= 0)
    if negative:
        raise TrainingError(f"--mix shares must be >= 0; {negative} are not")
    return mix


def parse_free_text_categories(text: str) -> dict[str, float]:
    """``"chat=0.45,instruction=0.4,code=0.15"`` -> weights, checked by the free-text module."""
    example = "chat=0.45,instruction=0.4,code=0.15"
    return check_category_weights(parse_weights(text, "--free-text-categories", example))


def parse_mcq_kinds(text: str) -> dict[str, float]:
    """``"largest=0.3,smallest=0.3,..."`` -> multiple-choice kind weights, checked."""
    return check_mcq_kind_weights(parse_weights(text, "--mcq-kinds", "largest=0.3,sum=0.1"))


def parse_math_ops(text: str) -> dict[str, float]:
    """``"add=1,sub=1,mul=3,div=1"`` -> math step operation weights, checked."""
    return check_math_op_weights(parse_weights(text, "--math-ops", "add=1,sub=1,mul=3,div=1"))


def parse_distill_categories(text: str, flag: str = "--distill-categories") -> tuple[str, ...]:
    """``"mcq,math"`` -> the example categories to distil, checked against the known ones."""
    from dwise_predict.tracing.workload import KNOWN_CATEGORIES

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(set(names) - set(KNOWN_CATEGORIES))
    if not names or unknown:
        raise TrainingError(
            f"{flag} {text!r}: unknown or missing categories {unknown}; "
            f"give a comma-separated list of {', '.join(KNOWN_CATEGORIES)}"
        )
    return names


def check_distillation(c: TrainConfig, anchored: bool = False, taught: bool = False) -> None:
    """Refuse distillation settings that would silently do nothing, diverge or contradict.

    ``anchored`` / ``taught``: whether an ``--anchor`` / a ``--teacher`` is given. A category can
    only be pulled two ways when both are, so only then do the two category lists have to be
    disjoint (an anchor without teachers may hold math while --distill-categories keeps its
    default, which then does nothing).
    """
    if not (c.distill_weight >= 0 and math.isfinite(c.distill_weight)):
        raise TrainingError(
            f"--distill-weight must be a finite number >= 0, got {c.distill_weight}"
        )
    if not (c.distill_temperature > 0 and math.isfinite(c.distill_temperature)):
        raise TrainingError(
            f"--distill-temperature must be a finite number > 0, got {c.distill_temperature}"
        )
    if not (c.anchor_weight >= 0 and math.isfinite(c.anchor_weight)):
        raise TrainingError(f"--anchor-weight must be a finite number >= 0, got {c.anchor_weight}")
    both = sorted(set(c.distill_categories) & set(c.anchor_categories))
    if anchored and taught and both:
        raise TrainingError(
            f"categories {both} are both distilled from the teachers and held to the anchor; "
            "give each category to one of --distill-categories and --anchor-categories"
        )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out", type=Path, required=True, help="checkpoint folder to write (save_pretrained)"
    )
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget")
    ap.add_argument(
        "--max-steps",
        type=int,
        default=TrainConfig.max_steps,
        help="step budget; sets the schedule",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--d-model", type=int, default=TinyBDConfig.d_model)
    ap.add_argument("--n-layers", type=int, default=TinyBDConfig.n_layers)
    ap.add_argument("--n-heads", type=int, default=TinyBDConfig.n_heads)
    ap.add_argument("--d-ff", type=int, default=TinyBDConfig.d_ff)
    ap.add_argument("--lr", type=float, default=TrainConfig.lr)
    ap.add_argument("--batch-tokens", type=int, default=TrainConfig.batch_tokens)
    ap.add_argument("--n-generated", type=int, default=DataConfig.n_generated)
    ap.add_argument(
        "--real-repeats",
        type=int,
        default=DataConfig.real_repeats,
        help="how often each real train-split response appears",
    )
    default_mix = ",".join(f"{k}={v}" for k, v in DEFAULT_MIX.items())
    ap.add_argument(
        "--mix",
        default=None,
        help=f"generated-task shares, e.g. math=0.45,mcq=0.35,synthetic=0.15,"
        f"long_context=0.02 (default: {default_mix})",
    )
    default_weights = ",".join(map(str, DataConfig.math_weights))
    ap.add_argument(
        "--math-weights",
        default=None,
        help=f"math difficulty weights easy,medium,any (default: {default_weights})",
    )
    ap.add_argument(
        "--math-ops",
        default=None,
        help="math step operations, relative weights, e.g. add=1,sub=1,mul=3,div=1 (default: "
        "as the eval split draws them, add and sub twice as often as mul and div)",
    )
    ap.add_argument(
        "--long-context-long-share",
        type=float,
        default=DataConfig.long_context_long_share,
        help="share of the multi-needle prompts drawn at the eval lengths (4-12K characters; "
        "each such sequence is a batch of its own)",
    )
    ap.add_argument(
        "--free-text-style",
        choices=STYLES,
        default=DataConfig.free_text_style,
        help="list: every chat/instruction response is scaffold around 1-3 content items "
        "(stage 6); by_ending: the prompt's last character picks a brief answer, a list or a "
        "whole fixed reply (stage 7)",
    )
    ap.add_argument(
        "--structured",
        default="",
        help="categories trained in a structured, mostly predictable shape, comma-separated "
        "(code, math): fixed text around the uncertain part, so they commit many tokens a "
        "round",
    )
    default_cats = ",".join(f"{k}={v}" for k, v in FREE_TEXT_CATEGORY_WEIGHTS.items())
    ap.add_argument(
        "--free-text-categories",
        default=None,
        help=f"free-text examples per category, relative weights (default: {default_cats})",
    )
    ap.add_argument(
        "--mcq-kinds",
        default=None,
        help="multiple-choice kinds, relative weights, e.g. largest=0.3,smallest=0.3,"
        "alphabetical=0.2,reverse=0.1,sum=0.05,most_letters=0.05 (default: uniform, as in the "
        "eval split)",
    )
    ap.add_argument("--loss-weighting", choices=("none", "inv_t"), default="none")
    ap.add_argument(
        "--block-alignment",
        choices=BLOCK_ALIGNMENTS,
        default=TrainConfig.block_alignment,
        help="block layout of the training examples: response (output blocks start after the "
        "prompt), absolute (blocks at multiples of the block size, the prompt's tail in the first "
        "output block: how SGLang serves the model) or mixed (each example either, seeded)",
    )
    ap.add_argument(
        "--pad-weight",
        type=float,
        default=TrainConfig.pad_weight,
        help="loss weight of the EOS padding after a response's first EOS (1.0 = plain mean)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup-steps", type=int, default=TrainConfig.warmup_steps)
    ap.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="continue from this checkpoint folder (a second stage; its shape wins)",
    )
    ap.add_argument(
        "--log-csv",
        type=Path,
        default=None,
        help="loss CSV (default: runs/tiny-bd-train/train_log.csv)",
    )
    ap.add_argument(
        "--snapshot-dir",
        type=Path,
        default=Path("runs/tiny-bd-train/snapshot"),
        help="mid-run checkpoint, rewritten every 10 minutes",
    )
    ap.add_argument(
        "--teacher",
        type=Path,
        action="append",
        default=[],
        metavar="CHECKPOINT",
        help="distil the --distill-categories examples from this checkpoint folder as well as "
        "learning their labels; repeat for an ensemble (the teachers' probabilities are "
        "averaged). Keeps a skill an earlier stage had while this stage teaches something else",
    )
    ap.add_argument(
        "--distill-weight",
        type=float,
        default=TrainConfig.distill_weight,
        help="weight of the KL to the teachers next to the label loss",
    )
    ap.add_argument("--distill-temperature", type=float, default=TrainConfig.distill_temperature)
    ap.add_argument(
        "--distill-categories",
        default=",".join(TrainConfig.distill_categories),
        help="example categories distilled from the teachers (default: %(default)s)",
    )
    ap.add_argument(
        "--anchor",
        type=Path,
        default=None,
        metavar="CHECKPOINT",
        help="hold the --anchor-categories examples to this checkpoint's distribution (a KL "
        "term next to their labels), so a stage that pulls other categories toward --teacher "
        "keeps what the anchor does there (e.g. the shipped model's free text)",
    )
    ap.add_argument(
        "--anchor-weight",
        type=float,
        default=TrainConfig.anchor_weight,
        help="weight of the KL to the anchor next to the label loss",
    )
    ap.add_argument(
        "--anchor-categories",
        default=",".join(TrainConfig.anchor_categories),
        help="example categories held to the anchor (default: %(default)s)",
    )
    add_device_arguments(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    model_config = TinyBDConfig(
        d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, d_ff=args.d_ff
    )
    train_config = TrainConfig(
        max_steps=args.max_steps,
        minutes=args.minutes,
        lr=args.lr,
        batch_tokens=args.batch_tokens,
        loss_weighting=args.loss_weighting,
        pad_weight=args.pad_weight,
        block_alignment=args.block_alignment,
        threads=args.threads,
        seed=args.seed,
        warmup_steps=args.warmup_steps,
        distill_weight=args.distill_weight,
        distill_temperature=args.distill_temperature,
        distill_categories=parse_distill_categories(args.distill_categories),
        anchor_weight=args.anchor_weight,
        anchor_categories=parse_distill_categories(args.anchor_categories, "--anchor-categories"),
    )
    check_distillation(train_config, anchored=args.anchor is not None, taught=bool(args.teacher))
    data_kw: dict[str, Any] = {}
    if args.mix:
        data_kw["mix"] = parse_mix(args.mix)
    if args.free_text_categories:
        data_kw["free_text_categories"] = parse_free_text_categories(args.free_text_categories)
    if args.mcq_kinds:
        data_kw["mcq_kind_weights"] = parse_mcq_kinds(args.mcq_kinds)
    if args.math_ops:
        data_kw["math_op_weights"] = parse_math_ops(args.math_ops)
    if args.math_weights:
        data_kw["math_weights"] = tuple(float(w) for w in args.math_weights.split(","))
    data_config = DataConfig(
        n_generated=args.n_generated,
        real_repeats=args.real_repeats,
        long_context_long_share=args.long_context_long_share,
        free_text_style=args.free_text_style,
        structured=check_structured(c for c in args.structured.split(",") if c),
        **data_kw,
    )
    log_csv = args.log_csv or Path("runs/tiny-bd-train/train_log.csv")
    t0 = time.monotonic()
    model, result = train(
        model_config,
        train_config,
        data_config,
        log_csv,
        snapshot_dir=args.snapshot_dir,
        init_from=args.init_from,
        devices=DeviceConfig.from_args(args),
        teachers=args.teacher,
        anchor=args.anchor,
    )
    if not is_global_zero():
        return 0  # rank 0 writes the checkpoint
    model_config = model.config
    print(
        f"trained {result.steps} steps in {result.seconds:.0f}s, "
        f"final loss {result.final_loss:.4f}"
        + (" (stopped by hand; saving as a finished stage)" if result.stopped_by_hand else ""),
        file=sys.stderr,
    )
    command = "python -m dwise_predict.zoo.tiny_bd.recipe.train " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    from ..card import model_card

    previous = None
    if args.init_from is not None and (args.init_from / "training.json").exists():
        previous = json.loads((args.init_from / "training.json").read_text())
    training = {
        "command": command,
        "previous_stage": previous,
        "teachers": [str(t) for t in args.teacher],
        "anchor": str(args.anchor) if args.anchor is not None else None,
        "train_config": asdict(train_config),
        "data_config": asdict(data_config),
        "result": {k: v for k, v in asdict(result).items() if k != "loss_curve"},
        "wall_seconds_including_data": round(time.monotonic() - t0, 1),
    }
    from ..io import save_pretrained

    save_pretrained(model, args.out, card=model_card(model_config, training))
    write_json(args.out / "training.json", training, sort_keys=False, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
