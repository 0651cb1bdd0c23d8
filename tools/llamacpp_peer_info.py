#!/usr/bin/env python
"""Writes peer.json, the record of how ``make peers`` built native llama.cpp.

  python tools/llamacpp_peer_info.py --out BIN/peer.json --build BUILD_DIR \\
      --llama-cpp-python 0.3.36 --commit 0c1e570 -- CMAKE_ARGS...

Recorded: the llama-cpp-python sdist the source came from, the llama.cpp commit, the
cmake arguments, the compilers cmake chose (from the build's CMakeCache.txt) with their
``--version``, the cmake and ninja versions, and what ``llama-server --version`` says
(the commit it was built with). ``recallspec.bench.common.llamacpp.peer_info`` reads it back.
No import of recallspec: it runs right after the build, from the Makefile.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path


def _first_line(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({type(e).__name__})"
    text = (out.stdout or out.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _cache(build: Path) -> dict[str, str]:
    """KEY -> value of the build's CMakeCache.txt (``KEY:TYPE=value`` lines)."""
    out: dict[str, str] = {}
    for line in (build / "CMakeCache.txt").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith(("#", "//")) and "=" in line and ":" in line:
            key, value = line.split("=", 1)
            out[key.split(":", 1)[0]] = value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--llama-cpp-python", required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("cmake_args", nargs="*")
    args = ap.parse_args()
    out, build = Path(args.out), Path(args.build)
    cache = _cache(build)
    cc, cxx = cache.get("CMAKE_C_COMPILER", "cc"), cache.get("CMAKE_CXX_COMPILER", "c++")
    server = out.parent / "llama-server"
    version = subprocess.run([str(server), "--version"], capture_output=True, text=True,
                             timeout=60, check=False)
    info = {
        "llama_cpp_python": args.llama_cpp_python,
        "source": f"llama-cpp-python {args.llama_cpp_python} sdist, vendor/llama.cpp",
        "llama_cpp_commit": args.commit,
        "cmake_args": list(args.cmake_args),
        "c_compiler": f"{cc}: {_first_line([cc, '--version'])}",
        "cxx_compiler": f"{cxx}: {_first_line([cxx, '--version'])}",
        "cmake": _first_line(["cmake", "--version"]),
        "ninja": _first_line(["ninja", "--version"]),
        "server_version": " | ".join(
            line.strip() for line in (version.stdout + version.stderr).splitlines()
            if line.strip()),
        "binaries": sorted(p.name for p in out.parent.iterdir() if p.name.startswith("llama-")),
        "built": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    out.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
