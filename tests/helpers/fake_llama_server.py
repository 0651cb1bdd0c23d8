"""A stand-in for native llama.cpp's binaries, for tests that must run without them.

``install(directory)`` writes ``llama-server`` and ``llama-bench`` scripts there (point
``RECALLSPEC_LLAMACPP_BIN`` at it). The server answers ``/health`` and ``/completion``
like llama-server (token ids, ``stop_type``, ``timings``; with ``cache_prompt`` only
the tokens past the cached prompt are evaluated, 1 ms each) and, once it has answered
``$FAKE_LLAMA_CRASH_AFTER`` completions, segfaults (a real SIGSEGV) on the next one.
llama-bench prints one JSON row per ``-p`` and ``-n`` value (100 tokens/s each).
"""

from __future__ import annotations

import sys
from pathlib import Path

SERVER = r'''
import json, os, signal, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

port = int(sys.argv[sys.argv.index("--port") + 1])
crash_after = int(os.environ.get("FAKE_LLAMA_CRASH_AFTER", "1000000"))
answered = 0
cache = []  # the slot's prompt cache: the last prompt
print("main: system_info: n_threads = 1 | FAKE = 1 |", file=sys.stderr, flush=True)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, obj, code=200):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send({"status": "ok"} if self.path == "/health" else {}, 200)

    def do_POST(self):
        global answered, cache
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if answered >= crash_after:
            print("fake llama-server: about to crash", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        answered += 1
        prompt, n = body["prompt"], body["n_predict"]
        ids = [(t % 200) + 1 for t in prompt[-n:]]
        # cache_prompt: like llama-server, only the tokens past the common prefix with the
        # cached prompt are evaluated (at least one), each costing 1 ms; else 2 ms in all.
        reuse = 0
        if body.get("cache_prompt"):
            while reuse < min(len(cache), len(prompt) - 1) and cache[reuse] == prompt[reuse]:
                reuse += 1
        cache = list(prompt)
        n_eval = len(prompt) - reuse
        timings = {"prompt_n": n_eval, "prompt_ms": float(n_eval) if reuse else 2.0,
                   "predicted_n": len(ids), "predicted_ms": 8.0}
        self._send({"tokens": ids, "stop_type": "limit", "timings": timings,
                    "tokens_evaluated": len(prompt)})


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''

BENCH = r'''
import json, sys
argv = sys.argv
arg = lambda flag: [int(x) for x in argv[argv.index(flag) + 1].split(",")]
depth = arg("-d")[0]
rows = [{"n_prompt": p, "n_gen": 0, "n_depth": depth, "avg_ns": p * 1e6} for p in arg("-p") if p]
rows += [{"n_prompt": 0, "n_gen": g, "n_depth": depth, "avg_ns": g * 1e7} for g in arg("-n") if g]
for r in rows:
    r.update(avg_ts=100.0, stddev_ts=1.0, build_commit="fake", cpu_info="fake")
print(json.dumps(rows))
'''


def install(directory: Path) -> Path:
    """Writes the fake ``llama-server`` and ``llama-bench`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("llama-server", SERVER), ("llama-bench", BENCH)):
        p = directory / name
        p.write_text(f"#!{sys.executable}\n{text}")
        p.chmod(0o755)
    return directory
