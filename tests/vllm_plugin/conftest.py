"""The vLLM integration suite: runs in .venv-vllm (``make test-vllm``), skipped elsewhere.

vLLM 0.33.0 goes in with --no-deps next to the CPU torch (mk/vllm.mk); its scheduler classes run
on CPU with ``VLLM_TARGET_DEVICE=cpu`` and model runner V2 (set before vLLM is imported).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    from vllm_harness import make_model_dir

    return make_model_dir(tmp_path_factory.mktemp("tiny-bd-served"))


@pytest.fixture(scope="session")
def traces():
    """16 eval-split requests with prompts up to 200 tokens, decoded by tiny-bd (a few
    seconds): every category but long contexts, one to eight output blocks."""
    from vllm_harness import tiny_bd_traces

    return tiny_bd_traces(16, max_prompt_tokens=200)
