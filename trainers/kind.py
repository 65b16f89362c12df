"""What a predictor kind's trainer is, and what every trainer is given.

Why here: the one registry of kinds is :mod:`dwise_predict.bundle.modules`; a kind's class
names its trainer there as ``trainer = "module:ATTRIBUTE"``, pointing at a :class:`KindTrainer`
beside the kind's training code (``trainers/admission.py:TRAINER`` and so on). The pipeline
(:mod:`.pipeline`) asks the registry which kinds can be trained and what each needs, so a new
kind trains without any change to the pipeline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dwise_predict.bundle.modules import BundleModule, hook, with_hook
from dwise_predict.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from dwise_predict.cost import CostProfile
    from dwise_predict.features import PromptFeaturizer

    from .dataset import TraceArrays
    from .devices import DeviceConfig
    from .streaming import RowSource


@dataclass(frozen=True)
class TrainSettings:
    """What every kind's trainer may use: the seed, the featurizer, per-kind configs, where to
    run, and the inputs some kinds read besides the trace arrays."""

    seed: int = 0
    featurizer: PromptFeaturizer | None = None
    #: kind -> that kind's training config (e.g. an ``AdmissionConfig``); absent = its default
    configs: Mapping[str, Any] = field(default_factory=dict)
    #: streamed traces feed the refinement predictor instead of the in-memory arrays
    source: RowSource | None = None
    devices: DeviceConfig | None = None
    #: the bundle's cost profile (kinds priced in ms need one: ``needs_cost_profile``)
    cost_profile: CostProfile | None = None
    #: the traces' columns as read (prompt text included): kinds that read text use it
    table: pa.Table | None = None
    #: a folder that outlives the trained modules until the bundle is saved (files a module
    #: writes at training, e.g. an ONNX file, live here meanwhile)
    workdir: Path | None = None

    def config(self, kind: str) -> Any:
        """The config given for ``kind`` (None: its trainer uses its default)."""
        return self.configs.get(kind)


@dataclass
class TrainedPart:
    """What one kind's trainer returns: the bundle module, and facts for the manifest's
    ``training[kind]`` (e.g. DWS's stage timings). ``module`` is None only in a process of a
    multi-process run that does not write the bundle (global rank > 0)."""

    module: BundleModule | None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KindTrainer:
    """How ``dwise-predict train`` builds one kind (named by the kind class's ``trainer``).

    ``train(arrays, settings)`` runs in every process of a multi-process run (DDP needs them
    all) and returns a :class:`TrainedPart`. The flags tell the pipeline what to read first.
    """

    train: Callable[[TraceArrays, TrainSettings], TrainedPart]
    #: reads ``first_round_hidden`` (the traces must carry it)
    needs_hidden: bool = False
    #: priced in ms: trained only with a cost profile, and by default whenever one is given
    needs_cost_profile: bool = False
    #: reads the prompt text (``settings.table``): streaming then reads every small column
    reads_text: bool = False


def trainer_for(kind: str) -> KindTrainer:
    """The :class:`KindTrainer` that ``kind`` names; refused when the kind has none."""
    trainer = hook(kind, "trainer")
    if trainer is None:
        raise ConfigError(
            f"predictor kind {kind!r} has no trainer; train one of {trainable()} (--only)"
        )
    if not isinstance(trainer, KindTrainer):
        raise ConfigError(
            f"the trainer of kind {kind!r} is a {type(trainer).__name__}, not a KindTrainer; "
            "fix its class's `trainer`"
        )
    return trainer


def trainable() -> list[str]:
    """Every known kind that names a trainer, in card order."""
    return with_hook("trainer")
