"""The zoo registry: the packaged index resolves names; malformed indexes are refused clearly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dwise_predict.zoo.registry import INDEX_PATH, find, list_models, load_index, resolve

from dwise_predict.errors import ConfigError
from dwise_predict.fingerprint import ModelFingerprint
from dwise_predict.hub import parse_hub_ref


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
    assert default.local_path == INDEX_PATH.parent / "bundles" / "tiny-bd"
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


def test_registry_imports_without_torch():
    code = (
        "import sys, dwise_predict.zoo.registry as r; "
        "r.resolve('tiny-bd'); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_shipped_tiny_bd_bundle_prices_requests_with_its_int8_dws_and_no_torch():
    """The zoo bundle carries DWS as its INT8 file alone (the FP32 encoder is 90 MB) and its
    measured cost profile; a scheduler process prices prompts without torch or transformers."""
    entry = resolve("tiny-bd")
    manifest = json.loads((entry.local_path / "manifest.json").read_text())
    dws = manifest["predictors"]["dws"]
    assert dws["precision"] == "int8" and dws["fp32_shipped"] is False
    assert dws["encoder"].startswith("sentence-transformers/all-MiniLM-L6-v2")  # a name, no path
    assert "dws.int8.onnx" in manifest["files"] and "dws.onnx" not in manifest["files"]
    assert (entry.local_path / "dws.int8.onnx").stat().st_size < 40e6
    code = (
        "import sys, json, dwise_predict as d; b = d.load_bundle('tiny-bd'); "
        "c = b.predict_cost(['What is 2 + 3?', 'Write a long essay about the history of "
        "rivers, with ten sections and a summary.']); "
        "print(json.dumps([c.tolist(), 'torch' in sys.modules, 'transformers' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    costs, torch_loaded, transformers_loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert not torch_loaded and not transformers_loaded
    assert all(c > 0 for c in costs) and costs[1] > costs[0]  # an essay outweighs a sum
