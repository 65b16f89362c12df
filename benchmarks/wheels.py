"""The two distributions as a user gets them: wheel sizes, and a clean install outside the repo.

    python benchmarks/wheels.py                 # build, measure, install into a fresh venv
    python benchmarks/wheels.py --no-install    # sizes and contents only (offline, seconds)

Builds the core wheel (``dwise-predict``: code, no model binaries) and the zoo wheel
(``dwise-predict-zoo``: tiny-bd's runtime, weights and bundles) from a copy of the committed
sources, so nothing in the checkout is written. With install on, it makes a new venv in a
temporary folder outside the repository, installs the core wheel with its dependencies from the
package index, and checks what a scheduler process sees: ``import dwise_predict`` works and
torch is not installed at all. Then it adds the zoo wheel (``--no-deps``: the bundle needs no
torch) and loads ``tiny-bd`` with the Hub offline. Writes ``benchmarks/results/wheels.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dwise_predict.tables import format_table  # noqa: E402

#: the core wheel must stay small enough for every scheduler host (the zoo carries binaries)
CORE_LIMIT_BYTES = 3_000_000
BINARY_SUFFIXES = (".onnx", ".safetensors", ".bin", ".pt", ".npz")


def build_wheels(out: Path) -> dict[str, Path]:
    """Both wheels, built from a copy of the checkout's sources as git sees them (tracked or
    new, never ignored: no build/, egg-info or venv slips in, and none is left behind)."""
    src = out / "src"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, tracked):
        if (REPO / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    wheels: dict[str, Path] = {}
    for key, folder in (("core", src), ("zoo", src / "zoo")):
        dest = out / key
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
            + ["-w", str(dest), str(folder)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise SystemExit(f"building the {key} wheel failed:\n{done.stderr[-3000:]}")
        (wheels[key],) = dest.glob("*.whl")
    return wheels


def describe(wheel: Path) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    return {
        "wheel": wheel.name,
        "bytes": wheel.stat().st_size,
        "files": len(names),
        "binaries": sorted(n for n in names if n.endswith(BINARY_SUFFIXES)),
        "has_zoo_package": any(n.startswith("dwise_predict/zoo/") for n in names),
        "has_recipe": any("/recipe/" in n for n in names),
        "training_logs": sorted(n for n in names if Path(n).name.startswith("train_log")),
    }


CHECK_CORE = """
import importlib.util, json, sys, time
t = time.perf_counter(); import dwise_predict; dt = time.perf_counter() - t
print(json.dumps({"import_s": dt, "torch_installed": importlib.util.find_spec("torch") is not None,
                  "torch_imported": "torch" in sys.modules, "file": dwise_predict.__file__}))
"""
CHECK_ZOO = """
import json, sys, dwise_predict as d
b = d.load_bundle("tiny-bd")
r = b.predict_admission(["What is 2 + 3?"]); c = b.predict_cost(["What is 2 + 3?"])
print(json.dumps({"bundle": str(b.path), "modules": sorted(b.modules),
                  "admission_rounds": float(r[0]), "cost": float(c[0]),
                  "torch_imported": "torch" in sys.modules}))
"""


def clean_install(wheels: dict[str, Path], out: Path) -> dict[str, object]:
    venv = out / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    t0 = time.perf_counter()
    subprocess.run([*pip, str(wheels["core"])], check=True, capture_output=True)
    install_s = time.perf_counter() - t0
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out / "hf")}
    env.pop("PYTHONPATH", None)

    def run(code: str) -> dict[str, object]:
        done = subprocess.run(
            [str(py), "-c", code], cwd=out, env=env, capture_output=True, text=True, check=True
        )
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    core = run(CHECK_CORE)
    subprocess.run([*pip, "--no-deps", str(wheels["zoo"])], check=True, capture_output=True)
    zoo = run(CHECK_ZOO)
    return {"core_install_s": install_s, "core": core, "with_zoo": zoo}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-install", action="store_true", help="sizes and contents only")
    ap.add_argument("--json", type=Path, default=REPO / "benchmarks/results/wheels.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dwise-wheels-") as tmp:
        out = Path(tmp)
        wheels = build_wheels(out)
        result: dict[str, object] = {
            "command": "python benchmarks/wheels.py" + (" --no-install" if args.no_install else ""),
            "core_limit_bytes": CORE_LIMIT_BYTES,
            "wheels": {k: describe(w) for k, w in wheels.items()},
        }
        if not args.no_install:
            result["clean_venv"] = clean_install(wheels, out)
    rows = [
        [k, d["wheel"], f"{d['bytes'] / 1e6:.2f} MB", d["files"], len(d["binaries"])]
        for k, d in result["wheels"].items()  # type: ignore[attr-defined]
    ]
    print(format_table(["dist", "wheel", "size", "files", "binaries"], rows))
    if "clean_venv" in result:
        print(json.dumps(result["clean_venv"], indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    core, zoo = (result["wheels"][k] for k in ("core", "zoo"))  # type: ignore[index]
    ok = core["bytes"] <= CORE_LIMIT_BYTES and not core["binaries"] and not core["has_zoo_package"]
    ok = ok and not zoo["training_logs"] and not zoo["has_recipe"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
