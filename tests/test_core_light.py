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
