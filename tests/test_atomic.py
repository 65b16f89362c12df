"""The one atomic writer and the one folder swap: whole or nothing, unique hidden temps."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from dwise_predict import atomic


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_json_replaces_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "m.json"
    atomic.write_json(target, {"b": 1, "a": [1, 2]})
    atomic.write_json(target, {"c": 3})
    assert json.loads(target.read_text()) == {"c": 3}
    assert _names(tmp_path) == ["m.json"]
    assert target.read_text().endswith("}\n")


def test_write_json_refuses_nan_and_keeps_the_old_file(tmp_path: Path) -> None:
    target = atomic.write_json(tmp_path / "m.json", {"x": 1})
    with pytest.raises(ValueError):
        atomic.write_json(target, {"x": float("nan")})
    assert json.loads(target.read_text()) == {"x": 1}
    assert _names(tmp_path) == ["m.json"]


def test_temp_names_are_unique_hidden_and_never_match_a_suffix_glob(tmp_path: Path) -> None:
    names = {atomic.temp_name(tmp_path / "shard-00001.parquet").name for _ in range(200)}
    assert len(names) == 200
    for n in names:
        assert n.startswith(".shard-00001.parquet.") and n.endswith(atomic.TEMP_SUFFIX)
        assert not n.endswith(".parquet")


def test_write_uses_the_umask_not_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = atomic.write_text(tmp_path / "card.md", "hello")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_atomic_path_error_removes_the_temp_and_keeps_the_target(tmp_path: Path) -> None:
    target = atomic.write_text(tmp_path / "t.parquet", "old")
    with pytest.raises(RuntimeError, match="writer died"), atomic.atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer died")
    assert target.read_text() == "old"
    assert _names(tmp_path) == ["t.parquet"]


def test_atomic_path_refuses_a_writer_that_wrote_nothing(tmp_path: Path) -> None:
    with (
        pytest.raises(FileNotFoundError, match="did not create"),
        atomic.atomic_path(tmp_path / "x.bin"),
    ):
        pass
    assert _names(tmp_path) == []


def test_fsync_dir_tolerates_a_folder_the_os_cannot_open(tmp_path: Path) -> None:
    atomic.fsync_dir(tmp_path / "missing")  # must not raise: durability is best effort here


def test_staged_folder_replaces_an_existing_folder_whole(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    with atomic.staged_folder(target) as d:
        (d / "a.txt").write_text("v1")
    with atomic.staged_folder(target) as d:
        assert d.parent == tmp_path and d.name.startswith(".bundle.")
        (d / "b.txt").write_text("v2")
    assert _names(target) == ["b.txt"]
    assert _names(tmp_path) == ["bundle"]  # no staged or old sibling left behind


def test_staged_folder_error_leaves_the_old_folder_untouched(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    with atomic.staged_folder(target) as d:
        (d / "a.txt").write_text("v1")
    with pytest.raises(KeyboardInterrupt), atomic.staged_folder(target) as d:
        (d / "a.txt").write_text("half")
        raise KeyboardInterrupt
    assert (target / "a.txt").read_text() == "v1"
    assert _names(tmp_path) == ["bundle"]


def test_commit_files_places_a_set_whole_or_removes_it(tmp_path, monkeypatch):
    import os

    from dwise_predict.atomic import commit_files, write_temp

    targets = [tmp_path / f"{name}.txt" for name in ("a", "b", "c")]
    temps = [write_temp(t, t.name.encode()) for t in targets]
    assert commit_files(zip(temps, targets)) == targets
    assert [t.read_text() for t in targets] == ["a.txt", "b.txt", "c.txt"]
    assert not [p for p in tmp_path.iterdir() if p not in targets]  # no temp left behind

    fresh = [tmp_path / f"{name}.new" for name in ("x", "y", "z")]
    temps = [write_temp(t, b"data") for t in fresh]
    real_replace, calls = os.replace, []

    def fail_on_third(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_third)
    with pytest.raises(OSError, match="No space"):
        commit_files(zip(temps, fresh))
    monkeypatch.setattr(os, "replace", real_replace)
    # the two placed before the failure are gone again, and so is every temp
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "c.txt"]
