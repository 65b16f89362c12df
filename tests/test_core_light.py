"""The core must stay light: a scheduler process imports it without torch, lightning or
matplotlib (plots are the `plots` extra)."""

import subprocess
import sys

HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "sklearn", "matplotlib")


def test_import_dwise_predict_pulls_no_heavy_module():
    code = (
        "import sys, dwise_predict, dwise_predict.cli; "
        "dwise_predict.cli.build_parser(); "
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"import dwise_predict pulled in: {out.stdout.strip()}"


def test_feature_packages_install_under_the_namespace():
    """dwise_predict.tracing etc. are the repository's top-level folders, not copies elsewhere."""
    from pathlib import Path

    import dwise_predict.export
    import dwise_predict.tracing
    import dwise_predict.trainers
    import dwise_predict.zoo

    repo = Path(__file__).resolve().parents[1]
    for mod, folder in (
        (dwise_predict.tracing, "tracing"),
        (dwise_predict.trainers, "trainers"),
        (dwise_predict.export, "export"),
        (dwise_predict.zoo, "zoo"),
    ):
        assert Path(mod.__file__).resolve() == repo / folder / "__init__.py"


def test_the_public_api_imports_outside_the_checkout(tmp_path):
    """In the dev install (one editable install whose mapping covers zoo/, see setup.py) and in
    installed wheels, a script run from another folder gets the core package, never an empty
    `dwise_predict` namespace."""
    code = (
        "import dwise_predict; from dwise_predict import load_bundle; "
        "import dwise_predict.zoo, dwise_predict.tracing; "
        "print(dwise_predict.__file__ is not None, callable(load_bundle))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_plots_without_matplotlib_name_the_extra(tmp_path):
    """matplotlib is not a core dependency: plotting without it is the library's own error,
    naming the extra to install (simulated by blocking the import in a fresh interpreter)."""
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from dwise_predict.errors import MissingDependencyError\n"
        "from dwise_predict.runtime import plots\n"
        "try:\n"
        f"    plots.latency_cdf({{}}, {str(tmp_path / 'cdf.png')!r})\n"
        "except MissingDependencyError as e:\n"
        "    print(type(e).__name__, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "MissingDependencyError | plots need matplotlib: pip install 'dwise-predict[plots]'"
    )
    assert not (tmp_path / "cdf.png").exists()
