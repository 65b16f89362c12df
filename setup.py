"""Package discovery only; all metadata lives in pyproject.toml.

The feature folders (tracing/, trainers/, export/) sit at the repository root, as the users
asked, but install under the ``dwise_predict`` namespace so nothing generic lands in
site-packages. zoo/ is the fourth feature folder, built as its own distribution
(``dwise-predict-zoo``, zoo/pyproject.toml) so the model binaries stay out of this wheel.
setuptools cannot express "this folder is that subpackage, and so are all its children"
declaratively, so we compute the mapping here.

A development install (``pip install -e .``, which ``make install`` runs) maps zoo/ as well, so
one editable install serves the whole checkout; don't add ``pip install -e ./zoo`` to it.
setuptools would give that second editable install an empty ``dwise_predict`` namespace package,
which Python's path finder returns before the core's editable finder is asked, and
``import dwise_predict`` would then fail outside the checkout. Wheels are unaffected: the core
wheel never holds the zoo, and installed wheels share one ``dwise_predict`` folder.
"""

import sys

from setuptools import find_packages, setup

FEATURES = {"tracing", "trainers", "export"}
if "editable_wheel" in sys.argv:  # setuptools' command for `pip install -e .` (PEP 660)
    FEATURES.add("zoo")

packages = ["dwise_predict", *(f"dwise_predict.{p}" for p in find_packages("dwise_predict"))]
package_dir = {"dwise_predict": "dwise_predict"}
for feature in sorted(FEATURES):
    root = f"dwise_predict.{feature}"
    packages.append(root)
    package_dir[root] = feature
    packages.extend(f"{root}.{p}" for p in find_packages(feature))

setup(packages=packages, package_dir=package_dir)
