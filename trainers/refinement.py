"""Train the refinement predictor: a 3-seed survival-MLP ensemble with Lightning, then an isotonic
map.

docs/concepts.md, "The predictors". Each member is
``Linear(H+2, 256) -> GELU(tanh) -> Dropout(0.2) -> Linear(256, K)`` emitting one hazard logit per
future round (K = largest remaining-round count in training). Loss: negative log-likelihood of the
discrete-time logistic hazards. For a request with ``y`` remaining rounds
(``y = total_rounds - 1``; hazard index ``j`` stands for round ``k = j + 1``):

    uncensored: log P(T = y) = sum_{j < y} log(1 - h_j) + log h_y     (no event term when y = K)
    censored (``hit_budget``: the output budget cut it, T >= y):
                log P(T >= y) = sum_{j < y} log(1 - h_j)

Members differ only in seed (``seed_everything(seed + i, workers=True)``); their survival
curves are averaged at inference. Training reads the traces through a row source
(:mod:`.streaming`) in seeded chunk-shuffled batches (:mod:`.loader`), so traces larger than
memory train the same way as a table in memory, and under DDP each process reads its own
share; where it runs is a :class:`~.devices.DeviceConfig`.
The isotonic map (scikit-learn) is fitted on the training
split, from the raw ensemble mean to the actual remaining rounds (or their log / log1p:
``RefinementConfig.calibration``), and exported as plain arrays. Weights are exported to numpy
(safetensors in the bundle), never as a checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from dwise_predict.errors import ConfigError, PredictorInputError, TrainingError
from dwise_predict.predictors import IsotonicMap, MLPWeights, RefinementEnsemble
from dwise_predict.predictors.calibration import DEFAULT_TRANSFORM, TRANSFORMS
from dwise_predict.predictors.refinement import normalized_inputs

from .dataset import TraceArrays, trace_arrays
from .devices import DeviceConfig, is_global_zero
from .kind import KindTrainer, TrainedPart, TrainSettings, trainable, trainer_for
from .loader import ShufflePlan, TraceBatches
from .streaming import ArraySource, RowSource, TraceStats, chunks, scan_stats

if TYPE_CHECKING:
    from dwise_predict.bundle import Bundle

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RefinementConfig:
    members: int = 3
    width: int = 256
    dropout: float = 0.2
    epochs: int = 20
    batch_size: int = 256
    lr: float = 2e-3
    weight_decay: float = 1e-4
    seed: int = 0
    censor_hit_budget: bool = True
    #: member i trains without fold i of the training split, and the isotonic map is fitted on
    #: each training request's prediction by the member that did not see it (out-of-fold);
    #: in-sample survival curves of an MLP with H ~ n inputs are overconfident and would fit a
    #: map that underestimates the scale on new requests
    cross_fit_calibration: bool = True
    #: what the isotonic map is fitted to: "identity" = remaining rounds; "log1p" / "log" = their
    #: log (a conditional geometric mean, the admission model's kind of estimate); "none" = no map
    calibration: str = DEFAULT_TRANSFORM
    num_threads: int = 1
    min_samples: int = 32
    #: rows read at a time, and chunks per shuffle window: a window is what a data-loader
    #: worker holds in memory (1,024 x 8 rows of a 2,048-wide hidden state: 64 MiB)
    chunk_rows: int = 1024
    window_chunks: int = 8
    #: data-loader worker processes per training process (0: read in the training process)
    num_workers: int = 0

    def __post_init__(self) -> None:
        if self.members < 1 or self.width < 1 or self.epochs < 1 or self.batch_size < 1:
            raise ConfigError(
                f"invalid refinement config {self}: members, width, epochs, batch_size must be >= 1"
            )
        if self.chunk_rows < 1 or self.window_chunks < 1 or self.num_workers < 0:
            raise ConfigError(
                f"invalid refinement config {self}: chunk_rows and window_chunks "
                "must be >= 1, num_workers >= 0"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.calibration not in (*TRANSFORMS, "none"):
            raise ConfigError(
                f"calibration must be one of {[*TRANSFORMS, 'none']}, got {self.calibration!r}"
            )


def survival_nll(
    logits: torch.Tensor, remaining: torch.Tensor, censored: torch.Tensor
) -> torch.Tensor:
    """Mean negative log-likelihood of logistic hazards with right censoring (see the module
    doc)."""
    j = torch.arange(logits.shape[1], device=logits.device)
    y = remaining[:, None]
    survive = (j < y).to(logits.dtype)
    event = ((j == y) & ~censored[:, None]).to(logits.dtype)
    ll = survive * nn.functional.logsigmoid(-logits) + event * nn.functional.logsigmoid(logits)
    return -ll.sum(dim=1).mean()


class SurvivalMLP(pl.LightningModule):
    """One ensemble member: normalized input ``(n, H+2)`` -> K hazard logits."""

    def __init__(
        self,
        d_in: int,
        K: int,
        width: int = 256,
        dropout: float = 0.2,
        lr: float = 2e-3,  # noqa: N803
        weight_decay: float = 1e-4,
        init_hazard: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.lr, self.weight_decay = lr, weight_decay
        self.net = nn.Sequential(
            nn.Linear(d_in, width),
            nn.GELU(approximate="tanh"),
            nn.Dropout(dropout),
            nn.Linear(width, K),
        )
        if init_hazard is not None:  # start from the marginal hazards: faster, steadier convergence
            h = np.clip(np.asarray(init_hazard, dtype=np.float64), 1e-4, 1 - 1e-4)
            with torch.no_grad():
                self._last().bias.copy_(torch.as_tensor(np.log(h / (1 - h)), dtype=torch.float32))

    # nn.Sequential's items are typed as Module; the layers at 0 and 3 are the two Linear layers
    def _first(self) -> nn.Linear:
        return cast(nn.Linear, self.net[0])

    def _last(self) -> nn.Linear:
        return cast(nn.Linear, self.net[3])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, remaining, censored = batch
        loss = survival_nll(self(x), remaining, censored)
        self.log("train_nll", loss, on_step=False, on_epoch=True, prog_bar=False, batch_size=len(x))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def to_weights(self) -> MLPWeights:
        first, last = self._first(), self._last()
        return MLPWeights(
            first.weight.detach().cpu().numpy().T.copy(),
            first.bias.detach().cpu().numpy().copy(),
            last.weight.detach().cpu().numpy().T.copy(),
            last.bias.detach().cpu().numpy().copy(),
        )


@dataclass(frozen=True)
class Normalization:
    """Input normalization fitted on the training split (recorded in the bundle)."""

    hidden_mean: np.ndarray
    hidden_std: np.ndarray
    prompt_tokens_scale: float
    output_budget_scale: float

    @classmethod
    def from_stats(cls, stats: TraceStats) -> Normalization:
        return cls(
            stats.hidden_mean,
            stats.hidden_std,
            stats.prompt_tokens_scale,
            stats.output_budget_scale,
        )

    def apply(self, arrays: TraceArrays) -> np.ndarray:
        if arrays.hidden is None:
            raise TrainingError("refinement training needs first_round_hidden in the traces")
        return normalized_inputs(
            arrays.hidden,
            arrays.prompt_tokens,
            arrays.output_budget,
            self.hidden_mean,
            (1.0 / self.hidden_std).astype(np.float32),
            self.prompt_tokens_scale,
            self.output_budget_scale,
        )


def marginal_hazard(remaining: np.ndarray, censored: np.ndarray, K: int) -> np.ndarray:  # noqa: N803
    """Kaplan-Meier-style hazards per remaining round index (censoring-aware)."""
    counts = np.bincount(remaining, minlength=K + 1)
    at_risk = np.cumsum(counts[::-1])[::-1][:K].astype(np.float64)  # requests with y >= j
    events = np.bincount(remaining[~censored], minlength=K + 1)[:K].astype(np.float64)
    return (events + 0.5) / (at_risk + 1.0)


class TraceDataModule(pl.LightningDataModule):
    """A row source -> normalized inputs, remaining rounds and censoring flags, batched.

    Each epoch re-reads the source in a new seeded order (``reload_dataloaders_every_n_epochs=1``),
    sharded by the trainer's rank and world size and by data-loader worker; the global batch is
    ``batch_size`` whatever the number of processes.
    """

    def __init__(
        self,
        source: RowSource,
        normalization: Normalization,
        config: RefinementConfig,
        *,
        seed: int,
        keep: np.ndarray | None = None,
    ) -> None:
        super().__init__()
        self.source, self.normalization, self.config = source, normalization, config
        self.seed, self.keep = seed, keep

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        epoch = trainer.current_epoch if trainer is not None else 0
        c = self.config
        workers = c.num_workers
        plan = ShufflePlan.for_shards(
            self.source.n,
            world * max(1, workers),
            chunk_rows=c.chunk_rows,
            window_chunks=c.window_chunks,
            batch_size=max(1, c.batch_size // world),
            seed=self.seed,
            keep=self.keep,
        )
        batches = TraceBatches(
            self.source,
            plan,
            self.normalization.apply,
            epoch=epoch,
            rank=rank,
            world=world,
            workers=workers,
            censor_hit_budget=c.censor_hit_budget,
        )
        return DataLoader(
            batches, batch_size=None, num_workers=workers, prefetch_factor=2 if workers else None
        )


def as_source(traces: str | Path | pa.Table | TraceArrays | RowSource) -> RowSource:
    """Paths and tables are read into memory; a :class:`~.streaming.ParquetSource` streams."""
    if isinstance(traces, TraceArrays):
        return ArraySource(traces)
    if isinstance(traces, (str, Path, pa.Table)):
        return ArraySource(trace_arrays(traces, need_hidden=True))
    return traces


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    loggers = [
        logging.getLogger(n) for n in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*does not have many workers.*")
        warnings.filterwarnings("ignore", message=r".*(GPU|TPU|HPU) available.*")
        warnings.filterwarnings("ignore", module=r"(pytorch_)?lightning.*")
        warnings.filterwarnings("ignore", message=r".*treespec.*")
        try:
            yield
        finally:
            for lg, lvl in zip(loggers, levels):
                lg.setLevel(lvl)


def train_refinement(
    traces: str | Path | pa.Table | TraceArrays | RowSource,
    config: RefinementConfig | None = None,
    *,
    devices: DeviceConfig | None = None,
    progress: bool = False,
) -> RefinementEnsemble:
    """Train the ensemble and its isotonic map; returns numpy inference weights.

    The estimate is denoising rounds STILL TO GO after the first denoising round. ``traces``
    in memory or a :class:`~.streaming.ParquetSource` give the same ensemble bit for bit (one
    code path reads both). Under a multi-process ``devices`` every process returns the trained
    members; only global rank 0 fits the isotonic map (the others return it unset) -- the
    caller writes the bundle from rank 0.
    """
    config = config or RefinementConfig()
    devices = devices or DeviceConfig()
    source = as_source(traces)
    setup = _MemberSetup.scan(source, config, progress)
    threads = torch.get_num_threads()
    t0 = time.perf_counter()
    try:
        torch.set_num_threads(config.num_threads)
        with _quiet_lightning():
            members, world = _train_members(source, setup, config, devices, progress)
    finally:
        torch.set_num_threads(threads)
    info = _training_info(setup, config, devices, world, time.perf_counter() - t0)
    norm = setup.norm
    ensemble = RefinementEnsemble(
        members,
        norm.hidden_mean,
        norm.hidden_std,
        norm.prompt_tokens_scale,
        norm.output_budget_scale,
        None,
        info,
    )
    if config.calibration != "none" and is_global_zero():
        fold = setup.fold if setup.cross_fit else None
        raw = streamed_raw_estimates(ensemble, source, norm, fold, config.chunk_rows)
        ensemble.calibration = fit_isotonic(raw, setup.stats.remaining, config.calibration)
    return ensemble


@dataclass(frozen=True)
class _MemberSetup:
    """What every ensemble member trains from: the traces' statistics, the input normalization,
    which requests are censored, and each request's fold (-1 everywhere without cross-fitting:
    every member then sees every request)."""

    stats: TraceStats
    norm: Normalization
    censored: np.ndarray
    cross_fit: bool
    fold: np.ndarray

    @property
    def K(self) -> int:  # noqa: N802 - the paper's name for the horizon
        return self.stats.K

    @classmethod
    def scan(cls, source: RowSource, config: RefinementConfig, progress: bool) -> _MemberSetup:
        """One pass over ``source``; refused when it is too small or has nothing to refine."""
        if source.n < config.min_samples:
            raise TrainingError(
                f"{source.n} requests are too few to train the refinement model "
                f"(need >= {config.min_samples}); trace more requests"
            )
        stats = scan_stats(source, config.chunk_rows, progress=progress)
        if stats.K < 1:
            raise TrainingError(
                "every training request finished in its first denoising round (K = 0): nothing "
                "to refine; trace requests with longer outputs"
            )
        n = stats.n
        cross_fit = config.cross_fit_calibration and config.members > 1
        return cls(
            stats=stats,
            norm=Normalization.from_stats(stats),
            censored=stats.hit_budget if config.censor_hit_budget else np.zeros(n, dtype=bool),
            cross_fit=cross_fit,
            fold=fold_ids(stats.category, config.members, config.seed)
            if cross_fit
            else np.full(n, -1),
        )


def _train_members(
    source: RowSource,
    setup: _MemberSetup,
    config: RefinementConfig,
    devices: DeviceConfig,
    progress: bool,
) -> tuple[list[MLPWeights], int]:
    """Train the members one after another (member ``i`` seeded ``seed + i``, without fold
    ``i`` when cross-fitting); the members' weights and the run's process count."""
    members: list[MLPWeights] = []
    world = 1
    for i in range(config.members):
        log.info(
            "refinement member %d of %d: %d epoch%s over %d requests",
            i + 1,
            config.members,
            config.epochs,
            "" if config.epochs == 1 else "s",
            int(np.count_nonzero(setup.fold != i)) if setup.cross_fit else setup.stats.n,
        )
        pl.seed_everything(config.seed + i, workers=True, verbose=False)
        keep = setup.fold != i if setup.cross_fit else None
        dm = TraceDataModule(source, setup.norm, config, seed=config.seed + i, keep=keep)
        model = _member_model(setup, config, keep)
        trainer = pl.Trainer(
            max_epochs=config.epochs,
            deterministic=True,
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=progress,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            reload_dataloaders_every_n_epochs=1,
            use_distributed_sampler=False,
            **devices.trainer_kwargs(),
        )
        trainer.fit(model, datamodule=dm)
        world = trainer.world_size
        members.append(model.cpu().to_weights())
    return members, world


def _member_model(
    setup: _MemberSetup, config: RefinementConfig, keep: np.ndarray | None
) -> SurvivalMLP:
    """A fresh member, its output bias set to the marginal hazard of the requests it sees."""
    y = setup.stats.remaining.astype(np.int64)
    censored = setup.censored
    hazard = marginal_hazard(
        y if keep is None else y[keep], censored if keep is None else censored[keep], setup.K
    )
    d_in = setup.stats.hidden_size + 2  # hidden vector + normalized prompt length and budget
    return SurvivalMLP(
        d_in,
        setup.K,
        config.width,
        config.dropout,
        config.lr,
        config.weight_decay,
        init_hazard=hazard,
    )


def _training_info(
    setup: _MemberSetup,
    config: RefinementConfig,
    devices: DeviceConfig,
    world: int,
    train_seconds: float,
) -> dict[str, Any]:
    """What the ensemble records about its training (its manifest entry's ``info``)."""
    return {
        "config": asdict(config),
        "n_train": setup.stats.n,
        "K": setup.K,
        "train_seconds": train_seconds,
        "torch": torch.__version__,
        "pytorch_lightning": pl.__version__,
        "devices": asdict(devices),
        "processes": world,
        "calibration_fit": "out-of-fold" if setup.cross_fit else "in-sample",
    }


def streamed_raw_estimates(
    ensemble: RefinementEnsemble,
    source: RowSource,
    norm: Normalization,
    fold: np.ndarray | None,
    chunk_rows: int,
) -> np.ndarray:
    """Raw ensemble means of every training request, read chunk by chunk.

    With ``fold``, each request is predicted by the member that did not train on it (the
    out-of-fold estimate the isotonic map is fitted on); only ``n`` floats stay in memory.
    """
    raw = np.empty(source.n)
    singles = [
        RefinementEnsemble(
            [m],
            norm.hidden_mean,
            norm.hidden_std,
            norm.prompt_tokens_scale,
            norm.output_budget_scale,
        )
        for m in ensemble.members
    ]
    for start, stop in chunks(source.n, chunk_rows):
        x = norm.apply(source.read(start, stop))
        if fold is None:
            raw[start:stop] = ensemble.survival_from_inputs(x).sum(axis=1)
            continue
        f = fold[start:stop]
        out = np.empty(stop - start)
        for i, single in enumerate(singles):
            if np.any(f == i):
                out[f == i] = single.survival_from_inputs(x[f == i]).sum(axis=1)
        raw[start:stop] = out
    return raw


def fold_ids(categories: np.ndarray, n_folds: int, seed: int) -> np.ndarray:
    """Seeded fold of each request, stratified by category (every fold sees every category)."""
    rng = np.random.default_rng(seed)
    fold = np.empty(len(categories), dtype=np.int64)
    for c in sorted(set(categories.tolist())):
        idx = np.flatnonzero(categories == c)
        fold[rng.permutation(idx)] = np.arange(len(idx)) % n_folds
    return fold


#: remaining rounds of 0 are fitted as this in log space (log 0 is undefined)
LOG_FLOOR = 0.5


def fit_isotonic(
    raw: np.ndarray, remaining: np.ndarray, transform: str = DEFAULT_TRANSFORM
) -> IsotonicMap:
    """Fit scikit-learn's IsotonicRegression and keep only its two threshold arrays."""
    from sklearn.isotonic import IsotonicRegression

    y = remaining.astype(np.float64)
    transforms: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "log1p": np.log1p,
        "log": lambda v: np.log(np.maximum(v, LOG_FLOOR)),
        "identity": lambda v: v,
    }
    target = transforms[transform](y)
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(raw, target)
    return IsotonicMap(np.asarray(iso.X_thresholds_), np.asarray(iso.y_thresholds_), transform)


class TorchRefinement(nn.Module):
    """The numpy ensemble as one torch module, for a GPU stream: ``forward`` returns estimates.

    Same weights, same arithmetic (tanh GELU, averaged survival curves, isotonic interpolation),
    batched as one GEMM for all members' first layers.
    """

    # buffers (register_buffer): declared so the type checker knows they are tensors
    hidden_mean: torch.Tensor
    inv_std: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor
    iso_x: torch.Tensor
    iso_y: torch.Tensor

    def __init__(self, ensemble: RefinementEnsemble) -> None:
        super().__init__()
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in ensemble.tensors().items()}
        m = len(ensemble.members)
        self.members = m
        self.hidden_size = ensemble.hidden_size
        self.register_buffer("hidden_mean", t["input.hidden_mean"])
        self.register_buffer("inv_std", 1.0 / t["input.hidden_std"])
        self.register_buffer("w1", torch.cat([t[f"member{i}.w1"] for i in range(m)], dim=1))
        self.register_buffer("b1", torch.cat([t[f"member{i}.b1"] for i in range(m)]))
        self.register_buffer(
            "w2", torch.stack([t[f"member{i}.w2"] for i in range(m)])
        )  # (m, width, K)
        self.register_buffer("b2", torch.stack([t[f"member{i}.b2"] for i in range(m)]))  # (m, K)
        self.prompt_tokens_scale = float(ensemble.prompt_tokens_scale)
        self.output_budget_scale = float(ensemble.output_budget_scale)
        cal = ensemble.calibration
        self.transform = cal.target_transform if cal is not None else "identity"
        self.register_buffer(
            "iso_x", torch.as_tensor(cal.x_thresholds if cal else np.zeros(0), dtype=torch.float64)
        )
        self.register_buffer(
            "iso_y", torch.as_tensor(cal.y_thresholds if cal else np.zeros(0), dtype=torch.float64)
        )

    def forward(
        self,
        hidden: torch.Tensor,
        prompt_tokens: torch.Tensor,
        output_budget: torch.Tensor,
        raw: bool = False,
    ) -> torch.Tensor:
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise PredictorInputError(
                f"hidden must be (n, {self.hidden_size}), got {tuple(hidden.shape)}"
            )
        x = torch.cat(
            [
                (hidden.float() - self.hidden_mean) * self.inv_std,
                (prompt_tokens.float() / self.prompt_tokens_scale)[:, None],
                (output_budget.float() / self.output_budget_scale)[:, None],
            ],
            dim=1,
        )
        a = nn.functional.gelu(x @ self.w1 + self.b1, approximate="tanh")
        a = a.view(len(x), self.members, -1).transpose(0, 1)  # (m, n, width)
        z = (torch.bmm(a, self.w2) + self.b2[:, None, :]).double()  # (m, n, K)
        s = torch.exp(torch.cumsum(nn.functional.logsigmoid(-z), dim=2)).mean(dim=0)
        mean = s.sum(dim=1)
        if raw or self.iso_x.numel() == 0:
            return mean
        y = _interp(mean, self.iso_x, self.iso_y)
        return torch.clamp(_TORCH_INVERSES[self.transform](y), min=0.0)


#: the torch twin of dwise_predict.predictors.calibration.INVERSES (same keys: every transform)
_TORCH_INVERSES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "identity": lambda y: y,
    "log": torch.exp,
    "log1p": torch.expm1,
}


def _interp(x: torch.Tensor, xp: torch.Tensor, fp: torch.Tensor) -> torch.Tensor:
    """``np.interp`` in torch (clipped at both ends)."""
    if len(xp) == 1:
        return fp.expand_as(x).clone()
    xc = torch.clamp(x, xp[0], xp[-1])
    i = torch.clamp(torch.searchsorted(xp, xc, right=True) - 1, 0, len(xp) - 2)
    x0, x1, y0, y1 = xp[i], xp[i + 1], fp[i], fp[i + 1]
    w = torch.where(
        x1 > x0,
        (xc - x0) / torch.where(x1 > x0, x1 - x0, torch.ones_like(x1)),
        torch.zeros_like(xc),
    )
    return y0 + w * (y1 - y0)


def ensemble_to_torch(
    ensemble: RefinementEnsemble, device: str | torch.device = "cpu"
) -> TorchRefinement:
    """The torch inference path (e.g. ``ensemble_to_torch(bundle.refinement, "cuda")``)."""
    return TorchRefinement(ensemble).to(device).eval()


def _train(arrays: TraceArrays, s: TrainSettings) -> TrainedPart:
    if arrays.hidden is None and s.source is None:
        others = [k for k in trainable() if not trainer_for(k).needs_hidden]
        raise TrainingError(
            "the traces have no first_round_hidden; re-trace with hidden-state capture, "
            f"or train only kinds that do not read it (--only {','.join(others)})"
        )
    rows = s.source if s.source is not None else arrays
    cfg = replace(s.config(RefinementEnsemble.kind, RefinementConfig), seed=s.seed)
    return TrainedPart(train_refinement(rows, cfg, devices=s.devices))


#: the refinement kind's trainer (named by ``RefinementEnsemble.trainer``)
TRAINER = KindTrainer(train=_train, config_type=RefinementConfig, needs_hidden=True)


def evaluate_estimates(
    bundle: Bundle, arrays: TraceArrays
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The raw and calibrated refined estimates against the rounds still to go after the
    first denoising round (``RefinementEnsemble.evaluator``)."""
    if arrays.hidden is None:
        raise TrainingError(
            "the evaluation traces have no first_round_hidden; the refinement predictor "
            "cannot be evaluated (re-trace with hidden-state capture)"
        )
    args = (arrays.hidden, arrays.prompt_tokens, arrays.output_budget)
    remaining = arrays.remaining.astype(float)
    return {
        "refined_raw": (bundle.predict_refined(*args, raw=True), remaining),
        "refined": (bundle.predict_refined(*args), remaining),
    }
