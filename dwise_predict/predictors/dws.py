"""The DWS surface predictor in the light core: prompt text -> denoising workload surface.

DWS (Denoising Workload Surface) keeps the two-dimensional structure of a block-diffusion
request's work: ``D[b, s]`` is the probability that output block ``b`` needs a denoising step
``s``, predicted from the prompt alone. A text encoder (all-MiniLM-L6-v2 by default, mean
pooled) feeds two heads, a block-count distribution and, per block, a within-block step
distribution, and

    D[b, s] = P(n > b) * P(steps_b > s | block b reached)

so every surface keeps the decoding constraints by construction: it is non-increasing along
``s`` (a block cannot need step s+1 without step s) and its first column is non-increasing
along ``b`` (block b+1 is reached only if block b was); a later block may still need more
steps than an earlier one. A cost profile
(:mod:`dwise_predict.cost`) turns a surface into milliseconds; the surface itself does not
depend on the hardware, so moving to a new deployment re-profiles the costs, not this model.

This module runs the exported ONNX file (encoder + heads in one graph) with onnxruntime and
tokenizes with the ``tokenizers`` library: no torch, no transformers, one intra-op thread by
default, so a scheduler process can call it on its own core. Training and export live in
``dwise_predict.trainers.dws`` and ``dwise_predict.export.onnx_dws``.

Prompts longer than the encoder's window are truncated **head and tail**: the first
``head_tokens`` and the last ``window - 2 - head_tokens`` word pieces are kept around
``[CLS]``/``[SEP]`` (the request's framing is at its start, the actual question usually at its
end). Before tokenizing, a prompt longer than ``max_chars`` characters is cut to its first and
last ``max_chars // 2`` characters, so a megabyte prompt costs no more than a long one; the
rule is recorded in the bundle (``dws.json``, ``truncation``). An empty prompt is valid: the
encoder sees ``[CLS] [SEP]`` and predicts the workload of an empty request.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..atomic import write_bytes, write_json, write_text
from ..errors import BundleError, BundleIntegrityError, PredictorInputError
from ..fingerprint import ModelFingerprint

if TYPE_CHECKING:
    from ..bundle.modules import BundleFolder

ONNX_FILE = "dws.onnx"
INT8_FILE = "dws.int8.onnx"
CONFIG_FILE = "dws.json"
TOKENIZER_FILE = "dws_tokenizer.json"
INPUTS = ("input_ids", "attention_mask")
SURFACE_OUTPUT = "surface"
#: evaluation-only output of the same graph: the scalar baselines trained on the same encoder
BASELINES_OUTPUT = "baselines"
BASELINE_NAMES = ("output_length", "total_steps", "direct_cost")
ESTIMATE = (
    "DWS surface D[b, s] = P(output block b needs denoising step s | prompt), shape (n, N, S)"
)


@dataclass(frozen=True)
class Truncation:
    """How a prompt is fitted into the encoder's window (recorded in the bundle)."""

    window: int = 256
    head_tokens: int = 127
    max_chars: int = 16384
    rule: str = "head+tail"

    def __post_init__(self) -> None:
        if self.window < 3 or not 0 <= self.head_tokens <= self.window - 2 or self.max_chars < 2:
            raise PredictorInputError(
                f"invalid truncation {self}: need window >= 3, 0 <= head_tokens <= window - 2, "
                "max_chars >= 2"
            )
        if self.rule != "head+tail":
            raise BundleError(
                f"unknown truncation rule {self.rule!r}; this dwise-predict knows "
                "'head+tail': upgrade dwise-predict"
            )

    def cut_text(self, text: str) -> str:
        """Keep the first and last ``max_chars // 2`` characters of a huge prompt."""
        if len(text) <= self.max_chars:
            return text
        half = self.max_chars // 2
        return text[:half] + " " + text[-half:]

    def cut_ids(self, ids: Sequence[int]) -> list[int]:
        """Keep ``head_tokens`` word pieces from the start, the rest of the window from the end."""
        room = self.window - 2
        if len(ids) <= room:
            return list(ids)
        tail = room - self.head_tokens
        return list(ids[: self.head_tokens]) + (list(ids[-tail:]) if tail else [])


@dataclass(frozen=True)
class DWSConfig:
    """What ``dws.json`` records: the surface's shape and how the encoder reads prompts."""

    n_blocks: int  # N: output blocks the surface covers (budget / block size, +1 if absolute)
    max_steps: int  # S: the decoder's maximum denoising steps per block
    block_size: int
    truncation: Truncation = field(default_factory=Truncation)
    encoder: str = "sentence-transformers/all-MiniLM-L6-v2"
    pooling: str = "mean"
    cls_token_id: int = 101
    sep_token_id: int = 102
    pad_token_id: int = 0
    #: constants that turn the scalar baselines' outputs into ms (evaluation only), by profile
    baselines: dict[str, Any] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DWSConfig:
        try:
            trunc = Truncation(**d["truncation"])
            return cls(
                n_blocks=int(d["n_blocks"]),
                max_steps=int(d["max_steps"]),
                block_size=int(d["block_size"]),
                truncation=trunc,
                encoder=str(d.get("encoder", "")),
                pooling=str(d.get("pooling", "mean")),
                cls_token_id=int(d["cls_token_id"]),
                sep_token_id=int(d["sep_token_id"]),
                pad_token_id=int(d["pad_token_id"]),
                baselines=dict(d.get("baselines") or {}),
                info=dict(d.get("info") or {}),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise BundleIntegrityError(
                f"{CONFIG_FILE} is malformed ({e!r}); re-train or re-save the DWS predictor"
            ) from e


def surface_from_logits(block_logits: np.ndarray, step_logits: np.ndarray) -> np.ndarray:
    """``(n, N)`` block-count logits + ``(n, N, S)`` step logits -> ``(n, N, S)`` surface.

    Block-count class ``j`` means ``n = j + 1`` output blocks and step class ``t`` means
    ``steps = t + 1``, so P(n > b) and P(steps > s) are reversed cumulative sums of the
    softmaxes. The numpy twin of the graph the exporter writes (used by tests and the trainer).
    """

    def softmax(z: np.ndarray) -> np.ndarray:
        e = np.exp(z - z.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    p_blocks = np.flip(np.cumsum(np.flip(softmax(block_logits), -1), -1), -1)  # P(n > b)
    p_steps = np.flip(np.cumsum(np.flip(softmax(step_logits), -1), -1), -1)  # P(steps > s)
    return p_blocks[:, :, None] * p_steps


class DWSTokenizer:
    """The encoder's WordPiece tokenizer (``tokenizers``), with the bundle's truncation rule."""

    def __init__(self, tokenizer: Any, config: DWSConfig) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.config = config

    @classmethod
    def from_file(cls, path: str | Path, config: DWSConfig) -> DWSTokenizer:
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)), config)
        except Exception as e:  # tokenizers raises a bare Exception
            raise BundleError(
                f"{path} is not a valid tokenizer ({e}); re-save the DWS predictor"
            ) from e

    def token_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt's ids, truncated head and tail, between ``[CLS]`` and ``[SEP]``."""
        c, t = self.config, self.config.truncation
        texts = [t.cut_text(p) for p in prompts]
        pieces = [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
        return [[c.cls_token_id, *t.cut_ids(ids), c.sep_token_id] for ids in pieces]

    def encode(self, prompts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)``, int64, padded to the longest prompt of the batch."""
        c = self.config
        rows = self.token_ids(prompts)
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), c.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = r
            mask[i, : len(r)] = 1
        return ids, mask


def check_prompts(prompts: str | Sequence[str]) -> list[str]:
    if isinstance(prompts, str):
        return [prompts]
    out = list(prompts)
    bad = [i for i, p in enumerate(out) if not isinstance(p, str)]
    if bad:
        raise PredictorInputError(
            f"prompts must be strings; items {bad[:5]} are "
            f"{sorted({type(out[i]).__name__ for i in bad})}"
        )
    return out


class DWSPredictor:
    """Prompt text -> DWS surface ``(n, N, S)`` with onnxruntime (FP32 or INT8 file).

    A bundle module of kind ``dws`` (:mod:`dwise_predict.bundle.modules`): its files are
    ``dws.onnx`` (+ ``dws.int8.onnx`` when INT8 passed its gate), ``dws_tokenizer.json`` and
    ``dws.json``; ``int8_path`` and ``exports`` (the gate's records) travel with it to ``save``.
    """

    kind: ClassVar[str] = "dws"
    estimates: ClassVar[Mapping[str, str]] = {}
    #: its ONNX files are written at training; `export` reports their gates
    onnx_exporter: ClassVar[str | None] = "dwise_predict.export.onnx_dws:EXPORTER"
    trainer: ClassVar[str | None] = "dwise_predict.trainers.dws_bundle:TRAINER"
    #: evaluated on its surface and costs (``trainers/dws_eval.py``), not on rounds estimates
    evaluator: ClassVar[str | None] = None
    monitor_label: ClassVar[str | None] = None

    def __init__(
        self,
        onnx_path: str | Path,
        tokenizer: DWSTokenizer,
        config: DWSConfig,
        *,
        threads: int = 1,
        batch_size: int = 32,
        int8_path: str | Path | None = None,
        exports: list[dict[str, Any]] | None = None,
        ship_fp32: bool = True,
    ) -> None:
        from .onnx_runtime import open_session

        self.path = Path(onnx_path)
        self.session, self.meta = open_session(self.path, self.kind, threads=threads)
        self.tokenizer = tokenizer
        self.config = config
        self.batch_size = max(1, int(batch_size))
        self.precision = self.meta.get("dwise.precision", "fp32")
        self.outputs = tuple(o.name for o in self.session.get_outputs())
        self.int8_path = Path(int8_path) if int8_path is not None else None
        self.exports = list(exports or [])
        #: whether :meth:`save` writes the FP32 file too; False for an INT8-only module (the
        #: FP32 encoder is 90 MB for all-MiniLM-L6-v2, its INT8 file about a third of that)
        self.ship_fp32 = ship_fp32
        shape = (
            int(self.meta.get("dwise.n_blocks", -1)),
            int(self.meta.get("dwise.max_steps", -1)),
        )
        if shape != (config.n_blocks, config.max_steps):
            raise BundleIntegrityError(
                f"{self.path.name} predicts surfaces of shape {shape} but {CONFIG_FILE} says "
                f"({config.n_blocks}, {config.max_steps}); the files are from different runs: "
                "re-export the DWS predictor"
            )

    @property
    def rows_per_call(self) -> int:
        """Prompts per session call. One for an INT8 file: its dynamic quantization picks one
        activation scale per tensor, i.e. per call, so in a batch a prompt's surface would
        depend on the prompts beside it (up to 13% of its expected rounds on tiny-bd's eval
        prompts), and a scheduler's ranking on which arrivals came together. One at a time is
        also no slower on a CPU core (no padding to the batch's longest prompt)."""
        return 1 if self.precision == "int8" else self.batch_size

    @property
    def shape(self) -> tuple[int, int]:
        """``(N, S)``: output blocks and steps per block of every surface."""
        return self.config.n_blocks, self.config.max_steps

    def _run(self, names: list[str], prompts: str | Sequence[str]) -> list[np.ndarray]:
        texts = check_prompts(prompts)
        n = len(texts)
        widths = {SURFACE_OUTPUT: self.shape, BASELINES_OUTPUT: (len(BASELINE_NAMES),)}
        outs = [np.zeros((n, *widths[name]), dtype=np.float32) for name in names]
        # sorted by length: a batch pads to its longest prompt, so similar lengths waste less
        order = np.argsort([len(t) for t in texts], kind="stable")
        step = self.rows_per_call
        for lo in range(0, n, step):
            idx = order[lo : lo + step]
            ids, mask = self.tokenizer.encode([texts[i] for i in idx])
            got = self.session.run(names, {"input_ids": ids, "attention_mask": mask})
            for out, g in zip(outs, got):
                out[idx] = g
        return outs

    def predict_surface(self, prompts: str | Sequence[str]) -> np.ndarray:
        """The DWS surface ``(n, N, S)`` float32, one per prompt."""
        return self._run([SURFACE_OUTPUT], prompts)[0]

    def predict_baselines(self, prompts: str | Sequence[str]) -> np.ndarray:
        """``(n, 3)``: the scalar baselines' raw outputs (output tokens, total steps, direct
        cost in ms under the training profile), for evaluation next to the surface."""
        if BASELINES_OUTPUT not in self.outputs:
            raise BundleError(
                f"{self.path.name} was exported without the baselines output; "
                "train with baselines on and re-export"
            )
        return self._run([BASELINES_OUTPUT], prompts)[0]

    # -- files (bundle module) ------------------------------------------------------------
    def save(self, folder: str | Path) -> list[str]:
        """Write the ONNX file(s), tokenizer and ``dws.json`` into ``folder``; returns the names.

        The FP32 file is the one this predictor was built from, unless it runs the INT8 file
        (loaded from a bundle that kept one): then both are copied from beside it. An INT8-only
        module (``ship_fp32`` False) writes the INT8 file alone."""
        folder = Path(folder)
        fp32 = self.path if self.precision == "fp32" else self.path.with_name(ONNX_FILE)
        int8 = self.int8_path or (self.path if self.precision == "int8" else None)
        if int8 is None and not self.ship_fp32:
            raise BundleError(
                "an INT8-only DWS module needs an INT8 file, but its INT8 export was dropped "
                "by the parity gate; ship the FP32 file (leave --dws-int8-only off)"
            )
        names = []
        if self.ship_fp32:
            write_bytes(folder / ONNX_FILE, fp32.read_bytes())
            names.append(ONNX_FILE)
        if int8 is not None:
            write_bytes(folder / INT8_FILE, int8.read_bytes())
            names.append(INT8_FILE)
        write_text(folder / TOKENIZER_FILE, self.tokenizer.tokenizer.to_str())
        write_json(folder / CONFIG_FILE, self.config.to_json())
        return [*names, TOKENIZER_FILE, CONFIG_FILE]

    def entry(self) -> dict[str, Any]:
        """The manifest's record: shape, encoder, truncation rule, precision, export gate."""
        c = self.config
        has_int8 = self.int8_path is not None or self.precision == "int8"
        return {
            "kind": self.kind,
            "estimate": ESTIMATE,
            "model": "dws_surface",
            "N": c.n_blocks,
            "S": c.max_steps,
            "block_size": c.block_size,
            "encoder": c.encoder,
            "pooling": c.pooling,
            "truncation": asdict(c.truncation),
            "precision": "int8" if has_int8 else "fp32",
            "fp32_shipped": self.ship_fp32,
            "n_params": int(c.info.get("encoder_params", 0) + c.info.get("head_params", 0)),
            "exports": self.exports,
        }

    @classmethod
    def load(
        cls,
        folder: str | Path | BundleFolder,  # type: ignore[override]
        entry: Mapping[str, Any] | None = None,
        *,
        int8: bool = True,
        threads: int = 1,
    ) -> DWSPredictor:
        """From a folder holding ``dws.json``, the tokenizer and ``dws[.int8].onnx``, or, as a
        bundle module, from a verified bundle folder (only listed files are opened).

        The INT8 file is preferred when present and ``int8`` is true: an exporter keeps it only
        when it passed its parity gate.
        """
        if isinstance(folder, (str, Path)):
            root = Path(folder)

            def path(name: str) -> Path:
                return root / name

            def has(name: str) -> bool:
                return (root / name).is_file()
        else:
            root, path, has = folder.root, folder.path, folder.has
        if not has(CONFIG_FILE):
            raise BundleError(
                f"{root} has no {CONFIG_FILE}; train the DWS predictor with "
                "`dwise-predict train --only dws`"
            )
        try:
            config = DWSConfig.from_json(json.loads(path(CONFIG_FILE).read_text("utf-8")))
        except ValueError as e:
            raise BundleIntegrityError(f"{root}/{CONFIG_FILE} is not valid JSON ({e})") from e
        tok = DWSTokenizer.from_file(path(TOKENIZER_FILE), config)
        exports = list((entry or {}).get("exports") or [])
        if not has(ONNX_FILE):
            if not has(INT8_FILE):
                raise BundleError(f"{root} has neither {ONNX_FILE} nor {INT8_FILE}")
            if not int8:
                raise BundleError(
                    f"{root} ships the DWS predictor as {INT8_FILE} only (trained with "
                    "--dws-int8-only); load it with int8=True, or retrain to get the FP32 file"
                )
            return cls(
                path(INT8_FILE), tok, config, threads=threads, exports=exports, ship_fp32=False
            )
        if int8 and has(INT8_FILE):
            return cls(path(INT8_FILE), tok, config, threads=threads, exports=exports)
        return cls(path(ONNX_FILE), tok, config, threads=threads, exports=exports)

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        trunc = entry.get("truncation") or {}
        return (
            f"DWS surface {entry.get('N', '?')} x {entry.get('S', '?')} blocks x steps: "
            f"{entry.get('encoder', '?')} ({entry.get('pooling', 'mean')} pooled, window "
            f"{trunc.get('window', '?')} tokens, {trunc.get('rule', '?')} truncation) + "
            f"block-count and per-block step heads, {entry.get('precision', 'fp32')} ONNX"
        )

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        bs = fingerprint.block_size
        if bs is not None and bs != self.config.block_size:
            raise BundleIntegrityError(
                f"{where}: the DWS predictor was trained on block size "
                f"{self.config.block_size} but the bundle is for {bs}; "
                "retrain it on this bundle's traces"
            )

    def __repr__(self) -> str:
        n, s = self.shape
        return f"DWSPredictor({self.path.name}, N={n}, S={s}, {self.precision})"
