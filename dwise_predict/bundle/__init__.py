"""Predictor bundles: a versioned, hash-verified folder holding one dLLM's predictors.

``save_bundle`` writes it, ``load_bundle`` verifies and loads it (never unpickling anything),
``Bundle.check`` refuses a bundle trained for another model or decoding setting. The format is
documented in ``docs/bundle-format.md``.
"""

from .bundle import Bundle, load_bundle, read_manifest, save_bundle
from .format import FORMAT_VERSION, LIBRARY_REQUIREMENT
from .resolve import resolve_bundle_path

__all__ = ["FORMAT_VERSION", "LIBRARY_REQUIREMENT", "Bundle", "load_bundle", "read_manifest", "resolve_bundle_path",
           "save_bundle"]
