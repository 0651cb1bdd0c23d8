"""`recallspec serve` against llama-server, later runs: process start to /health and to
the first completion token, alternated, every process after 5 s idle.

    .venv/bin/python docs/results/scale/zen3_2026-11-30_later/serve_vs_llamaserver.py \\
        GGUF ROUNDS OUT.json

Run the model once before (its repack cache and cost curve cached), alone on the machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from recallspec.bench.scale.cold_start import PROMPT, llamacpp_once

PORT = 18089


def ours_once(gguf: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "recallspec.cli", "serve", "--model", str(gguf),
                             "--port", str(PORT)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        health = time.perf_counter() - t0
        body = json.dumps({"model": str(gguf), "prompt": PROMPT, "max_tokens": 1}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/completions", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            assert r.status == 200
        return {"health_s": health, "first_token_s": time.perf_counter() - t0}
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    gguf, rounds, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    ours, peer = [], []
    for i in range(rounds):
        time.sleep(5)
        ours.append(ours_once(gguf))
        time.sleep(5)
        peer.append(llamacpp_once(gguf, 2))
        print(i, ours[-1], peer[-1], flush=True)

    def med(xs: list[dict[str, float]], k: str) -> float:
        return statistics.median(x[k] for x in xs)

    m = {"ours_health": med(ours, "health_s"), "ours_first": med(ours, "first_token_s"),
         "peer_ready": med(peer, "ready_s"), "peer_first": med(peer, "first_token_s")}
    m["ratio_first"] = m["ours_first"] / m["peer_first"]
    print(json.dumps(m))
    out.write_text(json.dumps({"model": str(gguf), "ours_serve": ours, "llama_server": peer,
                               "median": m}, indent=1))


if __name__ == "__main__":
    main()
