"""Where a bundle reference points: one entry point for local, Hub and named bundles.

``load_bundle`` accepts, like ``SentenceTransformer(path_or_hub_id)`` or timm's
``create_model("hf-hub:...")``:

* a local folder written by ``dwise-predict train`` / ``save_bundle``;
* ``"hf://ORG/NAME@REVISION"``: a snapshot downloaded (or read from the local Hugging Face
  cache, offline too) through huggingface_hub;
* a zoo name such as ``"tiny-bd"`` or ``"tiny-bd.tau095"``: looked up in the zoo index
  (:mod:`dwise_predict.zoo_index`, a light data module), served from the copy an installed zoo
  distribution carries when there is one, else pulled from its pinned Hub repo and revision.

Every form returns a local folder, and the caller verifies it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BundleError
from ..fingerprint import ModelFingerprint
from ..hub import HF_SCHEME
from ..zoo_index import ZooEntry, find
from .format import MANIFEST


@dataclass(frozen=True)
class ResolvedBundle:
    """A local bundle folder, and the fingerprint a zoo entry promises for it (None otherwise)."""

    path: Path
    expected_fingerprint: ModelFingerprint | None = None
    source: str = "local"


def resolve_bundle(ref: str | Path) -> ResolvedBundle:
    """Map a bundle reference to a local folder (downloading from the Hub when needed)."""
    if isinstance(ref, str) and ref.startswith(HF_SCHEME):
        from ..hub import pull_bundle

        return ResolvedBundle(_check_folder(pull_bundle(ref), ref), source="hub")
    path = Path(ref).expanduser()
    if not path.exists() and isinstance(ref, str) and _looks_like_name(ref):
        entry = find(ref)
        if entry is not None:
            local = entry.local_bundle()
            if local is None:
                local = _pull_zoo_bundle(entry)
            return ResolvedBundle(
                _check_folder(Path(local), ref), entry.model_fingerprint(), source="zoo"
            )
    return ResolvedBundle(_check_folder(path, ref))


def resolve_bundle_path(ref: str | Path) -> Path:
    """The local folder ``ref`` stands for (see :func:`resolve_bundle`)."""
    return resolve_bundle(ref).path


def _looks_like_name(ref: str) -> bool:
    return "/" not in ref and "\\" not in ref and not ref.startswith(".")


def _pull_zoo_bundle(entry: ZooEntry) -> Path:
    """A zoo bundle no installed distribution carries, from its pinned Hub revision. When that
    fails too (offline, say), the error names both ways to get it."""
    from ..hub import HubError, pull_bundle

    try:
        return pull_bundle(entry.hub_ref)
    except HubError as e:
        if entry.shipped_in is None:
            raise
        raise BundleError(
            f"zoo bundle {entry.name!r} is not installed and could not be pulled from "
            f"{entry.hub_ref} ({e}). It ships in the {entry.shipped_in.distribution} "
            f"distribution: {entry.shipped_in.install_hint()}"
        ) from e


def _check_folder(path: Path, ref: str | Path) -> Path:
    if not path.exists():
        raise BundleError(
            f"bundle {str(ref)!r} does not exist; pass the folder `dwise-predict train --out` "
            "wrote, a zoo name (see docs/zoo.md) or hf://ORG/NAME@REVISION"
        )
    if not path.is_dir():
        raise BundleError(f"bundle {str(ref)!r} is a file; a bundle is a folder with {MANIFEST}")
    if not (path / MANIFEST).is_file():
        raise BundleError(f"{path} has no {MANIFEST}; it is not a dwise-predict bundle")
    return path
