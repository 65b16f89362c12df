"""Give a tiny-bd checkpoint more capacity without changing what it computes.

    python -m dwise_predict.zoo.tiny_bd.recipe.grow --out runs/tiny-bd-train/grown10 \\
        --d-ff 768 zoo/tiny_bd/weights

Why: every stage after stage 5 traded one skill for another (free text for multiple choice and
arithmetic, instruction for arithmetic), and the trade looks like a model too small to hold all
three, not one trained too little: more steps at one mix moved one figure up and another down.
Training a wider model from scratch costs the ~40K steps the chain took. Growing the trained one
keeps all of it: the SwiGLU feed-forward of every layer gets ``d_ff - old`` new hidden units whose
gate and up rows are drawn small and random (so they receive gradient) and whose ``down`` columns
are zero (so they add nothing yet). The grown model's logits equal its source's (to float
rounding), and the next stage starts where the source ended, with room to learn more.

The grown checkpoint's ``training.json`` nests the source's history under ``previous_stage`` and
records the growth, so the model card lists it as a stage.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

from dwise_predict.errors import TrainingError

from ..model import TinyBDModel


def grow_state(
    state: dict[str, torch.Tensor], old_ff: int, new_ff: int, seed: int, init_std: float = 0.02
) -> dict[str, torch.Tensor]:
    """The state dict with every MLP widened from ``old_ff`` to ``new_ff`` hidden units.

    ``gate_up`` stacks the gate rows then the up rows, so each half gets its new rows appended;
    ``down`` gets zero columns, which keeps the output unchanged.
    """
    gen = torch.Generator().manual_seed(seed)
    extra = new_ff - old_ff
    grown: dict[str, torch.Tensor] = {}
    for key, w in state.items():
        if key.endswith("mlp.gate_up.weight"):
            gate, up = w[:old_ff], w[old_ff:]
            new = torch.randn(2, extra, w.shape[1], generator=gen, dtype=w.dtype) * init_std
            grown[key] = torch.cat([gate, new[0], up, new[1]]).contiguous()
        elif key.endswith("mlp.down.weight"):
            grown[key] = torch.cat([w, w.new_zeros(w.shape[0], extra)], dim=1).contiguous()
        else:
            grown[key] = w
    return grown


def grow_checkpoint(
    source: Path, out: Path, d_ff: int, seed: int = 0, command: str = ""
) -> tuple[Path, float]:
    """Write ``source`` widened to ``d_ff``; returns the folder and the largest logit change."""
    from ..io import from_pretrained, save_derived

    tb = from_pretrained(source)
    old = tb.config
    if d_ff <= old.d_ff:
        raise TrainingError(
            f"--d-ff {d_ff} does not grow {source} (its d_ff is {old.d_ff}); give a larger width"
        )
    config = replace(old, d_ff=d_ff)
    model = TinyBDModel(config)
    model.load_state_dict(grow_state(tb.model.state_dict(), old.d_ff, d_ff, seed))
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, old.vocab_size, (2, 2 * old.block_size), generator=gen)
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    with torch.no_grad():
        change = (model(ids, pos).logits - tb.model(ids, pos).logits).abs().max().item()
    if change > 1e-4:  # a growth that changes the function is a bug, never a checkpoint
        raise TrainingError(f"growing {source} changed its logits by {change:.2e}")
    record = {
        "source": str(source),
        "revision": tb.revision,
        "d_ff": [old.d_ff, d_ff],
        "seed": seed,
        "max_logit_change": change,
    }
    save_derived(model, out, source, command, "grow", record)
    return out, change


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dwise_predict.zoo.tiny_bd.recipe.grow",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("source", type=Path, help="checkpoint folder to grow")
    ap.add_argument("--out", type=Path, required=True, help="checkpoint folder to write")
    ap.add_argument("--d-ff", type=int, required=True, help="new feed-forward width")
    ap.add_argument("--seed", type=int, default=0, help="seed of the new units' weights")
    args = ap.parse_args(argv)
    command = "python -m dwise_predict.zoo.tiny_bd.recipe.grow " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    out, change = grow_checkpoint(args.source, args.out, args.d_ff, args.seed, command)
    print(f"grew {args.source} to d_ff {args.d_ff} in {out} (logits moved {change:.1e})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
