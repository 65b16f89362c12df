"""The deployment cost profile: what a request's denoising work costs in milliseconds.

A request's work has a shape that the dLLM fixes (which output blocks it reaches, how many
denoising steps each block needs: the activity matrix ``A[b, s]``) and a price that the
*deployment* fixes (GPU, kernels, batch settings). Keeping the two apart is what lets a
predictor trained once be re-used on new hardware: only this profile is measured again.

    cost = alpha * m + alpha2 * m^2 + beta * n + sum_{b,s} A[b, s] * (K[b, s] + delta * m)

with ``m`` prompt blocks and ``n`` output blocks. ``alpha`` prices prefill per prompt block,
``beta`` the commit/KV refresh of each finished output block, ``K[b, s]`` the denoising step
``s`` of output block ``b`` (later blocks attend to more context; on MoE models later steps
route to more experts) and ``delta`` the extra attention a longer prompt adds to every cell.
``alpha2`` is an optional quadratic prefill term (0 in the paper's linear form): where a
prompt's later blocks attend to all earlier ones at a cost comparable to their own (a small
model on a CPU), prefill grows with m^2, and a linear alpha cannot price long prompts.
Given a predicted surface ``D = E[A]`` the expected cost uses ``E[n] = sum_b D[b, 0]``
(a block is reached iff its first step runs).

Surfaces larger than the profile: a surface with more output blocks than ``K`` has rows is
priced with ``K``'s last row repeated (blocks past the profiled range cost what the last
profiled block cost; context growth that far out is not extrapolated). A surface with fewer
blocks or steps is zero-padded (no activity there). A surface with *more steps per block*
than ``max_steps`` comes from another decoder and is refused.

This module is numpy-only on purpose: a scheduler process prices requests with it.
The fitter (which needs scipy) lives in ``dwise_predict.trainers.cost_profile``.

In a bundle the profile is a module of kind ``cost_profile`` (``dwise_predict.bundle.modules``):
``cost_profile.json`` plus a manifest entry with the hardware, the cross-validation metrics and
a ``revision`` counted up by every re-profiling
(:func:`dwise_predict.bundle.update.write_bundle_cost_profile`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .atomic import write_json
from .errors import BundleIntegrityError, ConfigError, FingerprintMismatchError, PredictorInputError
from .fingerprint import ModelFingerprint

if TYPE_CHECKING:
    from .bundle.modules import BundleFolder

#: File name of a cost profile inside a bundle or a profiling output folder.
COST_PROFILE_FILE = "cost_profile.json"
#: Format tag and version written into every cost_profile.json.
COST_PROFILE_FORMAT = "dwise-predict-cost-profile"
COST_PROFILE_FORMAT_VERSION = 1
#: The cross-validation metrics a fitted profile records.
CV_KEYS: tuple[str, ...] = ("r2", "mape", "spearman", "pairwise")
#: Fingerprint fields that change the meaning of K's axes (another block size or decoder).
PROFILE_CRITICAL_FIELDS: tuple[str, ...] = ("model_id", "block_size", "decoding", "threshold")


@dataclass(frozen=True)
class CostProfile:
    """Profiled cost factors of one deployment of one dLLM (all times in milliseconds)."""

    alpha_ms: float  # per prompt block (prefill)
    beta_ms: float  # per committed output block (commit / KV refresh)
    K_ms: np.ndarray  # (N, S) cell cost by output block b and step s
    delta_ms: float  # prompt-length correction per active cell per prompt block
    block_size: int
    max_steps: int  # S: the decoder's maximum denoising steps per block
    fingerprint: dict[str, Any] = field(default_factory=dict)
    hardware: str = ""
    cv: dict[str, float] | None = None
    alpha2_ms: float = 0.0  # per prompt block squared (quadratic prefill); 0 = linear

    def __post_init__(self) -> None:
        for name in ("alpha_ms", "beta_ms", "delta_ms", "alpha2_ms"):
            v = getattr(self, name)
            if not isinstance(v, (int, float, np.floating, np.integer)) or not math.isfinite(v):
                raise ConfigError(
                    f"cost profile {name}={v!r} is not a finite number; "
                    "re-run `dwise-predict profile` to produce a valid profile"
                )
            if v < 0:
                raise ConfigError(
                    f"cost profile {name}={v} is negative; a cost cannot be "
                    "negative: re-fit the profile (the fitter is non-negative)"
                )
            object.__setattr__(self, name, float(v))
        for name in ("block_size", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"cost profile {name}={v!r} must be a positive integer")
            object.__setattr__(self, name, int(v))
        try:
            K = np.array(self.K_ms, dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"cost profile K_ms is not a numeric N x S matrix ({e})") from e
        if K.ndim != 2 or K.shape[0] < 1:
            raise ConfigError(
                f"cost profile K_ms must be an N x S matrix with N >= 1, got shape {K.shape}"
            )
        if K.shape[1] != self.max_steps:
            raise ConfigError(
                f"cost profile K_ms has {K.shape[1]} step columns but "
                f"max_steps={self.max_steps}; they must agree"
            )
        if not np.all(np.isfinite(K)):
            bad = np.argwhere(~np.isfinite(K))[0].tolist()
            raise ConfigError(
                f"cost profile K_ms holds NaN/inf (first at block, step {bad}); "
                "re-run `dwise-predict profile` to produce a valid profile"
            )
        if np.any(K < 0):
            raise ConfigError("cost profile K_ms holds negative cell costs; re-fit the profile")
        K.setflags(write=False)
        object.__setattr__(self, "K_ms", K)
        object.__setattr__(self, "fingerprint", dict(self.fingerprint or {}))
        if self.cv is not None:
            cv = {k: float(v) for k, v in dict(self.cv).items()}
            object.__setattr__(self, "cv", cv)

    # -- shape ---------------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        """N: the number of output blocks the profile prices individually."""
        return int(self.K_ms.shape[0])

    def cell_costs(self, n_blocks: int) -> np.ndarray:
        """K as an ``(n_blocks, S)`` matrix: cut, or extended by repeating its last row."""
        if n_blocks <= self.n_blocks:
            return self.K_ms[:n_blocks]
        extra = np.repeat(self.K_ms[-1:], n_blocks - self.n_blocks, axis=0)
        return np.concatenate([self.K_ms, extra], axis=0)

    # -- pricing -------------------------------------------------------------------------
    def expected_cost(self, surface: np.ndarray, prompt_blocks: np.ndarray) -> np.ndarray:
        """(n, N, S) surface D + (n,) prompt blocks -> (n,) expected ms:
        alpha*m + alpha2*m^2 + beta*E[n] + sum_{b,s} D*(K + delta*m), E[n] = sum_b D[b, 0].

        ``surface`` may be a predicted DWS (probabilities) or true activity matrices (0/1);
        a single (N, S) surface with a scalar ``prompt_blocks`` gives a 1-element array."""
        D = np.asarray(surface, dtype=np.float64)
        if D.ndim == 2:
            D = D[None]
        if D.ndim != 3:
            raise PredictorInputError(f"surface must have shape (n, N, S), got {D.shape}")
        m = np.asarray(prompt_blocks, dtype=np.float64).reshape(-1)
        if m.size != D.shape[0]:
            raise PredictorInputError(
                f"{D.shape[0]} surfaces but {m.size} prompt-block counts; "
                "give one prompt-block count per surface"
            )
        if D.shape[2] > self.max_steps:
            raise PredictorInputError(
                f"surface has {D.shape[2]} steps per block but the cost profile was measured "
                f"for at most {self.max_steps} (block size {self.block_size}): it belongs to "
                "another decoder; profile that decoder with `dwise-predict profile`"
            )
        if not (np.all(np.isfinite(D)) and np.all(np.isfinite(m))):
            raise PredictorInputError("surface or prompt blocks contain NaN/inf")
        if np.any(D < 0) or np.any(D > 1 + 1e-6):
            raise PredictorInputError("surface values must be probabilities in [0, 1]")
        if np.any(m < 0):
            raise PredictorInputError("prompt blocks must be >= 0")
        if D.shape[2] < self.max_steps:
            D = np.pad(D, ((0, 0), (0, 0), (0, self.max_steps - D.shape[2])))
        K = self.cell_costs(D.shape[1])
        expected_blocks = D[:, :, 0].sum(axis=1)
        cells = D.sum(axis=(1, 2))
        denoise = np.einsum("nbs,bs->n", D, K) + self.delta_ms * m * cells
        out: np.ndarray = (
            self.alpha_ms * m + self.alpha2_ms * m * m + self.beta_ms * expected_blocks + denoise
        )
        return out

    def request_cost(self, rounds_per_block: Sequence[int], prompt_blocks: int) -> float:
        """Cost (ms) of one request that ran ``rounds_per_block[b]`` steps in output block b."""
        rounds = np.asarray(rounds_per_block, dtype=np.int64).reshape(-1)
        if rounds.size == 0:
            return float(self.alpha_ms * prompt_blocks + self.alpha2_ms * prompt_blocks**2)
        if np.any(rounds < 1) or np.any(rounds > self.max_steps):
            raise PredictorInputError(
                f"rounds per block must lie in [1, {self.max_steps}], got {rounds.tolist()}"
            )
        A = (np.arange(self.max_steps)[None, :] < rounds[:, None]).astype(np.float64)
        return float(self.expected_cost(A[None], np.array([prompt_blocks]))[0])

    def cell_cost(self, block: int, step: int, prompt_blocks: int) -> float:
        """Cost (ms) of denoising step ``step`` of output block ``block``: K[b, s] + delta*m."""
        b = min(max(int(block), 0), self.n_blocks - 1)
        s = min(max(int(step), 0), self.max_steps - 1)
        return float(self.K_ms[b, s] + self.delta_ms * prompt_blocks)

    # -- compatibility -------------------------------------------------------------------
    def mismatches(self, fingerprint: ModelFingerprint | dict[str, Any]) -> list[str]:
        """Fingerprint fields (of :data:`PROFILE_CRITICAL_FIELDS`) where the two disagree
        (a field unknown on either side is skipped)."""
        mine = _as_fingerprint({**self.fingerprint, "block_size": self.block_size})
        other = (
            fingerprint
            if isinstance(fingerprint, ModelFingerprint)
            else _as_fingerprint(fingerprint)
        )
        return mine.mismatches(other, PROFILE_CRITICAL_FIELDS)

    def check_compatible(self, fingerprint: ModelFingerprint | dict[str, Any]) -> None:
        """Refuse a profile measured for another dLLM, block size or decoder."""
        bad = self.mismatches(fingerprint)
        if bad:
            other = (
                fingerprint.to_dict() if isinstance(fingerprint, ModelFingerprint) else fingerprint
            )
            pairs = ", ".join(f"{k}: profile {self._field(k)!r} vs {other.get(k)!r}" for k in bad)
            raise FingerprintMismatchError(
                f"cost profile was measured for another dLLM/decoder ({pairs}); profile this "
                "deployment with `dwise-predict profile`, or pass allow_mismatch=True to "
                "price with it anyway (e.g. to study a paper profile)"
            )

    def _field(self, name: str) -> Any:
        return self.block_size if name == "block_size" else self.fingerprint.get(name)

    # -- files ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": COST_PROFILE_FORMAT,
            "format_version": COST_PROFILE_FORMAT_VERSION,
            "alpha_ms": self.alpha_ms,
            "alpha2_ms": self.alpha2_ms,
            "beta_ms": self.beta_ms,
            "delta_ms": self.delta_ms,
            "K_ms": self.K_ms.tolist(),
            "block_size": self.block_size,
            "max_steps": self.max_steps,
            "cv": None if self.cv is None else dict(self.cv),
            "fingerprint": dict(self.fingerprint),
            "hardware": self.hardware,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CostProfile:
        if not isinstance(d, dict):
            raise ConfigError(f"a cost profile must be a JSON object, got {type(d).__name__}")
        version = d.get("format_version", COST_PROFILE_FORMAT_VERSION)
        if version != COST_PROFILE_FORMAT_VERSION:
            raise ConfigError(
                f"cost profile format_version {version} is not supported (this "
                f"library reads {COST_PROFILE_FORMAT_VERSION}); upgrade "
                "dwise-predict"
            )
        missing = [
            k for k in ("alpha_ms", "beta_ms", "delta_ms", "K_ms", "block_size") if k not in d
        ]
        if missing:
            raise ConfigError(f"cost profile is missing {missing}; re-run `dwise-predict profile`")
        K = d["K_ms"]
        steps = d.get("max_steps")
        if steps is None:
            steps = len(K[0]) if K and isinstance(K[0], list) else 0
        return cls(
            alpha_ms=_num(d["alpha_ms"]),
            beta_ms=_num(d["beta_ms"]),
            K_ms=K,
            delta_ms=_num(d["delta_ms"]),
            block_size=d["block_size"],
            max_steps=steps,
            fingerprint=d.get("fingerprint") or {},
            hardware=str(d.get("hardware", "")),
            cv=d.get("cv"),
            alpha2_ms=_num(d.get("alpha2_ms", 0.0)),
        )

    def save(self, path: str | Path) -> list[str]:
        """Write ``cost_profile.json`` atomically; ``path`` is the file or its folder (a bundle
        draft, as a bundle module). Returns the written name(s), relative to the folder."""
        p = Path(path)
        if p.is_dir():
            p = p / COST_PROFILE_FILE
        write_json(p, self.to_json())
        return [p.name]

    @classmethod
    def load(
        cls,
        path: str | Path | BundleFolder,  # type: ignore[override]
        entry: Mapping[str, Any] | None = None,
    ) -> CostProfile:
        """From a ``cost_profile.json`` (or its folder), or, as a bundle module, from a verified
        bundle folder and its manifest entry."""
        if not isinstance(path, (str, Path)):
            name = str((entry or {}).get("file", COST_PROFILE_FILE))
            try:
                return cls.from_json(path.read_json(name))
            except ConfigError as e:
                raise BundleIntegrityError(
                    f"{path.root}/{name} is not a valid cost profile ({e}); re-profile the bundle"
                ) from e
        p = Path(path)
        if p.is_dir():
            p = p / COST_PROFILE_FILE
        try:
            # NaN/Infinity are not JSON; Python's parser accepts them, so they reach the
            # validation in __post_init__ and are refused there with a clear message.
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError as e:
            raise ConfigError(f"no cost profile at {p}; run `dwise-predict profile` first") from e
        except json.JSONDecodeError as e:
            raise ConfigError(f"cost profile {p} is not valid JSON ({e})") from e
        return cls.from_json(data)

    # -- bundle module (dwise_predict.bundle.modules) ------------------------------------
    kind: ClassVar[str] = "cost_profile"
    estimates: ClassVar[Mapping[str, str]] = {}
    onnx_exporter: ClassVar[str | None] = None

    def entry(self) -> dict[str, Any]:
        """The manifest's record: what the card shows without opening the file."""
        return {
            "estimate": "milliseconds of work: prices an activity matrix or a DWS surface",
            "model": "cost_profile",
            "file": COST_PROFILE_FILE,
            "hardware": self.hardware,
            "cv": self.cv,
            "block_size": self.block_size,
            "max_steps": self.max_steps,
            "n_blocks": self.n_blocks,
            "prefill": "quadratic" if self.alpha2_ms else "linear",
        }

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        cv = entry.get("cv") or {}
        fit = (
            f"; 5-fold R² {cv['r2']:.4f}, MAPE {100 * cv['mape']:.1f}%"
            if isinstance(cv.get("r2"), float) and isinstance(cv.get("mape"), float)
            else ""
        )
        return (
            f"cost profile rev {entry.get('revision', 1)} (alpha, beta, K "
            f"{entry.get('n_blocks', '?')} x {entry.get('max_steps', '?')}, delta; "
            f"{entry.get('prefill', 'linear')} prefill) on {entry.get('hardware') or '?'}"
            f"{fit}"
        )

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        bad = self.mismatches(fingerprint)
        if bad:
            raise BundleIntegrityError(
                f"{where}: the cost profile was measured for another "
                f"dLLM/decoder ({', '.join(bad)}); re-profile the bundle"
            )


def _as_fingerprint(d: dict[str, Any]) -> ModelFingerprint:
    """A possibly partial fingerprint dict as a ModelFingerprint (missing fields unknown)."""
    return ModelFingerprint.from_dict(
        {"model_id": None, "block_size": None, "threshold": None, **d}
    )


def _num(v: Any) -> float:
    """A JSON number (or the NaN/Infinity literals Python writes) as a float, else an error."""
    if v is None or isinstance(v, bool):
        raise ConfigError(f"cost profile value {v!r} is not a number")
    try:
        return float(v)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"cost profile value {v!r} is not a number") from e


def named_cost_profiles() -> list[str]:
    """Names of the example profiles shipped with the package (loadable offline by name)."""
    root = resources.files("dwise_predict.cost_profiles")
    return sorted(p.name[: -len(".json")] for p in root.iterdir() if p.name.endswith(".json"))


def load_cost_profile(name_or_path: str | Path) -> CostProfile:
    """A profile by shipped name (e.g. ``"paper-llada2.0-mini"``), file or folder."""
    p = Path(name_or_path)
    if p.exists():
        return CostProfile.load(p)
    name = str(name_or_path)
    if name in named_cost_profiles():
        text = resources.files("dwise_predict.cost_profiles").joinpath(f"{name}.json")
        return CostProfile.from_json(json.loads(text.read_text(encoding="utf-8")))
    raise ConfigError(
        f"no cost profile file or shipped profile named {name!r}; shipped: "
        f"{', '.join(named_cost_profiles())}, or give a cost_profile.json path"
    )
