"""The types of a kind's hooks: what its ``trainer``, ``onnx_exporter`` and ``evaluator`` name.

Why here, next to the registry: :func:`~.modules.hook` imports a hook lazily (the core never
imports trainers or exporters) and then checks it against the Protocol of its hook name, so a
kind that names the wrong object is refused where it is named, with the fix, instead of failing
deep inside ``dwise-predict train``; and mypy follows a hook from the registry to its caller.

The arrays a trainer and an evaluator read (``dwise_predict.trainers.dataset.TraceArrays``) and
the settings a trainer is given (``dwise_predict.trainers.kind.TrainSettings``) live in the
training layer, which the core may not import; the Protocols take them as type parameters, and
the training layer binds them (``trainers.kind.trainer_for`` and ``evaluator_for``). Nothing
here imports anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from .bundle import Bundle
    from .modules import BundleModule

#: the per-request arrays a trainer or an evaluator reads (bound to ``TraceArrays``)
ArraysT = TypeVar("ArraysT", contravariant=True)
#: what a trainer is given besides the arrays (bound to ``TrainSettings``)
SettingsT = TypeVar("SettingsT", contravariant=True)

#: estimate name -> (predicted, actual), one pair per name in the kind's ``estimates``
Estimates = dict[str, tuple[np.ndarray, np.ndarray]]


@dataclass
class TrainedPart:
    """What one kind's trainer returns: the bundle module, and facts for the manifest's
    ``training[kind]`` (e.g. DWS's stage timings). ``module`` is None only in a process of a
    multi-process run that does not write the bundle (global rank > 0)."""

    module: BundleModule | None
    info: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Trainer(Protocol[ArraysT, SettingsT]):
    """A kind's ``trainer``: how ``dwise-predict train`` builds it (``trainers.kind.KindTrainer``
    is the shipped implementation).

    ``train(arrays, settings)`` runs in every process of a multi-process run (DDP needs them
    all). The flags tell the pipeline what to read first; ``config_type`` is the class of the
    kind's training config (``train_bundle(configs={kind: config})`` is refused for any other).
    """

    @property
    def config_type(self) -> type | None: ...

    @property
    def needs_hidden(self) -> bool: ...

    @property
    def needs_cost_profile(self) -> bool: ...

    @property
    def reads_text(self) -> bool: ...

    def train(self, arrays: ArraysT, settings: SettingsT, /) -> TrainedPart: ...


@runtime_checkable
class Evaluator(Protocol[ArraysT]):
    """A kind's ``evaluator``: its estimates on trace arrays next to what they estimate
    (``dwise-predict eval``), one pair per name in the kind's ``estimates``."""

    def __call__(self, bundle: Bundle, arrays: ArraysT, /) -> Estimates: ...


@runtime_checkable
class Exporter(Protocol):
    """A kind's ``onnx_exporter``: the ONNX file it is exported to.

    Two shapes implement it (``dwise_predict.export``): ``parity.OnnxExporter`` writes and gates
    the file from a bundled predictor (``write`` and ``check``), and an exporter with
    ``export_into`` (``bundle_export.BundleExporter``) reports files written at training, from
    a model the bundle does not hold (DWS's). ``export_bundle`` tells them apart.
    """

    @property
    def file(self) -> str: ...


#: hook name -> the Protocol what it names must follow (:func:`~.modules.hook` checks it)
HOOK_TYPES: dict[str, type] = {
    "trainer": Trainer,
    "onnx_exporter": Exporter,
    "evaluator": Evaluator,
}
