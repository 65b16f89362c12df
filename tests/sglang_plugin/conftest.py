"""The SGLang integration suite: runs in .venv-sglang (``make test-sglang``), skipped elsewhere.

SGLang 0.5.23 imports torchvision, whose package-index build is a CUDA build that registers
fake kernels for two ops at import; on a CPU torch those ops must exist first.
"""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("sglang") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    from harness import install_torchvision_shim

    install_torchvision_shim()


@pytest.fixture(autouse=True)
def _fresh_hooks():
    """Every test starts and ends with SGLang unpatched and its plugins not loaded."""
    from harness import remove_hooks

    remove_hooks()
    yield
    remove_hooks()
