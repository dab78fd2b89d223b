# Two commands a fresh machine needs: `make demo` and `make test`. Both set up .venv first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.headedit-installed
# CPU wheel by default (it lies on disk here); for a GPU: make TORCH_SPEC="torch==2.13.0 --index-url ..." or install torch yourself first.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup test test-fast demo clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -ra

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

demo: $(STAMP)
	$(VENV)/bin/headedit demo

clean:
	rm -rf $(VENV) runs exports
