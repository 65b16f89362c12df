"""A loopback emulation of the Hugging Face Hub API subset that push and pull use.

Why: the Hub code paths of dwise-predict (``HfApi.create_repo`` / ``create_branch`` /
``upload_folder`` / ``create_tag`` and ``snapshot_download``) must be tested for real, through
huggingface_hub's own HTTP client, cache layout and error mapping, but tests run without the
internet. So this module serves, on 127.0.0.1 and an ephemeral port, exactly the endpoints
huggingface_hub 2.4 calls for those functions, with an in-memory git-like store: each commit is a
full snapshot of the repo's files, branches and tags point at commits.

Endpoints (read off ``hf_api.py``, ``_commit_api.py``, ``_upload_pipeline.py``,
``file_download.py`` and ``_snapshot_download.py``):

* ``POST /api/repos/create``                         create_repo (409 + url when it exists)
* ``POST /api/validate-yaml``                        README.md metadata check in upload_folder
* ``POST /api/models/{id}/preupload/{rev}``          upload modes: always ``"regular"`` so neither
  the LFS nor the Xet upload path is taken (files travel base64 in the commit)
* ``POST /api/models/{id}/commit/{rev}``             NDJSON commit (header, file, deletedFile, ...)
* ``POST /api/models/{id}/branch/{branch}``          create_branch (``startingPoint``)
* ``POST /api/models/{id}/tag/{rev}``                create_tag
* ``GET  /api/models/{id}/refs``                     list_repo_refs
* ``GET  /api/models/{id}[/revision/{rev}]``         repo_info (``sha`` + ``siblings``)
* ``GET  /api/models/{id}/tree/{rev}[/{path}]``      list_repo_tree (``recursive``)
* ``HEAD|GET /{id}/resolve/{rev}/{path}``            file metadata (``X-Repo-Commit``, ``ETag`` =
  git blob sha1, ``Content-Length``) and content (``Range`` honoured)

Errors carry the ``X-Error-Code`` header (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``) that ``hf_raise_for_status`` maps to huggingface_hub's exception types. Any other
request is answered 501 and recorded in :attr:`LoopbackHub.unhandled`, so a test can assert that
the client used nothing the emulation does not know (in particular no LFS batch and no Xet call).

HTTP/1.0 (one request per connection) on purpose: a stopped server must not keep serving
through a client's pooled keep-alive connection.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

GITATTRIBUTES = (
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
    b"*.onnx filter=lfs diff=lfs merge=lfs -text\n"
)
_HEX40 = re.compile(r"^[0-9a-f]{40}$")


def git_blob_sha(data: bytes) -> str:
    """The git object id of a blob: what the Hub reports as ``oid`` and ``ETag`` of a regular
    file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass(frozen=True)
class Commit:
    sha: str
    parent: str | None
    message: str
    files: dict[str, bytes]
    date: str


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, rev: str) -> str | None:
        """Commit sha of a branch, a tag or a full commit sha; None when unknown."""
        if rev in self.branches:
            return self.branches[rev]
        if rev in self.tags:
            return self.tags[rev]
        if _HEX40.match(rev) and rev in self.commits:
            return rev
        return None


class _HubError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class HubState:
    """The in-memory repositories and a log of requests (method, path)."""

    def __init__(self, write_token: str | None) -> None:
        self.write_token = write_token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.unhandled: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self._counter = 0

    def new_commit(
        self, repo: Repo, parent: str | None, message: str, files: dict[str, bytes]
    ) -> Commit:
        self._counter += 1
        h = hashlib.sha1()
        h.update(f"{repo.repo_id}\0{parent}\0{message}\0{self._counter}\0".encode())
        for path in sorted(files):
            h.update(f"{path}\0{git_blob_sha(files[path])}\0".encode())
        commit = Commit(
            h.hexdigest(),
            parent,
            message,
            dict(files),
            datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        )
        repo.commits[commit.sha] = commit
        return commit


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # quiet test output
        pass

    # -- plumbing -------------------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        state = self.server.state
        url = urlsplit(self.path)
        self.query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        self.body = self.rfile.read(length) if length else b""
        parts = [unquote(p) for p in url.path.split("/")[1:]]
        with state.lock:
            state.requests.append((method, url.path))
        try:
            auth = self.headers.get("Authorization")
            if (
                auth is not None
                and state.write_token is not None
                and auth != f"Bearer {state.write_token}"
            ):
                raise _HubError(
                    401, "Invalid credentials in Authorization header"
                )  # as the Hub does, on any route
            with state.lock:
                handled = self._route(method, parts, state)
            if not handled:
                with state.lock:
                    state.unhandled.append((method, url.path))
                raise _HubError(501, f"not emulated by the loopback hub: {method} {url.path}")
        except _HubError as e:
            headers = dict(e.headers)
            if e.code:
                headers["X-Error-Code"] = e.code
            headers["X-Error-Message"] = e.message
            self._send(
                e.status, json.dumps({"error": e.message}).encode(), headers, head=method == "HEAD"
            )

    def _send(
        self,
        status: int,
        body: bytes,
        headers: dict[str, str] | None = None,
        *,
        content_type: str = "application/json",
        head: bool = False,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Connection", "close")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _json(self, obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> bool:
        self._send(status, json.dumps(obj).encode(), headers)
        return True

    def _payload(self) -> Any:
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as e:
            raise _HubError(400, f"body is not JSON: {e}") from e

    def _require_write(self, state: HubState) -> None:
        if state.write_token is None:
            return
        if self.headers.get("Authorization") != f"Bearer {state.write_token}":
            raise _HubError(401, "Invalid credentials in Authorization header")

    def _can_read(self, state: HubState, repo: Repo) -> bool:
        return (
            not repo.private
            or state.write_token is None
            or self.headers.get("Authorization") == f"Bearer {state.write_token}"
        )

    def _repo(self, state: HubState, repo_id: str) -> Repo:
        repo = state.repos.get(repo_id)
        if repo is None or not self._can_read(state, repo):
            raise _HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    @staticmethod
    def _commit_of(repo: Repo, rev: str) -> Commit:
        sha = repo.resolve(rev)
        if sha is None:
            raise _HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[sha]

    # -- routes ---------------------------------------------------------------------------------
    def _route(self, method: str, p: list[str], state: HubState) -> bool:
        if method == "POST" and p == ["api", "repos", "create"]:
            return self._create_repo(state)
        if method == "POST" and p == ["api", "validate-yaml"]:
            return self._json({"errors": [], "warnings": []})
        if len(p) >= 4 and p[:2] == ["api", "models"]:
            repo_id, rest = f"{p[2]}/{p[3]}", p[4:]
            if method == "GET" and not rest:
                return self._repo_info(state, repo_id, "main")
            if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                return self._repo_info(state, repo_id, rest[1])
            if method == "GET" and rest == ["refs"]:
                return self._refs(state, repo_id)
            if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                return self._tree(state, repo_id, rest[1], "/".join(rest[2:]))
            if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                return self._preupload(state, repo_id, rest[1])
            if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                return self._commit(state, repo_id, rest[1])
            if method in ("POST", "DELETE") and len(rest) == 2 and rest[0] == "branch":
                return self._branch(state, repo_id, rest[1], method)
            if method == "POST" and len(rest) == 2 and rest[0] == "tag":
                return self._tag(state, repo_id, rest[1])
            return False
        if method in ("GET", "HEAD") and len(p) >= 5 and p[2] == "resolve":
            return self._resolve(
                state, f"{p[0]}/{p[1]}", p[3], "/".join(p[4:]), head=method == "HEAD"
            )
        return False

    def _create_repo(self, state: HubState) -> bool:
        self._require_write(state)
        payload = self._payload()
        org, name = payload.get("organization"), payload.get("name")
        if payload.get("type", "model") != "model":
            raise _HubError(400, "only model repos are emulated")
        repo_id = f"{org}/{name}" if org else f"user/{name}"
        url = f"{self.server.url}/{repo_id}"
        if repo_id in state.repos:
            return self._json(
                {"error": "You already created this model repo", "url": url}, status=409
            )
        repo = Repo(repo_id, private=payload.get("visibility") == "private")
        initial = state.new_commit(repo, None, "initial commit", {".gitattributes": GITATTRIBUTES})
        repo.branches["main"] = initial.sha
        state.repos[repo_id] = repo
        return self._json(
            {"url": url, "name": repo_id, "id": hashlib.md5(repo_id.encode()).hexdigest()[:24]}
        )

    def _repo_info(self, state: HubState, repo_id: str, rev: str) -> bool:
        repo = self._repo(state, repo_id)
        commit = self._commit_of(repo, rev)
        return self._json(
            {
                "_id": hashlib.md5(repo_id.encode()).hexdigest()[:24],
                "id": repo_id,
                "modelId": repo_id,
                "author": repo_id.split("/")[0],
                "sha": commit.sha,
                "lastModified": commit.date,
                "private": repo.private,
                "disabled": False,
                "gated": False,
                "tags": [],
                "downloads": 0,
                "likes": 0,
                "siblings": [{"rfilename": path} for path in sorted(commit.files)],
            }
        )

    def _refs(self, state: HubState, repo_id: str) -> bool:
        repo = self._repo(state, repo_id)

        def refs(kind: str, table: dict[str, str]) -> list[dict[str, str]]:
            return [
                {"name": n, "ref": f"refs/{kind}/{n}", "targetCommit": sha}
                for n, sha in sorted(table.items())
            ]

        return self._json(
            {
                "branches": refs("heads", repo.branches),
                "tags": refs("tags", repo.tags),
                "converts": [],
                "pullRequests": [],
            }
        )

    def _tree(self, state: HubState, repo_id: str, rev: str, prefix: str) -> bool:
        repo = self._repo(state, repo_id)
        commit = self._commit_of(repo, rev)
        recursive = self.query.get("recursive", ["False"])[0].lower() in ("1", "true")
        base = f"{prefix.rstrip('/')}/" if prefix else ""
        paths = sorted(p for p in commit.files if p.startswith(base))
        if prefix and not paths:
            raise _HubError(
                404,
                f"{prefix} does not exist at {rev}",
                "EntryNotFound",
                {"X-Repo-Commit": commit.sha},
            )
        entries: dict[str, dict[str, Any]] = {}

        def add_folder(folder: str) -> None:
            entries.setdefault(
                folder,
                {
                    "type": "directory",
                    "path": folder,
                    "size": 0,
                    "oid": hashlib.sha1(folder.encode()).hexdigest(),
                },
            )

        for path in paths:
            rel = path[len(base) :].split("/")
            if not recursive and len(rel) > 1:  # only the direct child folder
                add_folder(base + rel[0])
                continue
            for i in range(1, len(rel)):  # every folder on the way
                add_folder(base + "/".join(rel[:i]))
            data = commit.files[path]
            entries[path] = {
                "type": "file",
                "path": path,
                "size": len(data),
                "oid": git_blob_sha(data),
            }
        return self._json([entries[k] for k in sorted(entries)])

    def _preupload(self, state: HubState, repo_id: str, rev: str) -> bool:
        self._require_write(state)
        repo = self._repo(state, repo_id)
        commit = self._commit_of(repo, rev)
        files = []
        for f in self._payload().get("files", []):
            existing = commit.files.get(f["path"])
            files.append(
                {
                    "path": f["path"],
                    "uploadMode": "regular",
                    "shouldIgnore": False,
                    "oid": git_blob_sha(existing) if existing is not None else None,
                }
            )
        return self._json({"files": files, "commitOid": commit.sha})

    def _commit(self, state: HubState, repo_id: str, rev: str) -> bool:
        self._require_write(state)
        repo = self._repo(state, repo_id)
        if "create_pr" in self.query:
            raise _HubError(400, "pull requests are not emulated")
        if rev not in repo.branches:
            code = "RevisionNotFound" if repo.resolve(rev) is None else None
            raise _HubError(
                404 if code else 400, f"can only commit to an existing branch, not {rev!r}", code
            )
        if "ndjson" not in (self.headers.get("Content-Type") or ""):
            raise _HubError(400, "commit payload must be application/x-ndjson")
        head = repo.commits[repo.branches[rev]]
        files = dict(head.files)
        message = ""
        for line in self.body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                message = value.get("summary", "")
                parent = value.get("parentCommit")
                if parent is not None and parent != head.sha:
                    raise _HubError(
                        412, f"parent commit {parent} is not the head of {rev} ({head.sha})"
                    )
            elif key == "file":
                if value.get("encoding") != "base64":
                    raise _HubError(400, "only base64 file content is emulated")
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {p: d for p, d in files.items() if not p.startswith(folder)}
            else:  # lfsFile and anything newer: the emulation answered "regular", so this is a bug
                raise _HubError(400, f"commit operation {key!r} is not emulated")
        commit = state.new_commit(repo, head.sha, message, files)
        repo.branches[rev] = commit.sha
        return self._json(
            {
                "success": True,
                "commitOid": commit.sha,
                "pullRequestUrl": None,
                "commitUrl": f"{self.server.url}/{repo_id}/commit/{commit.sha}",
            }
        )

    def _branch(self, state: HubState, repo_id: str, branch: str, method: str) -> bool:
        self._require_write(state)
        repo = self._repo(state, repo_id)
        if method == "DELETE":
            if branch not in repo.branches or branch == "main":
                raise _HubError(
                    404 if branch not in repo.branches else 400, f"cannot delete branch {branch}"
                )
            del repo.branches[branch]
            return self._json({})
        if branch in repo.branches:
            return self._json({"error": f"branch {branch} already exists"}, status=409)
        start = self._payload().get("startingPoint") or "main"
        repo.branches[branch] = self._commit_of(repo, start).sha
        return self._json({})

    def _tag(self, state: HubState, repo_id: str, rev: str) -> bool:
        self._require_write(state)
        repo = self._repo(state, repo_id)
        tag = self._payload().get("tag")
        if not tag:
            raise _HubError(400, "tag name missing")
        if tag in repo.tags:
            return self._json({"error": f"tag {tag} already exists"}, status=409)
        repo.tags[tag] = self._commit_of(repo, rev).sha
        return self._json({})

    def _resolve(self, state: HubState, repo_id: str, rev: str, path: str, *, head: bool) -> bool:
        repo = self._repo(state, repo_id)
        commit = self._commit_of(repo, rev)
        data = commit.files.get(path)
        if data is None:
            raise _HubError(
                404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.sha}
            )
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{git_blob_sha(data)}"',
            "Accept-Ranges": "bytes",
        }
        status, body = 200, data
        rng = self.headers.get("Range")
        if rng and not head:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
            if m is None:
                raise _HubError(416, f"unsupported Range {rng!r}")
            start = int(m.group(1))
            end = int(m.group(2)) if m.group(2) else len(data) - 1
            if start >= len(data):
                raise _HubError(416, f"Range {rng!r} beyond {len(data)} bytes")
            body, status = data[start : end + 1], 206
            headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(data)}"
        self._send(status, body, headers, content_type="application/octet-stream", head=head)
        return True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: HubState) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state
        host, port = self.server_address[:2]
        self.url = f"http://{host}:{port}"


class LoopbackHub:
    """Start with :meth:`start` (or ``with``); ``url`` is the endpoint to give huggingface_hub.

    ``write_token``: the token write calls (and reads of private repos) must carry as
    ``Authorization: Bearer ...``; None accepts anything.
    """

    def __init__(self, write_token: str | None = "hf_loopback_token") -> None:
        self.state = HubState(write_token)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self) -> LoopbackHub:
        self._server = _Server(self.state)
        self.url = self._server.url
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="loopback-hub",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> LoopbackHub:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def unhandled(self) -> list[tuple[str, str]]:
        return list(self.state.unhandled)

    @property
    def requests(self) -> list[tuple[str, str]]:
        return list(self.state.requests)

    def repo(self, repo_id: str) -> Repo:
        return self.state.repos[repo_id]


def isolate_hf_home(monkeypatch: Any, home: Path) -> None:
    """Point huggingface_hub at ``home`` (cache, token, xet) and turn its offline mode off.

    huggingface_hub reads ``HF_HUB_OFFLINE``, ``HF_HUB_CACHE`` and the token path into module
    constants at import (tests/conftest.py sets ``HF_HUB_OFFLINE=1`` for the whole run), so the
    constants are patched as well as the environment.
    """
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_XET_CACHE", str(home / "xet"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
