"""A bundle's cost profile: read it on load, and write a re-profiled revision of a bundle.

Why its own small module: the cost profile is the one part of a bundle that belongs to the
*deployment*, not to the trained predictors. Re-profiling (new GPU, new thread count, new
kernels) replaces ``cost_profile.json`` and the manifest entries that describe it, and
nothing else: the predictor files stay byte-identical, so nothing is retrained.

Manifest entry (``manifest["cost_profile"]``): ``file`` (always ``cost_profile.json``,
hashed in ``files`` like every other file), ``revision`` (1 for the first profile, +1 per
re-profiling), ``hardware`` and ``cv`` copied from the profile for the model card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..cost import COST_PROFILE_FILE, CostProfile
from ..errors import BundleIntegrityError, ConfigError
from ..fingerprint import ModelFingerprint

MANIFEST_KEY = "cost_profile"


def load_manifest_cost_profile(path: Path, manifest: dict[str, Any]) -> CostProfile | None:
    """The profile a verified bundle's manifest names, or None when it has none."""
    entry = manifest.get(MANIFEST_KEY)
    if not entry:
        return None
    name = entry.get("file") if isinstance(entry, dict) else None
    if name != COST_PROFILE_FILE or name not in (manifest.get("files") or {}):
        raise BundleIntegrityError(f"{path}: the manifest's cost_profile entry names {name!r}, "
                                   f"which has no sha256 in the manifest; re-profile the bundle")
    try:
        return CostProfile.load(path / COST_PROFILE_FILE)
    except ConfigError as e:
        raise BundleIntegrityError(f"{path}/{COST_PROFILE_FILE} is invalid ({e})") from e


def write_bundle_cost_profile(ref: str | Path, profile: CostProfile, *,
                              out: str | Path | None = None,
                              allow_mismatch: bool = False) -> Path:
    """Write a new revision of bundle ``ref`` holding ``profile``; returns its folder.

    Refuses a profile measured for another dLLM, block size or decoder (unless
    ``allow_mismatch``). The update is atomic: on any error the bundle is left as it was."""
    from .update import update_bundle

    with update_bundle(ref, out=out) as draft:
        fingerprint: ModelFingerprint = draft.source.fingerprint
        if not allow_mismatch:
            profile.check_compatible(fingerprint)
        profile.save(draft.path(COST_PROFILE_FILE))
        previous = draft.manifest.get(MANIFEST_KEY) or {}
        draft.manifest[MANIFEST_KEY] = {
            "file": COST_PROFILE_FILE,
            "revision": int(previous.get("revision", 0)) + 1,
            "hardware": profile.hardware,
            "cv": profile.cv,
            "n_blocks": profile.n_blocks,
            "max_steps": profile.max_steps,
        }
        return draft.destination
