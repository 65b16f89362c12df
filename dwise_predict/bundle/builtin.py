"""The predictor kinds this library ships: one line per kind, in card order.

Each line registers the kind (:func:`~.modules.register`) and gives :class:`~.bundle.Bundle` a
typed shortcut to it (``bundle.admission`` is ``bundle.module(AdmissionModel)``), so the plugin
and the CLI read the shipped kinds with their types and mypy follows them. A kind added later
needs no line here: ``bundle.module(MyKind)`` / ``bundle.need(MyKind)`` are the same typed
lookup for every kind (docs/bundle-format.md, "Adding a predictor kind").
"""

from __future__ import annotations

from typing import Generic, Protocol, overload

from ..cost import CostProfile
from ..predictors.admission import AdmissionModel
from ..predictors.baselines import LTRPredictor, S3Predictor, SSJFPredictor, TRAILPredictor
from ..predictors.dws import DWSPredictor
from ..predictors.refinement import RefinementEnsemble
from .modules import M, register


class HasModules(Protocol):
    """What a kind accessor reads: a bundle's typed lookup by module class."""

    def module(self, cls: type[M]) -> M | None: ...


class KindAccessor(Generic[M]):
    """A read-only attribute holding a bundle's module of one kind, or None when it has none."""

    def __init__(self, cls: type[M]) -> None:
        self.cls = cls
        self.__doc__ = f"The bundle's {cls.kind} predictor ({cls.__name__}), None when it has none."

    @overload
    def __get__(self, bundle: None, owner: type) -> KindAccessor[M]: ...
    @overload
    def __get__(self, bundle: HasModules, owner: type) -> M | None: ...
    def __get__(self, bundle: HasModules | None, owner: type) -> KindAccessor[M] | M | None:
        return self if bundle is None else bundle.module(self.cls)

    def __set__(self, bundle: HasModules, value: object) -> None:
        raise AttributeError(
            f"a bundle's {self.cls.kind} predictor is read from its modules; build another "
            "bundle instead (dataclasses.replace(bundle, modules=...))"
        )


def shipped(cls: type[M]) -> KindAccessor[M]:
    """Register ``cls`` and return its accessor (a class attribute of :class:`ShippedKinds`)."""
    return KindAccessor(register(cls))


class ShippedKinds:
    """The shipped kinds, registered in this order (the card's), as typed bundle attributes."""

    admission = shipped(AdmissionModel)
    refinement = shipped(RefinementEnsemble)
    #: the deployment's cost factors (``dwise-predict profile --bundle``), None until then
    cost_profile = shipped(CostProfile)
    dws = shipped(DWSPredictor)
    #: the learned output-length schedulers the paper compares with (docs/baselines.md); trained
    #: only when named (``train --only ...,ssjf,s3,ltr,trail``)
    ssjf = shipped(SSJFPredictor)
    s3 = shipped(S3Predictor)
    ltr = shipped(LTRPredictor)
    trail = shipped(TRAILPredictor)
