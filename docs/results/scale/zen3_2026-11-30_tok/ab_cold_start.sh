#!/usr/bin/env bash
# First-run time to first token, before (A) and after (B) in alternation: each round
# lays one variant's files over src/recallspec/ (A_DIR and B_DIR mirror its layout: the
# files that differ) and runs benchmarks/experiments/exp_cold_start.py once (ours first run, later run,
# llama-server), each process after PAUSE idle seconds (default 5: exp_cold_start.py
# --pause, why there). src/recallspec/ is restored on exit.
# Usage: ab_cold_start.sh GGUF ROUNDS OUT A_DIR B_DIR
set -euo pipefail
gguf=$1 rounds=$2 out=$3 a=$4 b=$5 pause=${PAUSE:-5}
target=src/recallspec
keep=$(mktemp -d); cp -r "$target/." "$keep/"
restore() { rm -rf "$target"; mkdir -p "$target"; cp -r "$keep/." "$target/"; }
trap restore EXIT
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in A B; do
    src=$a; [ "$v" = B ] && src=$b
    restore; cp -r "$src/." "$target/"
    env -u PYTHONDONTWRITEBYTECODE .venv/bin/python benchmarks/experiments/exp_cold_start.py --model "$gguf" \
      --threads 2 --repeats 1 --pause "$pause" --out "$out/$v-$r" > "$out/$v-$r.log" 2>&1
    echo "round $r $v: $(grep -h 'first token s' "$out/$v-$r/cold_start.md")"
  done
done
