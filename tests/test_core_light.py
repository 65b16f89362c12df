"""The core must stay light: a scheduler process imports it without torch or lightning."""

import subprocess
import sys

HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "sklearn")


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
    """With the core and the zoo both installed editable, a script run from another folder gets
    the core package, not the empty namespace the zoo's install declares for its parent
    (`make install` puts a link to the core on the path; see the Makefile)."""
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
