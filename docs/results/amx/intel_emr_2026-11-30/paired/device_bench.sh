#!/bin/bash
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{ grep -m1 'model name' /proc/cpuinfo; nproc; date -u; uptime; } 2>&1 | tee $OUT/env.txt
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site
cmake -S . -B /tmp/b -G Ninja -DPython_EXECUTABLE=$(command -v python3) > $OUT/build.log 2>&1 && ninja -C /tmp/b >> $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 4; }
cp /tmp/b/_kernels*.so /tmp/b/_core*.so src/recallspec/
export PYTHONPATH=/tmp/site:$PWD/src
timeout 100 python3 benchmarks/experiments/exp_rows_cost.py --shape smollm2-1.7b --layers 8 --rows 1 9 10 12 16 24 32 64 512 --variants avx512 avx512-amx --threads 2 --repeats 9 --out $OUT/rows_cost_17b 2>&1 | tail -21
timeout 60 python3 benchmarks/experiments/exp_rows_cost.py --shape llama-3.1-8b --layers 3 --rows 1 9 16 32 64 --variants avx512 avx512-amx --threads 2 --repeats 9 --out $OUT/rows_cost_8b 2>&1 | tail -13
