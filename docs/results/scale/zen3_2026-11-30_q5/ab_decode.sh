#!/bin/bash
# A/B decode: qlinear old vs new storage choice, alternated; plus llama-bench tg per round.
cd /work/main
G=$1; ROUNDS=$2; OUTF=$3
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for v in $order; do
    cp /tmp/ab/qlinear_$v.py src/recallspec/kernels/qlinear.py
    t=$(RECALLSPEC_CACHE_DIR=/tmp/ab/cache_$v env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m recallspec.bench.scale.ours $G --decode-only --threads 2 --repeats 1 --new-tokens 128 2>/dev/null | tail -1 | python3 -c "import json,sys; print(json.load(sys.stdin)['ar']['decode_tok_s'])")
    echo "round $r $v $t" | tee -a $OUTF
  done
  l=$(.venv/peers/llama.cpp/build/bin/llama-bench -m $G -t 2 -p 0 -n 128 -r 1 -o json 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)[0]['avg_ts'])")
  echo "round $r llamacpp $l" | tee -a $OUTF
done
cp /tmp/ab/qlinear_old.py src/recallspec/kernels/qlinear.py
