"""Where a Lightning trainer runs: accelerator, devices, nodes, strategy and precision.

One dataclass shared by every trainer (refinement, the tiny-bd reference model, DWS) so a GPU
machine, N GPUs with DDP, or several nodes under torchrun or SLURM are a matter of options, not
code. The defaults keep the CPU behaviour the trainers always had: one CPU process, fp32.
Multi-process strategies come from Lightning (its launchers, its DDP); the trainers only make
sure each process reads its own share of the data (:mod:`.streaming`) and that one process
writes the results (:func:`is_global_zero`).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

from dwise_predict.errors import ConfigError

ACCELERATORS = ("cpu", "gpu", "cuda", "mps", "tpu", "auto")
PRECISIONS = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true")


@dataclass(frozen=True)
class DeviceConfig:
    """The Lightning ``Trainer`` settings that decide where training runs.

    ``devices`` is a count (``2``), ``"auto"`` or a list such as ``"0,1"``; ``strategy`` is any
    Lightning strategy name (``"auto"``, ``"ddp"``, ``"ddp_spawn"``, ``"fsdp"``, ...).
    """

    accelerator: str = "cpu"
    devices: int | str = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: str = "32-true"

    def __post_init__(self) -> None:
        if self.accelerator not in ACCELERATORS:
            raise ConfigError(
                f"--accelerator must be one of {', '.join(ACCELERATORS)}, got {self.accelerator!r}"
            )
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.num_nodes < 1:
            raise ConfigError(f"--num-nodes must be >= 1, got {self.num_nodes}")
        if isinstance(self.devices, int) and self.devices < 1 and self.devices != -1:
            raise ConfigError(
                f"--devices must be >= 1 (or -1 / 'auto' for all), got {self.devices}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DeviceConfig:
        """The config of the options :func:`add_device_arguments` added."""
        return cls(
            accelerator=args.accelerator,
            devices=parse_devices(args.devices),
            num_nodes=args.num_nodes,
            strategy=args.strategy,
            precision=args.precision,
        )

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``pytorch_lightning.Trainer``."""
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": self.strategy,
            "precision": self.precision,
        }

    @property
    def is_default(self) -> bool:
        return self == DeviceConfig()


def parse_devices(text: str | int) -> int | str:
    """``"2"`` -> 2, ``"auto"`` -> ``"auto"``, ``"0,1"`` -> ``"0,1"`` (Lightning's device list)."""
    if isinstance(text, int):
        return text
    s = str(text).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    if s == "auto" or all(p.strip().isdigit() for p in s.split(",") if p.strip()):
        return s
    raise ConfigError(f"--devices takes a count, 'auto' or a list such as 0,1; got {text!r}")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """Add --accelerator, --devices, --num-nodes, --strategy and --precision to ``parser``."""
    d = DeviceConfig()
    g = parser.add_argument_group("devices (Lightning Trainer)")
    g.add_argument(
        "--accelerator",
        default=d.accelerator,
        choices=ACCELERATORS,
        help=f"where to train (default: {d.accelerator})",
    )
    g.add_argument(
        "--devices",
        default=str(d.devices),
        help="devices per node: a count, 'auto' or a list such as 0,1 (default: 1)",
    )
    g.add_argument(
        "--num-nodes",
        type=int,
        default=d.num_nodes,
        help="machines taking part (torchrun / SLURM set the ranks; default: 1)",
    )
    g.add_argument(
        "--strategy",
        default=d.strategy,
        help="Lightning strategy, e.g. ddp for several devices (default: auto)",
    )
    g.add_argument(
        "--precision",
        default=d.precision,
        choices=PRECISIONS,
        help=f"numeric precision (default: {d.precision})",
    )


def global_rank() -> int:
    """This process's rank among all training processes (0 when training is not distributed).

    Read from torch.distributed once Lightning has set it up (after ``fit`` it stays set up),
    else from the variables the launchers set: torchrun RANK, SLURM SLURM_PROCID, Lightning's
    own launcher NODE_RANK and LOCAL_RANK (zero on both in the first process only).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    for var in ("RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return int(os.environ.get("NODE_RANK", 0)) + int(os.environ.get("LOCAL_RANK", 0))


def is_global_zero() -> bool:
    """True in the one process that writes bundles, checkpoints and logs."""
    return global_rank() == 0
