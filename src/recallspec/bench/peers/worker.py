"""The child process that runs one Python peer (``hf-*``, ``llamacpp-py-*``).

Native llama.cpp, the benchmark peer (``llamacpp-*``), is a server of its own
(``bench/common/llamacpp.py``); this worker runs transformers (``hf-greedy`` /
``hf-pld``) and llama-cpp-python, the Python binding (``llamacpp-py-greedy`` /
``llamacpp-py-pld``: only for benchmarks/experiments/exp_quant_quality.py's perplexity,
after ``make peers-py``; its Python generation loop is not llama.cpp's own speed and is
never reported as llama.cpp).

Peers run out of our process: llama-cpp-python crashes when loaded beside torch and our
kernels, and a native peer that segfaults must fail alone instead of taking the
benchmark down. The parent (``bench/peers/methods.py``) starts ``python .../peers/worker.py
METHOD MODEL THREADS DTYPE`` (a script, so the llama-cpp-python child never imports our
package or torch) and talks JSON lines over the pipes:

  parent -> child   {"prompt_ids": [...], "max_new_tokens": n, "temperature": t,
                     "top_p": p, "top_k": k, "seed": s, "ignore_eos": b, "eos": [...]}
  child -> parent   {"token_ids": [...], "accept_lengths": [...], "wall_time": s,
                     "finish_reason": "eos" | "length"}      (or {"error": "..."})
  parent -> child   {"op": "nll", "tokens": [...]}       (llamacpp-py-pld: logits_all)
  child -> parent   {"nll": summed NLL of tokens[1:], "count": n - 1}

The first line the child writes is {"ready": true, "info": {...}} once the model is loaded.
Only the llama-cpp-python path is kept free of torch: it imports nothing but numpy and
llama_cpp; an ``hf-*`` child runs ``bench/peers/hf.HFWorker``.
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import numpy as np

# Prompt-lookup draft length of llamacpp-py-pld; equal to bench/peers/hf.HF_PLD_TOKENS
# (hf-pld), written again: the llama-cpp-python child must not import our package (torch).
HF_PLD_TOKENS = 10


class _Runner(Protocol):
    info: dict[str, Any]

    def generate(self, req: dict[str, Any]) -> dict[str, Any]: ...


class _LlamaCppPython:
    def __init__(self, name: str, gguf_path: str, threads: int, n_ctx: int = 4096) -> None:
        # Here, not at the top: llama-cpp-python is an optional peer (make peers-py) that
        # the hf-* children do not have.
        from llama_cpp import Llama

        draft = None
        if name == "llamacpp-py-pld":
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = LlamaPromptLookupDecoding(num_pred_tokens=HF_PLD_TOKENS)
        # Greedy decoding needs the last position's logits only (logits_all=False, as a
        # user opens it); prompt lookup verifies several positions per eval, so the
        # speculative path needs every position's logits.
        self.llm = Llama(
            model_path=gguf_path, n_ctx=n_ctx, logits_all=draft is not None,
            draft_model=draft, n_threads=threads, n_threads_batch=threads, verbose=False,
        )
        self.info = {"llama_cpp_python": _version("llama_cpp"), "logits_all": draft is not None,
                     "threads": threads}

    def nll(self, req: dict[str, Any]) -> dict[str, Any]:
        """Summed negative log-likelihood of tokens[1:] given their prefixes (needs a model
        opened with logits_all=True: llamacpp-py-pld's child)."""
        toks = [int(t) for t in req["tokens"]]
        self.llm.reset()
        self.llm.eval(toks)
        logits = np.asarray(self.llm.scores[: len(toks) - 1], dtype=np.float64)
        m = logits.max(axis=1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        picked = logits[np.arange(len(toks) - 1), toks[1:]]
        return {"nll": float((logz - picked).sum()), "count": len(toks) - 1}

    def generate(self, req: dict[str, Any]) -> dict[str, Any]:
        eos = set(req["eos"])
        gen: list[int] = []
        finish = "length"
        temp = float(req["temperature"])
        self.llm.reset()
        t0 = time.perf_counter()
        for tok in self.llm.generate(
            req["prompt_ids"], temp=temp, top_k=int(req["top_k"]) if temp > 0 else 1,
            top_p=float(req["top_p"]), reset=True,
        ):
            if tok in eos and not req["ignore_eos"]:
                finish = "eos"
                break
            gen.append(int(tok))
            if len(gen) >= int(req["max_new_tokens"]):
                break
        wall = time.perf_counter() - t0
        # llama-cpp-python does not expose per-step acceptance: left empty.
        return {"token_ids": gen, "accept_lengths": [], "wall_time": wall,
                "finish_reason": finish}


def _version(pkg: str) -> str:
    try:
        return version(pkg.replace("_", "-") if pkg == "llama_cpp" else pkg)
    except PackageNotFoundError:
        return "unknown"


def _send(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: worker.py METHOD MODEL|- THREADS DTYPE", file=sys.stderr)
        return 2
    name, model, threads = argv[0], (None if argv[1] == "-" else argv[1]), int(argv[2])
    dtype = argv[3]
    runner: _Runner
    if name in ("llamacpp-py-greedy", "llamacpp-py-pld"):
        if model is None:
            print("llamacpp-py methods need a GGUF path", file=sys.stderr)
            return 2
        runner = _LlamaCppPython(name, model, threads)
    elif name.startswith("hf-"):
        # Here, not at the top: only an hf-* child may import our package (and torch).
        from recallspec.bench.peers.hf import HFWorker

        runner = HFWorker(name, model, threads, dtype)
    else:
        print(f"unknown peer method {name!r}", file=sys.stderr)
        return 2
    _send({"ready": True, "info": runner.info})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            op = req.get("op", "generate")
            if op == "nll" and isinstance(runner, _LlamaCppPython):
                out = runner.nll(req)
            elif op == "generate":
                out = runner.generate(req)
            else:
                out = {"error": f"unsupported op {op!r}"}
        except Exception as e:  # report and keep serving: one bad prompt is not a crash
            out = {"error": f"{type(e).__name__}: {e}"}
        _send(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
