"""Hub push and pull through the real huggingface_hub code paths, without the internet.

Two paths are exercised, and each test says which:

* **loopback endpoint**: :class:`tests.hub_server.LoopbackHub` serves the Hub API subset on
  127.0.0.1; ``HfApi.create_repo/create_branch/upload_folder/create_tag`` and
  ``snapshot_download`` run unmodified against it (``endpoint=``), each test with its own cache.
* **offline cache**: the server is stopped and a fresh process runs with ``HF_HUB_OFFLINE=1``;
  ``snapshot_download`` must serve what the loopback pulls put in the cache, and refuse the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dwise_predict.export.hub import PushResult, push_bundle
from huggingface_hub import constants as hf_constants

from dwise_predict.cli import main
from dwise_predict.errors import BundleError, ConfigError
from dwise_predict.hub import (
    HubConnectionError,
    HubError,
    HubOfflineError,
    HubRef,
    HubRepoNotFoundError,
    HubRevisionNotFoundError,
    parse_hub_ref,
    pull_bundle,
)

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import LoopbackHub, isolate_hf_home  # noqa: E402

TOKEN = "hf_loopback_token"


@pytest.fixture
def hf_home(tmp_path, monkeypatch):
    """Isolated HF home and cache; online mode (conftest turns the Hub offline for other tests)."""
    home = tmp_path / "hf_home"
    isolate_hf_home(monkeypatch, home)
    return home


@pytest.fixture
def hub(hf_home):
    server = LoopbackHub(write_token=TOKEN).start()
    yield server
    server.stop()


def make_bundle(folder: Path, version: int, seed: int = 0) -> Path:
    """A bundle-shaped folder: manifest, a binary weight file, a card with Hub metadata, a nested
    file."""
    rng = np.random.default_rng(seed + version)
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(
        json.dumps({"format": "dwise-predict-bundle", "version": version})
    )
    (folder / "refinement.safetensors").write_bytes(
        rng.integers(0, 256, 200_000, dtype=np.uint8).tobytes()
    )
    (folder / "README.md").write_text(
        f"---\nlibrary_name: dwise-predict\ntags: [dllm]\n---\n# bundle v{version}\n"
    )
    (folder / "plots").mkdir()
    (folder / "plots" / "calibration.svg").write_text(f"<svg>{version}</svg>")
    return folder


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_clean_protocol(hub: LoopbackHub) -> None:
    """Only emulated endpoints were called, and no LFS or Xet transfer was attempted."""
    assert hub.unhandled == []
    assert not [path for _, path in hub.requests if "lfs" in path or "xet" in path]


# -- references -------------------------------------------------------------------------------
def test_parse_hub_ref_forms():
    assert parse_hub_ref("hf://org/name@v1") == HubRef("org/name", "v1")
    assert parse_hub_ref("org/name") == HubRef("org/name", None)
    assert parse_hub_ref("hf://org/my.model-2@release/v1") == HubRef("org/my.model-2", "release/v1")
    assert str(parse_hub_ref("org/name@abc")) == "hf://org/name@abc"
    for bad in ("hf://name-only", "org/name@", "hf://org/na me", "org/a/b", "org/--x", "hf://"):
        with pytest.raises(ConfigError, match="ORG/NAME"):
            parse_hub_ref(bad)


# -- loopback endpoint ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "xet_installed", [True, False], ids=["pipelined-upload", "create-commit-upload"]
)
def test_push_then_pull_gives_identical_bytes(hub, tmp_path, monkeypatch, xet_installed):
    """Loopback endpoint: push (both upload paths of upload_folder) then pull into a folder and from
    the cache."""
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", not xet_installed)
    bundle = make_bundle(tmp_path / "bundle", version=1)
    result = push_bundle(bundle, "org/tiny-bd", tag="v1", token=TOKEN, endpoint=hub.url)
    assert isinstance(result, PushResult)
    assert result.revision == "main" and result.tag == "v1" and len(result.commit_sha) == 40
    assert result.url == f"{hub.url}/org/tiny-bd/commit/{result.commit_sha}"
    assert result.hub_ref == "hf://org/tiny-bd@v1"
    assert hub.repo("org/tiny-bd").tags["v1"] == result.commit_sha

    cache = tmp_path / "cache"
    out = pull_bundle("hf://org/tiny-bd@v1", tmp_path / "pulled", endpoint=hub.url, cache_dir=cache)
    assert files_of(out) == files_of(bundle)  # byte-identical; the Hub's .gitattributes is left out
    snapshot = pull_bundle("org/tiny-bd", endpoint=hub.url, cache_dir=cache)
    assert snapshot.parent.name == "snapshots" and snapshot.name == result.commit_sha
    assert cache in snapshot.parents
    assert {k: v for k, v in files_of(snapshot).items() if k != ".gitattributes"} == files_of(
        bundle
    )
    assert_clean_protocol(hub)


def test_revisions_by_tag_branch_and_commit(hub, tmp_path):
    """Loopback endpoint: two commits on main (the first tagged), one on a new branch; each ref
    pulls its bytes."""
    b1, b2, b3 = (make_bundle(tmp_path / f"b{v}", version=v) for v in (1, 2, 3))
    r1 = push_bundle(b1, "org/m", tag="v1", token=TOKEN, endpoint=hub.url)
    r2 = push_bundle(b2, "org/m", token=TOKEN, endpoint=hub.url, commit_message="second")
    r3 = push_bundle(b3, "org/m", revision="exp/long-ctx", token=TOKEN, endpoint=hub.url)
    assert len({r1.commit_sha, r2.commit_sha, r3.commit_sha}) == 3
    assert r3.revision == "exp/long-ctx"

    cache = tmp_path / "cache"

    outs = iter(range(100))

    def pulled(ref: str, **kw) -> dict[str, bytes]:
        return files_of(
            pull_bundle(
                ref, tmp_path / "out" / str(next(outs)), endpoint=hub.url, cache_dir=cache, **kw
            )
        )

    assert pulled("org/m@v1") == files_of(b1)
    assert pulled(f"org/m@{r1.commit_sha}") == files_of(b1)
    assert pulled("org/m@main") == files_of(b2)
    assert pulled("org/m") == files_of(b2)  # default revision is main
    assert pulled("org/m@exp/long-ctx") == files_of(b3)
    assert pulled("org/m", revision="v1") == files_of(b1)
    # the branch started from main's head at the time, so it kept main's other history untouched
    assert hub.repo("org/m").branches["main"] == r2.commit_sha
    with pytest.raises(HubError, match="tag 'v1' already exists"):
        push_bundle(b2, "org/m", tag="v1", token=TOKEN, endpoint=hub.url)
    with pytest.raises(ConfigError, match="two revisions"):
        pull_bundle("org/m@v1", revision="main", endpoint=hub.url, cache_dir=cache)
    assert_clean_protocol(hub)


def test_errors_name_the_problem_and_the_fix(hub, tmp_path):
    """Loopback endpoint: unknown repo, unknown revision, no write token, unreachable endpoint, bad
    folders."""
    bundle = make_bundle(tmp_path / "b", version=1)
    push_bundle(bundle, "org/m", tag="v1", token=TOKEN, endpoint=hub.url)
    cache = tmp_path / "cache"
    with pytest.raises(HubRepoNotFoundError, match="'org/missing' not found"):
        pull_bundle("org/missing", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(
        HubRevisionNotFoundError,
        match=r"no branch, tag or commit 'v9' \(branches: main; tags: v1\)",
    ):
        pull_bundle("org/m@v9", endpoint=hub.url, cache_dir=cache)
    with pytest.raises(HubRepoNotFoundError, match="write access"):
        push_bundle(bundle, "org/m", token="hf_wrong", endpoint=hub.url)
    with pytest.raises(BundleError, match="no manifest.json"):
        push_bundle(tmp_path, "org/m", token=TOKEN, endpoint=hub.url)
    out = tmp_path / "out"
    pull_bundle("org/m@v1", out, endpoint=hub.url, cache_dir=cache)
    with pytest.raises(BundleError, match="not empty"):
        pull_bundle("org/m@v1", out, endpoint=hub.url, cache_dir=cache)
    assert files_of(
        pull_bundle("org/m@v1", out, endpoint=hub.url, cache_dir=cache, overwrite=True)
    ) == files_of(bundle)
    assert not [
        p for p in tmp_path.iterdir() if p.name.startswith(".out.")
    ]  # no temp folders left behind

    dead = hub.url
    hub.stop()
    with pytest.raises(HubConnectionError, match="cannot reach"):
        pull_bundle("org/other@v1", endpoint=dead, cache_dir=cache)
    with pytest.raises(HubConnectionError, match="cannot reach"):
        push_bundle(bundle, "org/m", token=TOKEN, endpoint=dead)


def test_cli_push_and_pull(hub, tmp_path, monkeypatch, capsys):
    """Loopback endpoint through the command line; the token comes from HF_TOKEN."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    bundle = make_bundle(tmp_path / "b", version=1)
    assert (
        main(
            [
                "push",
                str(bundle),
                "--repo-id",
                "org/cli",
                "--tag",
                "v1",
                "--endpoint",
                hub.url,
                "-q",
            ]
        )
        == 0
    )
    assert "load it with: dwise_predict.load_bundle('hf://org/cli@v1')" in capsys.readouterr().out
    assert (
        main(["pull", "org/cli@v1", "--out", str(tmp_path / "o"), "--endpoint", hub.url, "-q"]) == 0
    )
    assert files_of(tmp_path / "o") == files_of(bundle)
    assert (
        main(["pull", "org/cli@nope", "--out", str(tmp_path / "o2"), "--endpoint", hub.url, "-q"])
        == 1
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no branch, tag or commit 'nope'" in err[0]
    assert not (tmp_path / "o2").exists()


# -- offline cache ----------------------------------------------------------------------------
OFFLINE_SCRIPT = r"""
import json, sys
from pathlib import Path
from dwise_predict.hub import pull_bundle, HubOfflineError
cache, out, refs, missing = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
result = {}
for i, ref in enumerate(refs):
    folder = pull_bundle(ref, out / str(i), cache_dir=cache)
    result[ref] = {
        p.relative_to(folder).as_posix(): p.read_bytes().hex()
        for p in folder.rglob("*")
        if p.is_file()
    }
try:
    pull_bundle(missing, cache_dir=cache)
    result["error"] = None
except HubOfflineError as e:
    result["error"] = str(e)
print(json.dumps(result))
"""


def test_offline_pull_from_populated_cache_after_server_stopped(hub, tmp_path):
    """Offline cache: pulls by tag, branch and sha populate the cache; the server stops; a new
    process with HF_HUB_OFFLINE=1 pulls the same refs from the cache and refuses an uncached
    revision."""
    b1, b2 = make_bundle(tmp_path / "b1", version=1), make_bundle(tmp_path / "b2", version=2)
    r1 = push_bundle(b1, "org/off", tag="v1", token=TOKEN, endpoint=hub.url)
    r2 = push_bundle(b2, "org/off", tag="v2", token=TOKEN, endpoint=hub.url)
    cache = tmp_path / "cache"
    refs = ["org/off@v1", "org/off@main", f"hf://org/off@{r1.commit_sha}"]
    for ref in refs:
        pull_bundle(ref, endpoint=hub.url, cache_dir=cache)
    hub.stop()

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            OFFLINE_SCRIPT,
            str(cache),
            str(tmp_path / "offline"),
            json.dumps(refs),
            "org/off@v2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    expect = {"org/off@v1": b1, "org/off@main": b2, f"hf://org/off@{r1.commit_sha}": b1}
    for ref, folder in expect.items():
        assert {k: bytes.fromhex(v) for k, v in got[ref].items()} == files_of(folder), ref
    assert r2.commit_sha  # v2 was pushed but never pulled, so it is not cached:
    assert "org/off@v2 is not in the local Hugging Face cache" in got["error"]
    assert "set HF_HUB_OFFLINE=0" in got["error"] and "pull it once while online" in got["error"]


def test_local_files_only_refuses_uncached(hf_home, tmp_path):
    """Offline cache (in process): local_files_only=True with an empty cache gives the offline
    error."""
    with pytest.raises(HubOfflineError, match="set HF_HUB_OFFLINE=0"):
        pull_bundle("org/none@v1", cache_dir=tmp_path / "empty", local_files_only=True)
