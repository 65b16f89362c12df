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
    import dwise_predict.export
    import dwise_predict.tracing
    import dwise_predict.trainers
    import dwise_predict.zoo

    for mod in (dwise_predict.tracing, dwise_predict.trainers, dwise_predict.export, dwise_predict.zoo):
        assert mod.__name__.startswith("dwise_predict.")
