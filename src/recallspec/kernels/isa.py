"""Which instruction-set path the C++ kernels run.

``RECALLSPEC_KERNELS`` = ``auto`` (default) | ``avx512`` | ``avx2`` | ``scalar`` (or, for
measurements, one of the variants below) is read once, at import. ``auto`` takes the
best path this CPU has: ``avx512`` (AVX-512 F/BW/VL, with VNNI for the quantized kernels
where present; ``avx512-amx`` where AMX-INT8 tiles are present too and the OS grants
them), ``avx2`` (AVX2 + FMA + F16C, with AVX-VNNI for the quantized kernels where
present: laptops since Intel's 12th generation and AMD's Zen 5), else ``scalar``.
Naming a path the CPU lacks is an error at import (a forced run must not silently test
something else).

Every path gives the same bits for the same row (the kernels fix the order of every
floating-point operation), so the choice changes speed only; tests run all available
paths and compare. The C++ functions take the path as an explicit code (see ``code``):
nothing in C++ reads the environment.
"""

from __future__ import annotations

import os

from recallspec import _kernels

ENV_VAR = "RECALLSPEC_KERNELS"
CHOICES = ("auto", "avx512", "avx2", "scalar")

# Kernel variants and their C++ codes (kernel_common.h). A path runs its VNNI variant
# where the CPU has one: "avx512" is AVX-512 VNNI there, "avx2" AVX-VNNI. Tests select
# the others explicitly to cover them: "avx512-novnni" and "avx2-novnni" (the products
# without vpdpbusd) on a VNNI machine, and "avx2-vnni-evex", the AVX-VNNI product compiled
# as AVX-512 VL instructions, which CPUs with AVX-512 VNNI but without AVX-VNNI (Zen 4)
# run.
# On CPUs with AMX-INT8 tiles (Intel Sapphire Rapids and later) whose OS grants them,
# "avx512-amx" is the VNNI path with AMX tiles for products of 10-32 rows (qgemm_amx.cpp:
# faster than the VNNI path there, the same bits); ``auto`` picks it there.
_CODES = {"scalar": 0, "avx2-novnni": 1, "avx512-novnni": 2, "avx512": 3, "avx2": 4,
          "avx2-vnni-evex": 5, "avx512-amx": 6}
_NAMES = {"scalar": "portable C++, no SIMD", "avx2": "AVX2, FMA, F16C", "avx512": "AVX512F/BW/VL"}


class KernelIsaError(RuntimeError):
    """The requested instruction-set path cannot run on this CPU (or is unknown)."""


def _has(variant: str) -> bool:
    return bool(_kernels.cpu_has_isa(_CODES[variant]))


HAS_VNNI: bool = _has("avx512")  # AVX-512 VNNI (implies the AVX-512 path)
HAS_AVX_VNNI: bool = _has("avx2")  # AVX-VNNI (the VEX encoding, on AVX2 machines)
HAS_AMX: bool = _has("avx512-amx")  # AMX-TILE + AMX-INT8, granted by the OS


def available_isas() -> list[str]:
    """The paths this CPU can run, best first (``scalar`` is always last)."""
    return [name for name in ("avx512", "avx2", "scalar") if _has(
        name if name == "scalar" else f"{name}-novnni")]


def variants() -> list[str]:
    """Every kernel variant this CPU can run, for tests: the paths of
    ``available_isas``, each followed by its variant without VNNI where the CPU has VNNI,
    ``avx512-amx`` where the CPU runs it, and ``avx2-vnni-evex`` where the CPU runs it."""
    out: list[str] = []
    for name in available_isas():
        out.append(name)
        if (name == "avx512" and HAS_VNNI) or (name == "avx2" and HAS_AVX_VNNI):
            out.append(f"{name}-novnni")
        if name == "avx512" and HAS_AMX:
            out.append("avx512-amx")
        if name == "avx2" and _has("avx2-vnni-evex"):
            out.append("avx2-vnni-evex")
    return out


def _choose(requested: str) -> str:
    """A path of ``CHOICES`` (``auto``: the best available), or, for measurements, one
    of the kernel variants (e.g. ``avx2-novnni`` on an AVX-VNNI laptop)."""
    req = requested.strip().lower() or "auto"
    if req not in CHOICES and req not in _CODES:
        raise KernelIsaError(f"{ENV_VAR}={requested!r}: expected one of {', '.join(CHOICES)} "
                             f"(or a variant: {', '.join(sorted(set(_CODES) - set(CHOICES)))})")
    avail = available_isas()
    if req == "auto":
        return "avx512-amx" if avail[0] == "avx512" and HAS_AMX else avail[0]
    runnable = variants()
    if req not in runnable:
        raise KernelIsaError(
            f"{ENV_VAR}={req}: this CPU ({cpu_model()}) cannot run it; available: "
            f"{', '.join(runnable)}"
        )
    return req


def code(isa: str | None = None) -> int:
    """The C++ code of a path or variant (default: ``ISA``); ``avx512`` means VNNI where
    the CPU has it. Refuses a variant this CPU cannot run. (Called per product: a dict
    lookup once the module is imported.)"""
    c = _RUNNABLE.get(ISA if isa is None else isa)
    if c is None:
        if isa not in _CODES:
            raise KernelIsaError(f"unknown kernel path {isa!r}; expected one of {sorted(_CODES)}")
        raise KernelIsaError(f"this CPU cannot run the {isa} kernels")
    return c


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block only
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown CPU" where there is none)."""
    return _cpuinfo().get("model name", "unknown CPU")


def cpu_identity() -> str:
    """``cpu_model()`` with the CPU's family / model / stepping numbers: a hypervisor may
    show one model name for several generations (these machines' "AMD EPYC" was a Zen 4
    one day and a Zen 5 another), and what was measured on one does not hold on the
    other."""
    fields = _cpuinfo()
    numbers = "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
    return f"{fields.get('model name', 'unknown CPU')} ({numbers})"


def kernels_build() -> str:
    """The compiled kernels' identity: size and modification time of the extension
    file. A rebuild (other kernels, other speeds) invalidates what was measured on the
    old build (the cost curve's cache)."""
    st = os.stat(_kernels.__file__)
    return f"{st.st_size}:{st.st_mtime_ns}"


def describe(isa: str | None = None) -> str:
    """One line for test headers and benchmark reports: the CPU (``cpu_identity``), the
    chosen path and the instruction sets its kernels use, e.g. ``AMD EPYC (25/17/1);
    kernels avx512 (AVX512F/BW/VL, VNNI)``."""
    name = ISA if isa is None else isa
    sets = _NAMES.get(name.removesuffix("-novnni").removesuffix("-vnni-evex").removesuffix("-amx"),
                      name)
    if name == "avx512" and HAS_VNNI:
        sets += ", VNNI"
    elif name == "avx512-amx":
        sets += ", VNNI, AMX-INT8"
    elif name == "avx2" and HAS_AVX_VNNI:
        sets += ", AVX-VNNI"
    elif name == "avx2-vnni-evex":
        sets += ", VNNI as AVX-512 VL"
    if name.startswith("avx512") and bool(_kernels.has_avx512_bf16()):
        sets += ", BF16"
    return f"{cpu_identity()}; kernels {name} ({sets})"


ISA: str = _choose(os.environ.get(ENV_VAR, "auto"))
# Variant -> C++ code for what this CPU runs (a path resolved to VNNI where present).
_RUNNABLE: dict[str, int] = {
    v: _CODES[f"{v}-novnni" if (v == "avx512" and not HAS_VNNI)
              or (v == "avx2" and not HAS_AVX_VNNI) else v] for v in variants()
}
