"""Bundle revisions for the hot-swap tests and benchmark: real bundles, edited the library's way.

Each is written by ``update_bundle`` (verified, hashed, atomic), so the plugin loads it exactly
as it would load a revision ``dwise-predict refresh`` published. ``publish`` flips a
``current`` symlink to a revision atomically: the deploy pattern the docs describe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dwise_predict.bundle import load_bundle, update_bundle
from dwise_predict.features import FEATURE_NAMES

#: what the DWISE policy never reads: the DWS predictor (23 MB) and the cost profile it prices
LEAN = {"dws": ("dws.int8.onnx", "dws.json", "dws_tokenizer.json"), "cost_profile": ()}


def revision(
    src: str | Path,
    out: Path,
    number: int,
    *,
    admission_text: str | None = None,
    threshold: float | None = None,
    lean: bool = True,
) -> Path:
    """A copy of bundle ``src`` as revision ``number``; optionally with another admission
    model (LightGBM text), another decoding threshold in its fingerprint (a bundle for another
    server setting); ``lean`` leaves out what the DWISE policy never reads (:data:`LEAN`)."""
    with update_bundle(src, out=out) as draft:
        draft.manifest["revision"] = int(number)
        for kind, files in LEAN.items() if lean else ():
            entry = draft.manifest["predictors"].pop(kind, None)
            for name in (*files, *(entry or {}).get("files", [])):
                draft.remove_file(name)
        if admission_text is not None:
            draft.path("admission.lgb.txt").write_text(admission_text, encoding="utf-8")
        if threshold is not None:
            draft.manifest["fingerprint"]["threshold"] = float(threshold)
    return out


def admission_text(
    X: np.ndarray, rounds: np.ndarray, seed: int = 0, names: Sequence[str] = FEATURE_NAMES
) -> str:
    """LightGBM text of an admission model fitted to ``rounds`` from features ``X`` (columns
    ``names``; the library's target: log total rounds)."""
    import lightgbm as lgb

    params: dict[str, Any] = {
        "objective": "regression",
        "num_leaves": 15,
        "min_data_in_leaf": 5,
        "learning_rate": 0.1,
        "seed": seed,
        "num_threads": 1,
        "verbose": -1,
        "deterministic": True,
    }
    data = lgb.Dataset(np.asarray(X, np.float64), np.log(np.maximum(rounds, 1.0)))
    data.set_feature_name(list(names))
    booster = lgb.train(params, data, num_boost_round=60)
    return str(booster.model_to_string())


def feature_grid(n: int = 2000, seed: int = 0, names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
    """Plausible prompt feature rows (columns ``names``) to fit variants on: words
    log-uniform, so short prompts are as densely covered as long ones, and 1.1 to 9 tokens a
    word, which spans subword tokenizers and byte-level ones such as tiny-bd's (5-8); half the
    prompts without digits or code symbols, the rest up to 40% and 20% of their characters."""
    rng = np.random.default_rng(seed)
    words = np.exp(rng.uniform(0.0, np.log(600.0), size=n)).astype(int)
    lines = rng.integers(0, 40, size=n)
    tokens = (words * rng.uniform(1.1, 9.0, size=n)).astype(int) + 8
    cols = {"word_count": words, "newline_count": lines, "prompt_tokens": tokens}
    if len(names) > len(cols):
        cols["digit_permille"] = np.where(rng.random(n) < 0.5, 0, rng.integers(0, 400, n))
        cols["symbol_permille"] = np.where(rng.random(n) < 0.5, 0, rng.integers(0, 200, n))
        cols["question_marks"] = rng.integers(0, 3, size=n)
    return np.stack([cols[k] for k in names], axis=1).astype(np.float64)


def _distilled(src: str | Path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``src``'s admission estimates on a feature grid of its own features."""
    bundle = load_bundle(src)
    names = bundle.admission.feature_names
    X = feature_grid(names=names)
    return X, np.asarray(bundle.predict_admission_features(X)), names


def scaled_copy_text(src: str | Path, factor: float) -> str:
    """An admission model that predicts exactly ``factor`` times what ``src``'s does: its
    first tree's leaves raised by log(factor), which shifts every raw score by that much."""
    import math

    lines = load_bundle(src).admission.model_text.splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if line.startswith("leaf_value="))
    values = lines[first].removeprefix("leaf_value=").split()
    shifted = " ".join(repr(float(v) + math.log(factor)) for v in values)
    lines[first] = f"leaf_value={shifted}\n"
    return "".join(lines)


def inverted_text(src: str | Path) -> str:
    """An admission model whose targets were corrupted: it orders requests the reverse of
    ``src``'s (the longest predicted shortest), at ``src``'s median scale."""
    X, live, names = _distilled(src)
    return admission_text(X, float(np.median(live)) ** 2 / live, names=names)


def split_text(src: str | Path, tokens: int) -> str:
    """An admission model that predicts as ``src`` does for prompts under ``tokens`` tokens
    and in reverse order (as :func:`inverted_text`) for longer ones: good on short-prompt
    traffic, bad once long prompts come."""
    X, live, names = _distilled(src)
    flipped = float(np.median(live)) ** 2 / live
    short = X[:, names.index("prompt_tokens")] < tokens
    return admission_text(X, np.where(short, live, flipped), names=names)


def random_text(src: str | Path, seed: int = 0) -> str:
    """An admission model on ``src``'s features fitted to noise: it ranks no better than
    chance."""
    names = load_bundle(src).admission.feature_names
    X = feature_grid(seed=seed, names=names)
    noise = np.random.default_rng(seed + 1).lognormal(3.0, 1.0, size=len(X))
    return admission_text(X, noise, seed, names=names)


def publish(link: Path, target: Path) -> None:
    """Point the symlink ``link`` at ``target`` atomically (a reader sees one or the other)."""
    tmp = link.with_name(link.name + ".next")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
