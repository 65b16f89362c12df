"""What a predictor kind's trainer is, and what every trainer is given.

Why here: the one registry of kinds is :mod:`dwise_predict.bundle.modules`; a kind's class
names its trainer there as ``trainer = "module:ATTRIBUTE"``, pointing at a :class:`KindTrainer`
beside the kind's training code (``trainers/admission.py:TRAINER`` and so on). The pipeline
(:mod:`.pipeline`) asks the registry which kinds can be trained, what each needs and which
config class each takes, so a new kind trains without any change to the pipeline.

The core types the hooks as Protocols (:mod:`dwise_predict.bundle.hooks`) over data types it
may not name; :func:`trainer_for` and :func:`evaluator_for` bind them to ``TraceArrays`` and
:class:`TrainSettings`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

from dwise_predict.bundle.hooks import Evaluator, TrainedPart, Trainer
from dwise_predict.bundle.modules import hook, with_hook
from dwise_predict.errors import ConfigError

if TYPE_CHECKING:
    import pyarrow as pa

    from dwise_predict.cost import CostProfile
    from dwise_predict.features import PromptFeaturizer

    from .dataset import TraceArrays
    from .devices import DeviceConfig
    from .streaming import RowSource

__all__ = [
    "KindTrainer",
    "TrainSettings",
    "TrainedPart",
    "check_configs",
    "evaluator_for",
    "trainable",
    "trainer_for",
]

C = TypeVar("C")


@dataclass(frozen=True)
class TrainSettings:
    """What every kind's trainer may use: the seed, the featurizer, per-kind configs, where to
    run, and the inputs some kinds read besides the trace arrays."""

    seed: int = 0
    featurizer: PromptFeaturizer | None = None
    #: kind -> that kind's training config, of its trainer's ``config_type`` (e.g. an
    #: ``AdmissionConfig``); absent = its default
    configs: Mapping[str, object] = field(default_factory=dict)
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

    def config(self, kind: str, config_type: type[C]) -> C:
        """The config given for ``kind``, else ``config_type()`` (the kind's default); a config
        of another class is refused, naming the one expected."""
        given = self.configs.get(kind)
        if given is None:
            return config_type()
        if not isinstance(given, config_type):
            raise ConfigError(_wrong_config(kind, given, config_type))
        return given


def _wrong_config(kind: str, given: object, expected: type) -> str:
    return (
        f"the {kind} predictor is trained with a {expected.__module__}.{expected.__name__}, "
        f"got a {type(given).__name__}; pass configs={{{kind!r}: {expected.__name__}(...)}}"
    )


@dataclass(frozen=True)
class KindTrainer:
    """How ``dwise-predict train`` builds one kind (named by the kind class's ``trainer``): the
    shipped implementation of :class:`dwise_predict.bundle.hooks.Trainer`.

    ``train(arrays, settings)`` runs in every process of a multi-process run (DDP needs them
    all) and returns a :class:`TrainedPart`. The flags tell the pipeline what to read first.
    """

    train: Callable[[TraceArrays, TrainSettings], TrainedPart]
    #: the class of the kind's training config (``TrainSettings.config`` and ``train_bundle``
    #: refuse any other); None: the kind takes no config
    config_type: type | None = None
    #: reads ``first_round_hidden`` (the traces must carry it)
    needs_hidden: bool = False
    #: priced in ms: trained only with a cost profile, and by default whenever one is given
    needs_cost_profile: bool = False
    #: reads the prompt text (``settings.table``): streaming then reads every small column
    reads_text: bool = False
    #: trained only when named (``--only``), never by default: the output-length baselines a
    #: bundle is compared with (docs/baselines.md), not predictors a scheduler needs
    only_when_named: bool = False


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


def evaluator_for(kind: str) -> Evaluator[TraceArrays] | None:
    """The evaluator ``kind`` names (checked by the registry), or None when it names none."""
    # the registry checked it is an Evaluator; what it reads are the trainers' TraceArrays
    return cast("Evaluator[TraceArrays] | None", hook(kind, "evaluator"))


def check_configs(configs: Mapping[str, object]) -> None:
    """Refuse, before anything trains, a config for a kind that cannot be trained, or of
    another class than its trainer's ``config_type``. (A config for a trainable kind left out
    of ``--only`` is fine: it is not used.)"""
    known = trainable()
    for kind, config in configs.items():
        if kind not in known:
            raise ConfigError(
                f"a training config was given for {kind!r}, which is not a trainable "
                f"predictor kind; key configs by one of {known}"
            )
        expected = trainer_for(kind).config_type
        if expected is None:
            raise ConfigError(f"the {kind} predictor takes no training config; drop it")
        if not isinstance(config, expected):
            raise ConfigError(_wrong_config(kind, config, expected))


def trainable() -> list[str]:
    """Every known kind that names a trainer, in card order."""
    return with_hook("trainer")


if TYPE_CHECKING:

    def _is_a_trainer(t: KindTrainer) -> Trainer[TraceArrays, TrainSettings]:
        """mypy's proof that :class:`KindTrainer` follows the core's ``Trainer`` Protocol."""
        return t
