"""The zoo index: the packaged index resolves names and finds the zoo distribution's copies;
malformed indexes are refused clearly; a missing zoo distribution is named with its install
command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dwise_predict.errors import ConfigError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.hub import parse_hub_ref
from dwise_predict.zoo_index import find, list_models, load_index, model_weights, resolve

REPO = Path(__file__).resolve().parents[1]


def test_packaged_index_resolves_default_and_tagged_names():
    default = resolve("tiny-bd")
    tagged = resolve("tiny-bd.tau095")
    assert default == tagged and default.is_default
    assert (
        default.name == "tiny-bd.tau095" and default.model == "tiny-bd" and default.tag == "tau095"
    )
    fp = default.model_fingerprint()
    assert isinstance(fp, ModelFingerprint)
    assert (fp.model_id, fp.block_size, fp.threshold) == ("tiny-bd", 32, 0.95)
    ref = parse_hub_ref(default.hub_ref)  # the ref pull_bundle takes
    assert ref.repo_id == default.repo_id and ref.revision == default.revision
    # the copy the zoo distribution carries (installed editable from ./zoo by make)
    assert default.local_bundle() == REPO / "zoo" / "bundles" / "tiny-bd"
    assert default.shipped_in is not None
    assert default.shipped_in.distribution == "dwise-predict-zoo"
    assert "tiny-bd.tau095" in list_models() and list_models("tiny-*") == ["tiny-bd.tau095"]
    assert list_models("nothing-*") == []


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(
        ConfigError, match=r"unknown zoo name 'tiny-bdx'; known: tiny-bd.tau095 \(default\)"
    ):
        resolve("tiny-bdx")
    assert find("tiny-bdx") is None and find("tiny-bd").tag == "tau095"


def _index(tmp_path, **over):
    tag = {
        "repo_id": "org/m",
        "revision": "v1",
        "fingerprint": {"model_id": "m", "block_size": 4, "threshold": 0.9},
        "local_path": "bundles/m",
    }
    tag.update(over.pop("tag", {}))
    data = {
        "format": "dwise-predict-zoo",
        "format_version": 1,
        "models": {"m": {"default_tag": "a", "tags": {"a": tag, "b": {**tag, "revision": "v2"}}}},
    }
    data.update(over)
    path = tmp_path / "index.json"
    path.write_text(json.dumps(data))
    return path


def test_custom_index_and_local_bundle(tmp_path):
    idx = load_index(_index(tmp_path))
    assert idx.names() == ["m.a", "m.b"]
    assert resolve("m", index=idx).revision == "v1" and resolve("m.b", index=idx).revision == "v2"
    entry = resolve("m", index=idx)
    assert entry.local_bundle() is None  # not shipped: a loader falls back to entry.hub_ref
    (tmp_path / "bundles" / "m").mkdir(parents=True)
    (tmp_path / "bundles" / "m" / "manifest.json").write_text("{}")
    assert entry.local_bundle() == tmp_path / "bundles" / "m"


@pytest.mark.parametrize(
    "over, message",
    [
        ({"format": "other"}, "not a dwise-predict-zoo file"),
        ({"format_version": 99}, "upgrade dwise-predict"),
        ({"models": {}}, "lists no models"),
        (
            {"models": {"m": {"default_tag": "zz", "tags": {"a": {}}}}},
            "default_tag 'zz' is not one of its tags",
        ),
        (
            {"models": {"m.x": {"default_tag": "a", "tags": {"a": {}}}}},
            "not a valid zoo model or tag name",
        ),
        ({"tag": {"repo_id": "org/m@v1"}}, "must not contain '@'"),
        ({"tag": {"repo_id": "not a repo"}}, "is not a repository id"),
        ({"tag": {"revision": ""}}, "lacks revision"),
        ({"tag": {"fingerprint": {"model_id": "m"}}}, "fingerprint is incomplete"),
        ({"tag": {"local_path": "../outside"}}, "must be relative to the index folder"),
    ],
)
def test_malformed_index_is_refused(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message):
        load_index(_index(tmp_path, **over))


def test_unreadable_index(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_index(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_index(tmp_path / "bad.json")


def test_zoo_model_weights_come_from_the_zoo_distribution(tmp_path):
    from dwise_predict.zoo.tiny_bd.io import WEIGHTS_DIR

    assert model_weights("tiny-bd") == WEIGHTS_DIR
    assert model_weights("some/local-model") is None  # not a zoo model: a path, the caller's
    shipped = {"package": "dwise_predict_no_such_zoo", "path": "w", "distribution": "acme-zoo"}
    path = _index(tmp_path)
    data = json.loads(path.read_text())
    data["models"]["m"]["weights"] = shipped
    path.write_text(json.dumps(data))
    idx = load_index(path)
    with pytest.raises(ConfigError, match=r"acme-zoo distribution, which is not installed: pip"):
        model_weights("m", index=idx)


def test_bundle_of_an_uninstalled_zoo_distribution_names_the_install_command(tmp_path):
    """Offline and without the distribution that carries it, a zoo name fails with the exact
    command to get it (the Hub pull is tried first and its error is kept)."""
    shipped = {"package": "dwise_predict_no_such_zoo", "path": "b", "distribution": "acme-zoo"}
    index = _index(tmp_path, tag={"local_path": None, "shipped_in": shipped})
    assert resolve("m", index=load_index(index)).local_bundle() is None
    code = (
        "import sys; from pathlib import Path; import dwise_predict.zoo_index as z; "
        f"z.INDEX_PATH = Path({str(index)!r}); import dwise_predict as d\n"
        "try:\n    d.load_bundle('m')\nexcept d.errors.BundleError as e:\n    print(e)"
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert "zoo bundle 'm.a' is not installed and could not be pulled from hf://org/m@v1" in (
        out.stdout
    )
    assert "It ships in the acme-zoo distribution: pip install acme-zoo" in out.stdout


def test_registry_imports_without_torch():
    code = (
        "import sys, dwise_predict.zoo_index as r; "
        "r.resolve('tiny-bd'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shipped_tiny_bd_bundle_prices_requests_with_its_int8_dws_and_no_torch():
    """The zoo bundle carries DWS as its INT8 file alone (the FP32 encoder is 90 MB) and its
    measured cost profile; a scheduler process prices prompts without torch or transformers."""
    entry = resolve("tiny-bd")
    local = entry.local_bundle()
    assert local is not None
    manifest = json.loads((local / "manifest.json").read_text())
    dws = manifest["predictors"]["dws"]
    assert dws["precision"] == "int8" and dws["fp32_shipped"] is False
    assert dws["encoder"].startswith("sentence-transformers/all-MiniLM-L6-v2")  # a name, no path
    assert "dws.int8.onnx" in manifest["files"] and "dws.onnx" not in manifest["files"]
    assert (local / "dws.int8.onnx").stat().st_size < 40e6
    # a multiple-choice question (two rounds on tiny-bd, traced) and an essay (about 150)
    mcq = (
        "Which option has the most letters?\\n(A) dog\\n(B) rose\\n(C) umbrella\\n(D) garden"
        "\\nAnswer with the letter of the correct option."
    )
    code = (
        "import sys, json, dwise_predict as d; b = d.load_bundle('tiny-bd'); "
        f"c = b.predict_cost(['{mcq}', 'Write a long essay about the history of "
        "rivers, with ten sections and a summary.']); "
        "print(json.dumps([c.tolist(), 'torch' in sys.modules, 'transformers' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    costs, torch_loaded, transformers_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not torch_loaded and not transformers_loaded
    assert all(c > 0 for c in costs) and costs[1] > 3 * costs[0]  # an essay outweighs a letter


def test_zoo_release_versions_agree():
    """Binaries change only at a zoo release, and a release moves three numbers together: the
    zoo distribution's version, the index's pinned revision and the shipped bundle's bytes
    (docs/zoo.md, "Releasing the zoo")."""
    import tomllib

    zoo_version = tomllib.loads((REPO / "zoo" / "pyproject.toml").read_text())["project"]["version"]
    entry = resolve("tiny-bd")
    assert entry.revision == f"v{zoo_version}", (
        f"zoo/pyproject.toml says {zoo_version} but the index pins {entry.revision}: "
        "bump both at a release"
    )
    local = entry.local_bundle()
    assert local is not None
    manifest = json.loads((local / "manifest.json").read_text())
    assert (
        ModelFingerprint.from_dict(manifest["fingerprint"]).mismatches(entry.model_fingerprint())
        == []
    ), "the shipped bundle is not the one the index describes"
    # traced as SGLang serves it, so a server in the other layout refuses it by name
    assert manifest["fingerprint"]["block_alignment"] == "absolute"
    assert entry.model_fingerprint().block_alignment == "absolute"
