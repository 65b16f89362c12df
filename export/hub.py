"""Publish a bundle folder to the Hugging Face Hub (the write half of :mod:`dwise_predict.hub`).

Why a separate module: pulling is what every scheduler does and lives in the light core; pushing
is a release step (a token, a repository to create, a tag to cut) and belongs with export. It is
still light (huggingface_hub only), so ``dwise-predict push`` needs no torch.

A push is ``create_repo(exist_ok=True)`` -> ``create_branch`` (when a branch other than ``main``
is asked for and missing) -> one ``upload_folder`` commit -> ``create_tag`` on *that* commit (not on
the branch head, which another push could have moved). Tags are immutable on purpose: a zoo entry
pins ``repo@tag`` and must keep meaning the same bytes, so an existing tag is an error, never moved.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dwise_predict.bundle.format import MANIFEST
from dwise_predict.errors import BundleError
from dwise_predict.hub import (
    DEFAULT_REVISION,
    HubConnectionError,
    HubError,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
    parse_hub_ref,
)


@dataclass(frozen=True)
class PushResult:
    """What a push created: the commit, where to see it, and the refs that point at it."""

    commit_sha: str
    url: str
    revision: str
    tag: str | None
    repo_id: str

    @property
    def hub_ref(self) -> str:
        """The immutable reference to load exactly these bytes: ``hf://ORG/NAME@<tag or sha>``."""
        return f"hf://{self.repo_id}@{self.tag or self.commit_sha}"


def push_bundle(
    folder: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    tag: str | None = None,
    private: bool = False,
    token: str | bool | None = None,
    endpoint: str | None = None,
    commit_message: str | None = None,
) -> PushResult:
    """Upload the bundle ``folder`` as one commit to ``repo_id`` on branch ``revision`` (default
    main).

    The repository is created when missing (``private`` applies only then), the branch is created
    from ``main`` when missing, and ``tag`` (if given) is cut on the new commit. ``token`` and
    ``endpoint`` default to huggingface_hub's (``HF_TOKEN`` or ``hf auth login``; ``HF_ENDPOINT``).
    """
    from huggingface_hub import HfApi

    folder = Path(folder).expanduser()
    _check_bundle_folder(folder)
    ref = parse_hub_ref(repo_id)
    if ref.revision is not None:
        raise BundleError(
            f"repo id {repo_id!r} contains '@'; pass the branch as revision= (--revision)"
        )
    branch = revision or DEFAULT_REVISION
    api = HfApi(endpoint=endpoint, token=token)
    where = f"hf://{ref.repo_id}@{branch}"
    with _translate(where, api.endpoint):
        api.create_repo(ref.repo_id, private=private, exist_ok=True, repo_type="model")
        if branch != DEFAULT_REVISION:
            api.create_branch(ref.repo_id, branch=branch, exist_ok=True)
        info = api.upload_folder(
            repo_id=ref.repo_id,
            folder_path=folder,
            revision=branch,
            commit_message=commit_message or f"Upload dwise-predict bundle {folder.name}",
        )
    commit_sha = str(info.oid)
    if tag is not None:
        with _translate(f"hf://{ref.repo_id}@{tag}", api.endpoint, tag=tag):
            api.create_tag(ref.repo_id, tag=tag, revision=commit_sha, tag_message=commit_message)
    return PushResult(
        commit_sha=commit_sha, url=info.commit_url, revision=branch, tag=tag, repo_id=ref.repo_id
    )


def _check_bundle_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise BundleError(
            f"bundle folder {folder} does not exist; pass "
            "the folder `dwise-predict train --out` wrote"
        )
    if not (folder / MANIFEST).is_file():
        raise BundleError(
            f"{folder} has no {MANIFEST}, so it is not a dwise-predict bundle; "
            "create one with `dwise-predict train`"
        )


class _translate:
    """Turn huggingface_hub's exceptions into :class:`HubError` subclasses that name the fix."""

    def __init__(self, where: str, endpoint: str, tag: str | None = None) -> None:
        self.where, self.endpoint, self.tag = where, endpoint, tag

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, e: BaseException | None, tb: object) -> Literal[False]:
        """Never swallows: either re-raises as a HubError subclass, or lets the original
        propagate."""
        if e is None or not isinstance(e, Exception) or isinstance(e, BundleError):
            return False
        import huggingface_hub.errors as hf

        status = getattr(getattr(e, "response", None), "status_code", None)
        if isinstance(e, getattr(hf, "RevisionNotFoundError", ())):
            raise HubRevisionNotFoundError(
                f"{self.where}: revision not found ({_first_line(e)})"
            ) from e
        if isinstance(e, getattr(hf, "RepositoryNotFoundError", ())) or status in (401, 403):
            raise HubRepoNotFoundError(
                f"{self.where}: the Hub at {self.endpoint} refused the write ({_first_line(e)}); "
                "pass a token with write access to the namespace (HF_TOKEN, `hf auth login`, or "
                "token=)"
            ) from e
        if status == 409 and self.tag is not None:
            raise HubError(
                f"{self.where}: tag {self.tag!r} already exists and tags are never moved; "
                "choose a new tag"
            ) from e
        if isinstance(e, getattr(hf, "HfHubHTTPError", ())):
            raise HubError(f"{self.where}: the Hub refused the push ({_first_line(e)})") from e
        if isinstance(e, getattr(hf, "OfflineModeIsEnabled", ())):
            raise HubConnectionError(
                f"{self.where}: offline mode is on; set HF_HUB_OFFLINE=0 to push"
            ) from e
        if isinstance(e, ConnectionError) or "TransportError" in {
            c.__name__ for c in type(e).__mro__
        }:
            raise HubConnectionError(
                f"{self.where}: cannot reach {self.endpoint} ({e}); check the network or "
                "HF_ENDPOINT / --endpoint"
            ) from e
        return False


def _first_line(e: BaseException) -> str:
    return next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
