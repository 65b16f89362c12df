"""Predictor bundles: a versioned, hash-verified folder holding one dLLM's predictors.

``save_bundle`` writes it, ``load_bundle`` verifies and loads it (never unpickling anything),
``Bundle.check`` refuses a bundle trained for another model or decoding setting,
``update_bundle`` changes one atomically (export, recorded evaluation) and ``record_evaluation``
stores metrics and plots in it; ``render_card`` renders its ``README.md``. The format is
documented in ``docs/bundle-format.md``.
"""

from .bundle import (
    ADMISSION_SOURCES,
    Bundle,
    load_bundle,
    mean_with_dws,
    read_manifest,
    save_bundle,
)
from .card import render_card
from .format import FORMAT_VERSION, LIBRARY_REQUIREMENT, verify_files
from .record import record_evaluation
from .resolve import resolve_bundle_path
from .update import BundleDraft, update_bundle

__all__ = [
    "ADMISSION_SOURCES",
    "FORMAT_VERSION",
    "LIBRARY_REQUIREMENT",
    "Bundle",
    "BundleDraft",
    "load_bundle",
    "mean_with_dws",
    "read_manifest",
    "record_evaluation",
    "render_card",
    "resolve_bundle_path",
    "save_bundle",
    "update_bundle",
    "verify_files",
]
