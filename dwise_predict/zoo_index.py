"""The zoo index: names of published predictor bundles -> where they live and which dLLM they fit.

Like timm's pretrained configs, the table of artifacts (``zoo_index.json``, shipped with the core)
is kept apart from any code, so publishing a bundle is a data change and code never hard-codes a
repository or URL. A name is ``MODEL`` (its default tag) or ``MODEL.TAG``; each entry records the
Hub repository and the *pinned* revision (a tag or commit, so a name keeps meaning the same bytes),
the dLLM fingerprint the bundle was trained for (so a caller can refuse a mismatch before
downloading anything) and, optionally, the installed package that carries a copy of the bundle
(``shipped_in``), which makes the name loadable offline.

The index lives in the core and the binaries do not: like spaCy's model packages, the reference
model's weights and bundles ship in their own distribution (``dwise-predict-zoo``, built from
``zoo/``), so a scheduler process that only predicts installs a small wheel. The index names
that distribution, so a missing copy is reported with the exact install command.

Light on purpose: json + the core only (no torch), importable by a scheduler process.
See ``docs/zoo.md``.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from dwise_predict.bundle.format import MANIFEST
from dwise_predict.errors import ConfigError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.hub import HF_SCHEME, parse_hub_ref

INDEX_FORMAT = "dwise-predict-zoo"
INDEX_FORMAT_VERSION = 1
#: the index shipped with the core; ``local_path`` entries are relative to its folder
INDEX_PATH = Path(__file__).with_name("zoo_index.json")


@dataclass(frozen=True)
class Shipment:
    """Where an installed distribution carries a zoo artifact: ``path`` inside ``package``."""

    package: str
    path: str
    distribution: str

    def folder(self) -> Path | None:
        """The artifact's folder when ``package`` is installed, else None (nothing imported:
        only the package's location is looked up)."""
        try:
            spec = importlib.util.find_spec(self.package)
        except (ImportError, ValueError):  # a parent package is missing
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        return Path(next(iter(spec.submodule_search_locations))) / self.path

    def install_hint(self) -> str:
        return (
            f"pip install {self.distribution} (from a checkout of dwise-predict, "
            f"`pip install -e .` includes zoo/)"
        )


@dataclass(frozen=True)
class ZooEntry:
    """One published bundle: ``name`` is ``model.tag``."""

    name: str
    model: str
    tag: str
    repo_id: str
    revision: str
    fingerprint: dict[str, Any]
    is_default: bool = False
    description: str = ""
    local_path: Path | None = None
    shipped_in: Shipment | None = None

    @property
    def hub_ref(self) -> str:
        """``hf://ORG/NAME@REVISION``: what :func:`dwise_predict.hub.pull_bundle` takes."""
        return f"{HF_SCHEME}{self.repo_id}@{self.revision}"

    def model_fingerprint(self) -> ModelFingerprint:
        return ModelFingerprint.from_dict(self.fingerprint)

    def local_bundle(self) -> Path | None:
        """The bundle folder an installed package carries, or None when this install does not."""
        for folder in (self.local_path, self.shipped_in.folder() if self.shipped_in else None):
            if folder is not None and (folder / MANIFEST).is_file():
                return folder
        return None


@dataclass(frozen=True)
class ZooIndex:
    """The parsed index: every entry by full name, and each model's default entry."""

    entries: dict[str, ZooEntry]
    defaults: dict[str, str]
    source: Path
    #: each model's weights, when a distribution ships them (``tiny-bd`` -> dwise-predict-zoo)
    weights: dict[str, Shipment] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def resolve(self, name: str) -> ZooEntry:
        key = name.strip() if isinstance(name, str) else name
        if key in self.defaults:
            return self.entries[self.defaults[key]]
        if key in self.entries:
            return self.entries[key]
        listing = ", ".join(
            f"{n} (default)" if self.entries[n].is_default else n for n in self.names()
        )
        raise ConfigError(
            f"unknown zoo name {name!r}; known: {listing}. Pass one of these, a bundle folder, or "
            "'hf://ORG/NAME@REVISION'"
        )


def load_index(path: str | Path | None = None) -> ZooIndex:
    """Read and validate a zoo index (the packaged one by default)."""
    source = Path(path) if path is not None else INDEX_PATH
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise ConfigError(f"zoo index {source} does not exist; reinstall dwise-predict") from e
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"zoo index {source} is not valid JSON ({e}); restore it from the package"
        ) from e
    where = f"zoo index {source}"
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise ConfigError(f"{where} is not a {INDEX_FORMAT} file (format={_get(data, 'format')!r})")
    version = data.get("format_version")
    if not isinstance(version, int) or version > INDEX_FORMAT_VERSION:
        raise ConfigError(
            f"{where} has format_version {version!r}; this dwise-predict reads up to "
            f"{INDEX_FORMAT_VERSION}: upgrade dwise-predict"
        )
    models = data.get("models")
    if not isinstance(models, dict) or not models:
        raise ConfigError(f"{where} lists no models")
    entries: dict[str, ZooEntry] = {}
    defaults: dict[str, str] = {}
    weights: dict[str, Shipment] = {}
    for model, spec in sorted(models.items()):
        _check_name(model, where)
        tags = _get(spec, "tags")
        default = _get(spec, "default_tag")
        if not isinstance(tags, dict) or not tags:
            raise ConfigError(f"{where}: model {model!r} has no tags")
        if default not in tags:
            raise ConfigError(
                f"{where}: model {model!r} default_tag "
                f"{default!r} is not one of its tags {sorted(tags)}"
            )
        for tag, t in sorted(tags.items()):
            _check_name(tag, where)
            full = f"{model}.{tag}"
            entries[full] = _entry(full, model, tag, t, tag == default, source.parent, where)
        defaults[model] = f"{model}.{default}"
        if isinstance(spec, dict) and spec.get("weights") is not None:
            weights[model] = _shipment(spec["weights"], f"{where}: model {model!r} weights")
    return ZooIndex(entries, defaults, source, weights)


def resolve(name: str, *, index: ZooIndex | None = None) -> ZooEntry:
    """``"tiny-bd"`` (default tag) or ``"tiny-bd.tau095"`` -> :class:`ZooEntry`; unknown ->
    ConfigError listing names."""
    return (index or load_index()).resolve(name)


def find(name: str, *, index: ZooIndex | None = None) -> ZooEntry | None:
    """Like :func:`resolve` but None for an unknown name (for callers that try a path next)."""
    idx = index or load_index()
    key = name.strip()
    if key in idx.defaults or key in idx.entries:
        return idx.resolve(key)
    return None


def list_models(pattern: str | None = None, *, index: ZooIndex | None = None) -> list[str]:
    """Full names (``model.tag``), sorted; ``pattern`` is a shell glob like ``"tiny-*"``."""
    names = (index or load_index()).names()
    return [n for n in names if pattern is None or fnmatch.fnmatchcase(n, pattern)]


def model_weights(model: str, *, index: ZooIndex | None = None) -> Path | None:
    """The installed weights folder of a zoo dLLM (``"tiny-bd"``), or None when ``model`` is not
    a zoo model. A zoo model whose distribution is not installed is an error naming the install
    command, so ``--model tiny-bd`` never falls through to a confusing path lookup."""
    shipment = (index or load_index()).weights.get(model)
    if shipment is None:
        return None
    folder = shipment.folder()
    if folder is None or not folder.is_dir():
        raise ConfigError(
            f"the {model} weights ship in the {shipment.distribution} distribution, which is "
            f"not installed: {shipment.install_hint()}"
        )
    return folder


def _shipment(spec: Any, where: str) -> Shipment:
    keys = ("package", "path", "distribution")
    if not isinstance(spec, dict) or any(not isinstance(spec.get(k), str) for k in keys):
        raise ConfigError(f"{where} must be an object with string fields {', '.join(keys)}")
    p = PurePosixPath(spec["path"])
    if p.is_absolute() or ".." in p.parts:
        raise ConfigError(f"{where}: path {spec['path']!r} must be relative to its package")
    return Shipment(spec["package"], spec["path"], spec["distribution"])


def _entry(
    full: str, model: str, tag: str, t: Any, is_default: bool, base: Path, where: str
) -> ZooEntry:
    if not isinstance(t, dict):
        raise ConfigError(f"{where}: {full} must be an object")
    missing = [k for k in ("repo_id", "revision", "fingerprint") if not t.get(k)]
    if missing:
        raise ConfigError(f"{where}: {full} lacks {', '.join(missing)}")
    ref = parse_hub_ref(str(t["repo_id"]))
    if ref.revision is not None:
        raise ConfigError(
            f"{where}: {full} repo_id {t['repo_id']!r} must not contain '@'; use the revision field"
        )
    fingerprint = t["fingerprint"]
    if not isinstance(fingerprint, dict):
        raise ConfigError(f"{where}: {full} fingerprint must be an object")
    try:
        ModelFingerprint.from_dict(fingerprint)
    except TypeError as e:
        raise ConfigError(
            f"{where}: {full} fingerprint is incomplete ({e}); it needs model_id, block_size, "
            "threshold"
        ) from e
    local = t.get("local_path")
    local_path = None
    if local is not None:
        p = PurePosixPath(str(local))
        if p.is_absolute() or ".." in p.parts:
            raise ConfigError(
                f"{where}: {full} local_path {local!r} must be relative to the index folder"
            )
        local_path = base / p
    shipped = t.get("shipped_in")
    shipped_in = _shipment(shipped, f"{where}: {full} shipped_in") if shipped else None
    return ZooEntry(
        name=full,
        model=model,
        tag=tag,
        repo_id=ref.repo_id,
        revision=str(t["revision"]),
        fingerprint=dict(fingerprint),
        is_default=is_default,
        description=str(t.get("description", "")),
        local_path=local_path,
        shipped_in=shipped_in,
    )


def _check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name or "." in name or "/" in name or name != name.strip():
        raise ConfigError(
            f"{where}: {name!r} is not a valid zoo model or tag name (no '.', '/' or spaces)"
        )


def _get(d: Any, key: str) -> Any:
    return d.get(key) if isinstance(d, dict) else None
