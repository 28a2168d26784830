# One entry point for everything: `make test` and `make demo` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: venv test demo crds check-crds lint clean

venv: $(STAMP)

# torch==2.13.0 resolves to the CPU wheel on this machine's disk; never pull a CUDA build into CI.
$(STAMP): operator/pyproject.toml trainer-image/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e 'operator[test]' -e 'trainer-image[test]'
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest $(PYTEST_ARGS)

crds: venv
	$(BIN)/ddpjob crd > crds/ddpjobs.elastic.ddp.dev.yaml

check-crds: venv
	$(BIN)/ddpjob crd | diff -u crds/ddpjobs.elastic.ddp.dev.yaml -

clean:
	rm -rf $(VENV) .pytest_cache .ddpjob
