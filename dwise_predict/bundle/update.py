"""Update an existing bundle atomically: add, replace or remove files, edit the manifest, re-hash.

Why one helper: exporting ONNX files and recording an evaluation both change a published bundle,
and both must keep the same promise as :func:`save_bundle`: the folder a reader sees is either
the old verified version or the new verified version, never a mix. So every update

1. loads (verifies) the source bundle first, so a damaged bundle is never re-hashed into a
   "valid" one;
2. copies it into a temporary sibling folder (a *draft*) and lets the caller edit the draft;
3. re-renders the model card ``README.md`` from the edited manifest, hashes the files the caller
   touched (untouched copies keep their recorded sha256, so the final check also catches a bad
   copy), writes ``manifest.json`` last;
4. loads the draft as a bundle (every hash, every predictor) and only then swaps it into place.

Any exception before the swap removes the draft and leaves the original untouched.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..atomic import staged_folder, write_json, write_text
from ..cost import COST_PROFILE_FILE, CostProfile
from ..errors import BundleError
from .card import CARD_FILE, render_card
from .format import MANIFEST, file_record, safe_name

if TYPE_CHECKING:
    from .bundle import Bundle


@dataclass
class BundleDraft:
    """A bundle being edited in a temporary folder (``folder``) that will replace ``destination``.

    Edit ``manifest`` directly; write files through :meth:`path` / :meth:`add_file` so they are
    hashed.
    """

    source: Bundle
    folder: Path
    destination: Path
    manifest: dict[str, Any]
    touched: set[str] = field(default_factory=set)

    def path(self, name: str) -> Path:
        """Where to write file ``name`` (a relative POSIX path) in the draft; it will be hashed at
        the end."""
        safe_name(name, str(self.folder))
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        self.touched.add(name)
        return target

    def add_file(self, name: str, src: str | Path) -> Path:
        """Copy ``src`` into the draft as ``name`` (replacing a file of that name)."""
        target = self.path(name)
        shutil.copyfile(src, target)
        return target

    def remove_file(self, name: str) -> None:
        """Delete ``name`` from the draft and from the manifest's files table."""
        safe_name(name, str(self.folder))
        (self.folder / name).unlink(missing_ok=True)
        self.manifest["files"].pop(name, None)
        self.touched.discard(name)

    def files(self) -> list[str]:
        """Names in the files table (as edited so far)."""
        return sorted(self.manifest["files"])


@contextmanager
def update_bundle(ref: str | Path, *, out: str | Path | None = None) -> Iterator[BundleDraft]:
    """Edit a copy of bundle ``ref``; on a clean exit the new version replaces it (or is written to
    ``out``).

    ``ref`` must be a local folder when ``out`` is None (a Hub or zoo bundle is read-only: pass
    ``out``).
    """
    from .bundle import load_bundle
    from .resolve import resolve_bundle

    if out is None and resolve_bundle(ref).source != "local":
        raise BundleError(
            f"bundle {str(ref)!r} is a Hub or zoo copy (a read-only cache); pull it into a folder "
            "of your own first (`dwise-predict pull ORG/NAME@REV --out DIR`), or pass out=DIR"
        )
    bundle = load_bundle(ref)  # verified before anything is copied
    dst = Path(out).expanduser() if out is not None else bundle.path
    if out is not None and dst.exists():
        raise BundleError(
            f"{dst} already exists; pass a new folder (or omit it to update the bundle in place)"
        )
    with staged_folder(dst) as tmp:
        _copy_tree(bundle.path, tmp, listed=set(bundle.manifest["files"]))
        draft = BundleDraft(
            source=bundle,
            folder=tmp,
            destination=dst,
            manifest=json.loads(json.dumps(bundle.manifest)),
        )
        yield draft
        finish_draft(draft)
        load_bundle(tmp)  # the new version verifies before it replaces anything


def finish_draft(draft: BundleDraft) -> None:
    """Render the card, hash touched files, write the manifest (last)."""
    files = draft.manifest.setdefault("files", {})
    for name in sorted(draft.touched):
        path = draft.folder / name
        if not path.is_file():
            raise BundleError(
                f"the update declared {name} but did not write it; nothing was changed"
            )
        files[name] = file_record(path)
    plots = [n for n in sorted(files) if n.startswith("plots/")]
    write_text(draft.folder / CARD_FILE, render_card(draft.manifest, plots=plots))
    files[CARD_FILE] = file_record(draft.folder / CARD_FILE)
    write_json(draft.folder / MANIFEST, draft.manifest)


def _copy_tree(src: Path, dst: Path, listed: set[str]) -> None:
    """Copy the bundle's files: every listed file (a Hugging Face cache snapshot holds them as
    symlinks to blobs: their content is copied), and unlisted regular files (notes travel along). An
    unlisted symlink is not followed: it could point anywhere, and nothing vouches for what it
    holds."""
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src).as_posix()
        if path.is_file() and (rel in listed or not path.is_symlink()):
            target = dst / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)


def write_bundle_cost_profile(
    ref: str | Path,
    profile: CostProfile,
    *,
    out: str | Path | None = None,
    allow_mismatch: bool = False,
) -> Path:
    """Write a new revision of bundle ``ref`` holding ``profile``; returns its folder.

    Only ``cost_profile.json``, its manifest entry (``revision`` + 1), the card and the manifest
    change: the predictor files stay byte-identical, so nothing is retrained. A profile measured
    for another dLLM, block size or decoder is refused (unless ``allow_mismatch``). Atomic: on
    any error the bundle is left as it was."""
    with update_bundle(ref, out=out) as draft:
        if not allow_mismatch:
            profile.check_compatible(draft.source.fingerprint)
        files = profile.save(draft.path(COST_PROFILE_FILE))
        parts = draft.manifest.setdefault("predictors", {})
        previous = parts.get(CostProfile.kind) or {}
        parts[CostProfile.kind] = {
            **profile.entry(),
            "files": files,
            "revision": int(previous.get("revision", 0)) + 1,
        }
        return draft.destination
