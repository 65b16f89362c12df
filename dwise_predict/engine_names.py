"""The names an engine integration depends on, checked before it starts.

Why: the SGLang plugin and the vLLM scheduler both reach into an engine's internals (classes
to hook or subclass, attributes to read), which no engine promises to keep. Each integration
lists every such name once (its ``seam`` module) and checks them all at start-up, so an engine
upgrade that moves one refuses to start, naming it, instead of failing mid-request. This module
is the checking half both share; what the names are, and the message, stay with each engine.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import pkgutil
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Name:
    """One engine name an integration depends on, and how (e.g. hook, subclass, call, read)."""

    path: str
    use: str
    #: an attribute of instances: declared by the class, not resolvable as a module attribute
    instance: bool = False


def package_version(distribution: str) -> str | None:
    """The installed version of ``distribution`` (None when it is not installed)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def declares(cls: type, attr: str) -> bool:
    """Whether instances of ``cls`` carry ``attr``: a field (dataclass or msgspec), an
    annotation, a class member, or a ``self.<attr> =`` assignment in the class's (or a base
    class's) source."""
    fields = getattr(cls, "__dataclass_fields__", None) or {}
    struct = getattr(cls, "__struct_fields__", ()) or ()
    if attr in fields or attr in struct:
        return True
    for klass in cls.__mro__:
        if klass is object:
            continue
        if attr in getattr(klass, "__annotations__", {}) or attr in vars(klass):
            return True
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        if f"self.{attr} =" in source or f"self.{attr}: " in source:
            return True
    return False


def resolves(name: Name) -> bool:
    """Whether the installed engine provides ``name``."""
    try:
        if name.instance:
            owner, attr = name.path.rsplit(".", 1)
            return declares(pkgutil.resolve_name(owner), attr)
        pkgutil.resolve_name(name.path)
        return True
    except Exception:  # ImportError, AttributeError, ValueError: all mean "not there"
        return False


def missing_names(surface: Iterable[Name]) -> list[str]:
    """The entries of ``surface`` the installed engine does not provide (empty = all there)."""
    return [n.path for n in surface if not resolves(n)]
