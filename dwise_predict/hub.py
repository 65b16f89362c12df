"""Pull a bundle from the Hugging Face Hub: ``hf://ORG/NAME@REVISION`` -> a local folder.

Why here, in the light core: ``load_bundle("hf://...")`` must work in a scheduler process that has
only the core installed, and huggingface_hub is a core dependency. Downloading goes through
``huggingface_hub.snapshot_download``, so users get the Hub's cache (shared with transformers and
friends), its offline mode (``HF_HUB_OFFLINE=1`` serves a revision pulled before) and its
revision pinning (branch, tag or commit sha). Publishing (``push_bundle``) is a write path and lives
in :mod:`dwise_predict.export.hub`.

huggingface_hub's exceptions are translated into :class:`~dwise_predict.errors.BundleError`
subclasses whose message says what to do (the exception types below), so a caller can catch
``BundleError`` for every way a bundle cannot be had.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .atomic import staged_folder
from .errors import BundleError, BundleIntegrityError, ConfigError

HF_SCHEME = "hf://"
DEFAULT_REVISION = "main"
#: files the Hub adds to every repository; not part of a bundle, so not copied into ``out_dir``
HUB_ONLY_FILES = frozenset({".gitattributes"})
# The Hub's repo name rules: letters, digits, '-', '_', '.'; no '--' or '..'; at most 96 chars.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_ID = re.compile(rf"^{_NAME}/{_NAME}$")


class HubError(BundleError):
    """A bundle could not be fetched from (or published to) the Hugging Face Hub."""


class HubRepoNotFoundError(HubError):
    """The repository does not exist, or is private/gated and the token cannot read it."""


class HubRevisionNotFoundError(HubError):
    """The repository exists but has no such branch, tag or commit."""


class HubOfflineError(HubError):
    """Offline mode is on (``HF_HUB_OFFLINE=1``) and the revision is not in the local cache."""


class HubConnectionError(HubError):
    """The Hub endpoint cannot be reached and the revision is not in the local cache."""


@dataclass(frozen=True)
class HubRef:
    """A parsed Hub reference: ``repo_id`` (``ORG/NAME``) and an optional ``revision``."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{HF_SCHEME}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def parse_hub_ref(ref: str) -> HubRef:
    """``"hf://ORG/NAME@REV"`` or ``"ORG/NAME@REV"`` (``@REV`` optional) -> :class:`HubRef`.

    The revision may itself contain ``/`` (branch ``release/v1``); the repo id never contains ``@``.
    """
    if not isinstance(ref, str):
        raise ConfigError(
            "a Hub reference must be a string like "
            f"'hf://ORG/NAME@REVISION', got {type(ref).__name__}"
        )
    body = ref[len(HF_SCHEME) :] if ref.startswith(HF_SCHEME) else ref
    repo_id, sep, revision = body.partition("@")
    if sep and not revision:
        raise ConfigError(
            f"Hub reference {ref!r} has an empty revision after '@'; write ORG/NAME@BRANCH|TAG|SHA "
            "or drop the '@'"
        )
    if not _REPO_ID.match(repo_id) or "--" in repo_id or ".." in repo_id:
        raise ConfigError(
            f"Hub reference {ref!r}: {repo_id!r} is not a repository id; write it as "
            "'hf://ORG/NAME[@REVISION]' (letters, digits, '-', '_', '.')"
        )
    if revision and (revision.strip() != revision or any(c in revision for c in " \t\n\\")):
        raise ConfigError(f"Hub reference {ref!r} has an invalid revision {revision!r}")
    return HubRef(repo_id, revision or None)


def pull_bundle(
    repo_ref: str | HubRef,
    out_dir: str | Path | None = None,
    *,
    revision: str | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | Path | None = None,
    local_files_only: bool = False,
    overwrite: bool = False,
) -> Path:
    """Download a bundle revision and return its local folder.

    Without ``out_dir`` the folder is the read-only snapshot in the Hugging Face cache (nothing is
    copied; a second pull of the same commit is free). With ``out_dir`` the files are copied into a
    temporary folder beside it and renamed into place, so ``out_dir`` is either complete or absent.

    ``revision`` (branch, tag or commit sha) may be given here or in the reference (not both,
    differently); the default is ``main``. ``endpoint``/``token``/``cache_dir`` default to
    huggingface_hub's (``HF_ENDPOINT``, ``HF_TOKEN`` or ``hf auth login``, ``HF_HUB_CACHE``);
    ``HF_ENDPOINT`` is read when this function is called, not when huggingface_hub was imported, so
    a process can point at a mirror late. Offline mode (``HF_HUB_OFFLINE=1`` or
    ``local_files_only=True``) serves only what is already cached.
    """
    ref = repo_ref if isinstance(repo_ref, HubRef) else parse_hub_ref(repo_ref)
    if revision is not None and ref.revision is not None and revision != ref.revision:
        raise ConfigError(
            f"two revisions given for {ref.repo_id}: {ref.revision!r} in the reference and "
            f"{revision!r} as an argument; pass one"
        )
    rev = revision or ref.revision or DEFAULT_REVISION
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    snapshot = _snapshot(
        ref.repo_id,
        rev,
        endpoint=endpoint,
        token=token,
        cache_dir=cache_dir,
        local_files_only=local_files_only,
    )
    if out_dir is None:
        return snapshot
    return copy_snapshot(snapshot, Path(out_dir), overwrite=overwrite)


def _snapshot(
    repo_id: str,
    revision: str,
    *,
    endpoint: str | None,
    token: str | bool | None,
    cache_dir: str | Path | None,
    local_files_only: bool,
) -> Path:
    from huggingface_hub import snapshot_download

    err: Any = _hf_errors()

    where = f"{HF_SCHEME}{repo_id}@{revision}"
    try:
        path = snapshot_download(
            repo_id,
            revision=revision,
            endpoint=endpoint,
            token=token,
            cache_dir=str(cache_dir) if cache_dir is not None else None,
            local_files_only=local_files_only,
        )
    except err.RevisionNotFoundError as e:
        known = _known_refs(repo_id, endpoint=endpoint, token=token)
        raise HubRevisionNotFoundError(
            f"{where}: repository {repo_id} has no branch, tag or commit {revision!r}{known}; "
            "pass an existing revision (ORG/NAME@BRANCH|TAG|SHA)"
        ) from e
    except err.GatedRepoError as e:
        raise HubRepoNotFoundError(
            f"{where}: the repository is gated; accept its terms on the Hub and pass a token "
            "(HF_TOKEN or `hf auth login`)"
        ) from e
    except err.RepositoryNotFoundError as e:
        raise HubRepoNotFoundError(
            f"{where}: repository {repo_id!r} not found at {_endpoint(endpoint)}; check the id, or "
            "pass a token that can read it if it is private (HF_TOKEN or `hf auth login`)"
        ) from e
    except err.IncompleteSnapshotError as e:
        raise BundleIntegrityError(
            f"{where}: the cached copy is incomplete and the Hub cannot be reached ({e}); "
            "pull it again while online"
        ) from e
    except err.LocalEntryNotFoundError as e:
        if local_files_only or _caused_by(e, err.OfflineModeIsEnabled):
            raise HubOfflineError(
                f"{where} is not in the local Hugging Face cache and offline mode is on; set "
                "HF_HUB_OFFLINE=0 (and drop local_files_only) or pull it once while online"
            ) from e
        raise HubConnectionError(
            f"{where}: cannot reach {_endpoint(endpoint)} and the revision is not in the local "
            "cache; check the network or HF_ENDPOINT, or pull it once while online"
        ) from e
    except err.HfHubHTTPError as e:
        raise HubError(
            f"{where}: the Hub refused the download ({_first_line(e)}); check the token and the "
            "repository id"
        ) from e
    return Path(path)


def copy_snapshot(snapshot: Path, out_dir: Path, *, overwrite: bool = False) -> Path:
    """Copy a snapshot (symlinks into the cache's blobs) as plain files, atomically, to
    ``out_dir``."""
    out_dir = out_dir.expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise BundleError(f"--out {out_dir} is a file; pass a folder path")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise BundleError(
            f"{out_dir} already exists and is not empty; pass another folder, delete it, or "
            "pass overwrite=True (--overwrite)"
        )
    with staged_folder(out_dir) as tmp:
        for src in sorted(snapshot.rglob("*")):
            rel = src.relative_to(snapshot)
            if src.is_dir() or rel.as_posix() in HUB_ONLY_FILES:
                continue
            dst = tmp / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)  # follows the snapshot's symlink to the blob
    return out_dir


class _Never(Exception):
    """Stands in for an exception type an older huggingface_hub does not define."""


@dataclass(frozen=True)
class _HfErrors:
    RevisionNotFoundError: type
    GatedRepoError: type
    RepositoryNotFoundError: type
    IncompleteSnapshotError: type
    LocalEntryNotFoundError: type
    OfflineModeIsEnabled: type
    HfHubHTTPError: type


def _hf_errors() -> _HfErrors:
    """huggingface_hub's exception types (their module moved across major versions)."""
    import huggingface_hub.errors as errors_mod

    names = [f.name for f in _HfErrors.__dataclass_fields__.values()]
    return _HfErrors(**{n: getattr(errors_mod, n, _Never) for n in names})


def _known_refs(repo_id: str, *, endpoint: str | None, token: str | bool | None) -> str:
    """'; branches: a, b; tags: c' for an error message (empty when the refs cannot be listed)."""
    try:
        from huggingface_hub import HfApi

        refs = HfApi(endpoint=endpoint, token=token).list_repo_refs(repo_id)
    except Exception:  # only decorates an error message
        return ""
    branches = ", ".join(sorted(b.name for b in refs.branches)) or "none"
    tags = ", ".join(sorted(t.name for t in refs.tags)) or "none"
    return f" (branches: {branches}; tags: {tags})"


def _caused_by(error: BaseException, kind: type) -> bool:
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _endpoint(endpoint: str | None) -> str:
    if endpoint:
        return endpoint
    from huggingface_hub import constants

    return constants.ENDPOINT


def _first_line(e: BaseException) -> str:
    return next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
