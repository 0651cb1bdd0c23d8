"""What every bench report shares: a figure as a table cell, the line naming the native
llama.cpp build that answered, matplotlib where it is installed, and a run's report on
the terminal.

The tables themselves are written by ``recallspec.markdown`` (cells passed raw: it escapes
the pipes inside them). A figure that was not measured reads as "-".
"""

from __future__ import annotations

import sys
from typing import Any


def num(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    """``x`` formatted by ``spec`` with ``suffix`` after it (``num(1.5, ".2f", "x")`` is
    ``1.50x``); "-" for None."""
    return "-" if x is None else f"{x:{spec}}{suffix}"


def cmake_flags(peer: dict[str, Any], shown: tuple[str, ...] = ("-D",)) -> str:
    """The cmake arguments of a native llama.cpp build (``llamacpp.peer_info``'s dict)
    that start with one of ``shown``, space-separated."""
    return " ".join(a for a in peer.get("cmake_args", []) if a.startswith(shown))


def peer_line(peer: dict[str, Any] | None) -> list[str]:
    """The Markdown line naming a native llama.cpp build (``peer_info``'s dict with a
    ``recorded_by``), then a blank line; [] without one."""
    if not peer:
        return []
    # The ISA flags, and a Release optimization other than CMake's (a CI build's -O1).
    flags = cmake_flags(peer, ("-DGGML", "-DCMAKE_C_FLAGS_RELEASE",
                               "-DCMAKE_CXX_FLAGS_RELEASE"))
    return [f"peer: native llama.cpp commit `{peer.get('llama_cpp_commit', '?')}` "
            f"({peer.get('source', '?')}), `{flags}`; "
            f"{peer.get('system_info') or 'system_info not recorded'} "
            f"({peer.get('recorded_by')})", ""]


def pyplot() -> Any | None:
    """matplotlib's pyplot on the file-only Agg backend; None without matplotlib.

    Imported here, on a report's first plot: matplotlib is optional (the ``plots``
    extra) and slow to import, so a report without plots never loads it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def print_report(markdown: str, machine: dict[str, Any], written: str) -> None:
    """A run's report on stdout; a busy-machine warning and where the files are on stderr."""
    # machine.py imports torch: here, when a run has finished, not while the CLI builds
    # its parsers (the sub-commands' cli.py import this module).
    from recallspec.bench.common.machine import busy_warning

    print(markdown)
    warn = busy_warning(machine)
    if warn:
        print(warn, file=sys.stderr)
    print(written, file=sys.stderr)
