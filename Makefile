# Two commands do all set-up on a fresh machine:
#   make demo   - trains a real model across 4 simulated devices
#   make test   - runs every test (Python core, R package, shared scenarios)
SHELL := /bin/bash
PYTHON_BOOT ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PY_STAMP := $(VENV)/.installed
# TensorFlow's C++ start-up chatter; errors still print.
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-python setup setup-python

setup: setup-python

setup-python: $(PY_STAMP)

$(PY_STAMP): pyproject.toml
	$(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet -e ".[cpu,test,demo]"
	touch $@

demo: setup-python
	$(PY) -m multigpu.demo --devices 4

test: test-python

test-python: setup-python
	$(PY) -m pytest -q
