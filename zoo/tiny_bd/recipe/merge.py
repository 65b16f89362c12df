"""Merge checkpoints of one tiny-bd training chain by a weighted average of their weights.

    python -m dwise_predict.zoo.tiny_bd.recipe.merge --out runs/tiny-bd-train/stage13 \\
        runs/tiny-bd-train/stage12=0.75 runs/tiny-bd-train/stage5=0.25

Why: each stage continues the one before on new data, and what a stage adds (free text) it pays
for with what the model knew (mcq, arithmetic). The weights between a continued checkpoint and
its ancestor often keep both -- interpolating a fine-tuned model toward the model it started
from ("WiSE-FT", Wortsman et al., 2022). That holds only inside one chain, where one checkpoint
was trained from the other and both sit in one basin; averaging models trained apart gives
noise, so merging is refused unless the architectures match.

The merged checkpoint's ``training.json`` nests the heaviest input's history under
``previous_stage`` (as a continued stage does) and lists every input with its revision and
weight, so the model card shows the merge as a stage of its own.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from dwise_predict.errors import TrainingError


@dataclass(frozen=True)
class MergeInput:
    """One checkpoint folder and its share of the merged weights."""

    path: Path
    weight: float


def parse_input(spec: str) -> MergeInput:
    """``PATH=WEIGHT`` (``PATH`` alone weighs 1; weights are normalised to sum to 1)."""
    path, sep, weight = spec.rpartition("=")
    if not sep:
        return MergeInput(Path(spec), 1.0)
    try:
        w = float(weight)
    except ValueError:
        raise TrainingError(
            f"bad merge input {spec!r}: the weight after '=' must be a number, "
            "e.g. runs/tiny-bd-train/stage12=0.75"
        ) from None
    return MergeInput(Path(path), w)


def merge_state(
    states: Sequence[dict[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """The weighted mean of state dicts of one architecture (accumulated in float64)."""
    merged: dict[str, torch.Tensor] = {}
    for k, first in states[0].items():
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for w, s in zip(weights, states, strict=True):
            acc += w * s[k].double()
        merged[k] = acc.to(first.dtype).contiguous()
    return merged


def merge_checkpoints(inputs: Sequence[MergeInput], out: Path, command: str = "") -> Path:
    """Write the weighted average of ``inputs`` to ``out`` as a checkpoint folder with a card."""
    from ..io import from_pretrained, save_derived
    from ..model import TinyBDModel

    if len(inputs) < 2:
        raise TrainingError("merging needs at least two checkpoints (PATH=WEIGHT ...)")
    weights = [i.weight for i in inputs]
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise TrainingError(
            f"merge weights must be finite, non-negative and not all zero, got {weights}"
        )
    weights = [w / sum(weights) for w in weights]
    loaded = [from_pretrained(i.path) for i in inputs]
    config = loaded[0].config
    for i, tb in zip(inputs[1:], loaded[1:], strict=True):
        if tb.config.to_dict() != config.to_dict():
            raise TrainingError(
                f"{i.path} has another architecture than {inputs[0].path} "
                f"({tb.config.to_dict()} vs {config.to_dict()}); merge only checkpoints of "
                "one training chain"
            )
    state = merge_state([tb.model.state_dict() for tb in loaded], weights)
    model = TinyBDModel(config)
    model.load_state_dict(state)
    base = max(range(len(inputs)), key=lambda j: weights[j])
    record = [
        {"path": str(i.path), "revision": tb.revision, "weight": round(w, 6)}
        for i, tb, w in zip(inputs, loaded, weights, strict=True)
    ]
    save_derived(model, out, inputs[base].path, command, "merge", record)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.merge",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument(
        "inputs", nargs="+", metavar="PATH=WEIGHT", help="checkpoint folders and their weights"
    )
    args = ap.parse_args(argv)
    command = "python -m dwise_predict.zoo.tiny_bd.recipe.merge " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    out = merge_checkpoints([parse_input(s) for s in args.inputs], args.out, command)
    print(f"merged {len(args.inputs)} checkpoints into {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
