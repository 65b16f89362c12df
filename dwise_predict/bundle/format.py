"""Bundle format: names, versions, the v1 migration and the integrity record.

See ``docs/bundle-format.md``.

A bundle is a folder of small declared parts. ``manifest.json`` is the only file read before
anything is verified: it names the format and its version, the library versions that can read
it (PEP 440 specifiers), the dLLM fingerprint, the feature spec, a training summary, metrics and
the sha256 and size of every other file. Nothing in a bundle is ever unpickled.
"""

from __future__ import annotations

import hashlib
from pathlib import Path, PurePosixPath
from typing import Any

from .._version import __version__
from ..errors import BundleError, BundleIntegrityError, BundleVersionError

FORMAT_NAME = "dwise-predict-bundle"
#: v2: each predictor's description lives in its own manifest entry (v1 split it across
#: ``predictors``, ``features`` and a config file); v1 bundles load through :func:`migrate`
FORMAT_VERSION = 2
MANIFEST = "manifest.json"
#: library versions able to read the current format (written into new manifests)
LIBRARY_REQUIREMENT = ">=0.1"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "bytes": path.stat().st_size}


def check_format(manifest: dict[str, Any], where: str) -> None:
    """Refuse a manifest of another format, a newer format version, or an unmet library requirement.

    Runs before any other file of the bundle is opened.
    """
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import Version

    if manifest.get("format") != FORMAT_NAME:
        raise BundleError(
            f"{where} is not a dwise-predict bundle (format={manifest.get('format')!r}); "
            "create one with `dwise-predict train`"
        )
    version = manifest.get("format_version")
    if not isinstance(version, int) or version < 1:
        raise BundleIntegrityError(
            f"{where} has an invalid format_version {version!r}; the manifest is corrupt"
        )
    if version > FORMAT_VERSION:
        raise BundleVersionError(
            f"{where} uses bundle format v{version} but dwise-predict {__version__} reads up to "
            f"v{FORMAT_VERSION}; upgrade dwise-predict (pip install -U dwise-predict)"
        )
    requires = (manifest.get("library") or {}).get("requires", "")
    try:
        spec = SpecifierSet(requires)
    except InvalidSpecifier as e:
        raise BundleIntegrityError(
            f"{where} has an invalid library requirement {requires!r}"
        ) from e
    if not spec.contains(Version(__version__), prereleases=True):
        raise BundleVersionError(
            f"{where} requires dwise-predict{requires} but {__version__} is installed; "
            f"install a matching version (pip install 'dwise-predict{requires}')"
        )


def safe_name(name: str, where: str) -> str:
    p = PurePosixPath(name)
    if not name or p.is_absolute() or ".." in p.parts or "\\" in name:
        raise BundleIntegrityError(
            f"{where} lists an unsafe file name {name!r}; the manifest is corrupt or hostile"
        )
    return name


def verify_files(folder: Path, manifest: dict[str, Any], where: str) -> None:
    """Every file the manifest lists exists, has its recorded size and sha256."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise BundleIntegrityError(
            f"{where}/{MANIFEST} has no 'files' table; the manifest is corrupt"
        )
    for name, rec in sorted(files.items()):
        path = folder / safe_name(name, where)
        if not path.is_file():
            raise BundleIntegrityError(
                f"{where} is missing {name}; re-download or re-save the bundle"
            )
        size = path.stat().st_size
        if size != rec.get("bytes"):
            raise BundleIntegrityError(
                f"{where}/{name} has {size} bytes but the manifest records {rec.get('bytes')} "
                "(truncated or modified); re-download or re-save the bundle"
            )
        if sha256_file(path) != rec.get("sha256"):
            raise BundleIntegrityError(
                f"{where}/{name} does not match its sha256 in the manifest (tampered or "
                "corrupted); re-download or re-save the bundle"
            )


def migrate(manifest: dict[str, Any]) -> dict[str, Any]:
    """A manifest in the current layout; a format v1 manifest is converted in memory.

    v1 kept part of each predictor's description in a separate ``features`` table (and the
    rest in a config file the predictor's loader still reads when its entry lists it), and
    used ``kind`` inside an entry for the model family. v2 keeps one entry per kind under
    ``predictors``: v1's ``features[kind]`` is merged into it and the old ``kind`` field becomes
    ``model``. Nothing on disk changes until the bundle is next updated.
    """
    if manifest.get("format_version") != 1:
        return manifest
    out = {k: v for k, v in manifest.items() if k != "features"}
    features = manifest.get("features") or {}
    predictors = {}
    for kind, entry in (manifest.get("predictors") or {}).items():
        merged = {k: v for k, v in dict(entry).items() if k != "kind"}
        if "kind" in entry:
            merged.setdefault("model", entry["kind"])
        for key, value in dict(features.get(kind) or {}).items():
            merged.setdefault(key, value)
        predictors[kind] = merged
    out["predictors"] = predictors
    out["format_version"] = FORMAT_VERSION
    return out
