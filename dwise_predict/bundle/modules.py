"""Bundle modules: the protocol a bundle part follows, and the registry keyed by its kind.

Why: a bundle is a folder of declared parts (an admission predictor, a refinement predictor, and
whatever comes next). The manifest names each part by its ``kind`` under ``predictors``; saving,
loading, the model card, a recorded evaluation, ONNX export and training all iterate over those
entries and ask the registered class, so adding a kind is one new module plus one
:func:`register` line, and no bundle code changes (``docs/bundle-format.md``, "Adding a
predictor kind").

A module class provides (see :class:`BundleModule`):

* ``kind``: its registry key and its key under ``manifest["predictors"]`` (one per bundle);
* ``estimates``: estimate name -> what an evaluation compares it with (the card's and
  ``eval --record``'s metric rows);
* ``save(folder) -> files`` and ``entry()`` (the JSON facts the manifest keeps about it);
* ``load(folder, entry)``, reading only the files the manifest lists (:class:`BundleFolder`);
* ``card_summary(entry, manifest)``: the "model" cell of the card's predictor table;
* optionally ``check_fingerprint(fingerprint, where)``: refuse a part inconsistent with the
  bundle's dLLM fingerprint.

The heavy parts of a kind are named, never imported, by ``"module:ATTRIBUTE"`` strings on the
class (:data:`HOOKS`; each optional, ``None`` or absent when the kind has none), so the core
depends on nothing heavy while training, export and evaluation find everything a kind needs
through this registry (:func:`hook`):

* ``trainer``: a :class:`~.hooks.Trainer`, e.g. a ``dwise_predict.trainers.kind.KindTrainer``
  (``dwise-predict train``);
* ``onnx_exporter``: an :class:`~.hooks.Exporter` in :mod:`dwise_predict.export`
  (``dwise-predict export``);
* ``evaluator``: an :class:`~.hooks.Evaluator`, ``(bundle, arrays) -> {estimate: (predicted,
  actual)}`` over trace arrays (``dwise-predict eval``; one pair per name in ``estimates``).

:func:`hook` checks what it imports against that Protocol (:data:`~.hooks.HOOK_TYPES`).

And one plain name: ``monitor_label``, the ``estimate`` label under which the SGLang plugin's
quality monitor (and its Prometheus gauges) tracks this kind's total-rounds estimate.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, TypeVar, overload, runtime_checkable

from ..errors import BundleIntegrityError, BundleVersionError, ConfigError, MissingDependencyError
from ..fingerprint import ModelFingerprint
from .hooks import HOOK_TYPES, Evaluator, Exporter, Trainer

M = TypeVar("M", bound="BundleModule")


@dataclass(frozen=True)
class BundleFolder:
    """A verified bundle folder, as a module's ``load`` sees it: only listed files can be opened.

    Every file the manifest lists was size- and sha256-checked before any module loads;
    :meth:`path` refuses a name the manifest does not list, so a module cannot read an
    unverified file by mistake.
    """

    root: Path
    listed: frozenset[str]

    def path(self, name: str) -> Path:
        """The path of listed file ``name``; refused when the manifest does not list it."""
        if name not in self.listed:
            raise BundleIntegrityError(
                f"{self.root}: {name} has no sha256 in the manifest; re-save the bundle"
            )
        return self.root / name

    def has(self, name: str) -> bool:
        return name in self.listed

    def read_text(self, name: str) -> str:
        try:
            return self.path(name).read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise BundleIntegrityError(
                f"{self.root}/{name} is not UTF-8 text ({e}); re-save the bundle"
            ) from e

    def read_json(self, name: str) -> dict[str, Any]:
        """A listed JSON object file, refused with the fix when it is not one."""
        try:
            data = json.loads(self.read_text(name))
        except ValueError as e:
            raise BundleIntegrityError(
                f"{self.root}/{name} is not valid JSON ({e}); re-save the bundle"
            ) from e
        if not isinstance(data, dict):
            raise BundleIntegrityError(
                f"{self.root}/{name} is not a JSON object; re-save the bundle"
            )
        return data


@runtime_checkable
class BundleModule(Protocol):
    """One declared part of a bundle; see the module docstring for what each member is for."""

    kind: ClassVar[str]
    estimates: ClassVar[Mapping[str, str]]
    onnx_exporter: ClassVar[str | None]

    def save(self, folder: Path) -> list[str]:
        """Write this part's files into ``folder`` (atomically); return their names."""
        ...

    def entry(self) -> dict[str, Any]:
        """JSON facts the manifest keeps about this part (for the card and for ``load``)."""
        ...

    @classmethod
    def load(cls: type[M], folder: BundleFolder, entry: Mapping[str, Any]) -> M:
        """Rebuild the part from its listed files and its manifest ``entry``."""
        ...

    @classmethod
    def card_summary(cls, entry: Mapping[str, Any], manifest: Mapping[str, Any]) -> str:
        """One line for the card's predictor table: what model this is, its size."""
        ...

    def check_fingerprint(self, fingerprint: ModelFingerprint, where: str) -> None:
        """Refuse a part that contradicts the bundle's fingerprint (e.g. another hidden size)."""
        ...


_REGISTRY: dict[str, type[BundleModule]] = {}

#: the class attributes that name a kind's heavy parts as ``"module:ATTRIBUTE"``
HOOKS = ("trainer", "onnx_exporter", "evaluator")


def register(cls: type[M]) -> type[M]:
    """Make ``cls`` known by its ``kind`` (usable as a class decorator). Re-registering the same
    class is a no-op; another class under a taken kind is refused."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"{cls.__name__} has no `kind` string; give the module class a kind")
    taken = _REGISTRY.get(kind)
    if taken is not None and taken is not cls:
        raise ConfigError(
            f"bundle module kind {kind!r} is already registered by {taken.__name__}; "
            "choose another kind"
        )
    _REGISTRY[kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Forget ``kind`` (for tests and plug-ins that register a kind for a while)."""
    _REGISTRY.pop(kind, None)


def _ensure_builtin() -> None:
    from . import builtin  # noqa: F401 - registers the shipped kinds on import


def module_class(kind: str, where: str = "this bundle") -> type[BundleModule]:
    """The class registered for ``kind``; a kind this library does not know is refused."""
    _ensure_builtin()
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise BundleVersionError(
            f"{where} holds a predictor of kind {kind!r}, which this dwise-predict does not know "
            f"(it knows {sorted(_REGISTRY)}); a newer dwise-predict wrote it: upgrade "
            "(pip install -U dwise-predict)"
        )
    return cls


def registered() -> dict[str, type[BundleModule]]:
    """Every known kind, in registration order (the shipped ones first)."""
    _ensure_builtin()
    return dict(_REGISTRY)


def all_estimates() -> dict[str, str]:
    """Estimate name -> what an evaluation compares it with, over every known kind."""
    return {name: what for cls in registered().values() for name, what in cls.estimates.items()}


def estimate_owner(estimate: str) -> str | None:
    """The kind whose predictor produces ``estimate`` (None when no known kind does)."""
    return next((k for k, cls in registered().items() if estimate in cls.estimates), None)


def declared(manifest: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(kind, entry)`` of every part the manifest declares, in manifest order."""
    parts = manifest.get("predictors") or {}
    if not isinstance(parts, Mapping):
        raise BundleIntegrityError(
            "the manifest's 'predictors' is not a table; the bundle is corrupt"
        )
    for kind, entry in parts.items():
        if not isinstance(entry, Mapping):
            raise BundleIntegrityError(
                f"the manifest entry of {kind!r} is not a table; the bundle is corrupt"
            )
        yield kind, entry


@overload
def hook(cls: type[BundleModule] | str, name: Literal["trainer"]) -> Trainer[Any, Any] | None: ...
@overload
def hook(cls: type[BundleModule] | str, name: Literal["evaluator"]) -> Evaluator[Any] | None: ...
@overload
def hook(cls: type[BundleModule] | str, name: Literal["onnx_exporter"]) -> Exporter | None: ...
@overload
def hook(cls: type[BundleModule] | str, name: str) -> object | None: ...


def hook(cls: type[BundleModule] | str, name: str) -> object | None:
    """The object a kind names in its hook attribute ``name`` (one of :data:`HOOKS`), imported
    now and checked against the hook's Protocol (:data:`~.hooks.HOOK_TYPES`); ``None`` when the
    kind names none. ``cls`` is the module class or its kind.

    The Protocols leave the trainers' data types open (the core may not import them): the
    training layer binds them (``trainers.kind.trainer_for`` and ``evaluator_for``), which is
    where the ``Any`` of the return types ends.

    A name whose module needs a package that is not installed is refused with
    :class:`MissingDependencyError` (training and export need the ``train`` extra); a name that
    does not resolve at all, or resolves to the wrong kind of object, is the kind's own mistake
    (:class:`ConfigError`).
    """
    if name not in HOOKS:
        raise ConfigError(f"{name!r} is not a bundle module hook; use one of {HOOKS}")
    if isinstance(cls, str):
        cls = module_class(cls)
    ref = getattr(cls, name, None)
    if not ref:
        return None
    found = _import_ref(cls, name, str(ref))
    expected = HOOK_TYPES[name]
    if not isinstance(found, expected):
        raise ConfigError(
            f"{cls.__name__}.{name} names {ref!r}, a {type(found).__name__}, which is not a "
            f"{expected.__module__}.{expected.__name__}; point it at one (see "
            "docs/bundle-format.md, 'Adding a predictor kind')"
        )
    return found


def _import_ref(cls: type[BundleModule], name: str, ref: str) -> object:
    """Import ``"package.module:ATTRIBUTE"`` named by ``cls.<name>``, refusing with the fix."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{cls.__name__}.{name} is {ref!r}; write it as 'package.module:ATTRIBUTE'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        missing = getattr(e, "name", None) or ""
        if missing and missing != module_name:  # a package the named module needs
            raise MissingDependencyError(
                f"the {cls.kind} predictor's {name} ({ref}) needs {missing!r}, which is not "
                f"installed ({e}); pip install 'dwise-predict[train]'"
            ) from e
        raise ConfigError(
            f"the {cls.kind} predictor names its {name} {ref!r}, which cannot be imported "
            f"({e}); fix {cls.__name__}.{name}"
        ) from e
    try:
        found: object = getattr(module, attr)
    except AttributeError as e:
        raise ConfigError(
            f"{module_name} has no {attr!r}, which {cls.__name__}.{name} names; fix the name"
        ) from e
    return found


def with_hook(name: str) -> list[str]:
    """The known kinds that name a ``name`` hook (e.g. every trainable kind), in card order."""
    return [kind for kind, cls in registered().items() if getattr(cls, name, None)]


def monitored() -> dict[str, str]:
    """Monitor label -> kind, for every known kind the quality monitor tracks."""
    return {
        cls.monitor_label: kind  # type: ignore[attr-defined]
        for kind, cls in registered().items()
        if getattr(cls, "monitor_label", None)
    }
