"""Benchmark methods: what a method name means, and what answering one turn returns.

A method is one way of generating a turn from prompt token ids (``Method``; the suite's
are built by ``bench/suite/methods.py``, the peers' run in child processes,
``bench/peers/``).

Names:
  ``ar``                      our engine, no drafter (the run's reference)
  any registered drafter      our engine with that drafter (``pld``, ``llma``, ...)
  ``hf-greedy`` / ``hf-pld``  transformers ``generate`` on the same (fp32 reference)
                              weights and prompt ids (``prompt_lookup_num_tokens=10``)
  ``llamacpp-greedy``         native llama.cpp (``llama-server``, built by ``make peers``)
                              on the GGUF file: same prompt ids and threads, flash
                              attention on, prompt cache off, one slot (its own
                              quantised kernels: NOT the same arithmetic, so only its
                              speedup vs its own greedy counts)
  ``llamacpp-<type>``         the same server with its n-gram speculation ``--spec-type
                              <type>`` (``ngram-simple``, ``ngram-mod``, ``ngram-map-k``,
                              ``ngram-map-k4v``, ``ngram-cache``); baseline
                              ``llamacpp-greedy``, whose answers they should repeat

Our engine's methods are drafter specs (``drafters/spec.py``): options after the name,
``:key=value`` each, and the draft sizing, cost-aware unless ``:mode=fixed`` (e.g.
``sam+recycling:index=corpus.rsidx:delta=3``, ``pld:mode=fixed``). Values are ints,
floats, true/false/none or strings. The method's name, as written, labels its answers.
A run records in run.json what a method named without a sizing meant
(``SIZING_DEFAULT_KEY``): answers written before cost-aware sizing became the default
hold fixed-size ``pld``; ``recorded_sizing_default`` reads either kind of directory.

Every method's ``baseline`` is its own plain greedy decoding: a peer's speedup and
token identity are measured against that, and ours against ``ar``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from recallspec.bench.common.llamacpp import SPEC_TYPES
from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.spec import NO_DRAFTER, DrafterSpec
from recallspec.errors import DataError
from recallspec.params import DEFAULT_SIZING, SIZINGS, Sizing

HF_METHODS = ("hf-greedy", "hf-pld")
LLAMACPP_METHODS = ("llamacpp-greedy", *(f"llamacpp-{t}" for t in SPEC_TYPES))


@dataclass(frozen=True)
class TurnOutput:
    token_ids: list[int]  # generated ids, EOS excluded
    text: str
    accept_lengths: list[int]  # committed tokens per decoding step after the prefill token
    wall_time: float  # seconds, prefill included
    prompt_tokens: int
    finish_reason: str
    # Our engine's split of the turn (``suite/methods.engine_timing``; None for peers):
    # what policy replay's time model is fitted on (bench/replay/fit.py).
    timing: dict[str, float] | None = None
    # A native llama.cpp peer's own account of the turn (``llamacpp.Completion.record``:
    # the server's timings, its stop type, the client-side time); None otherwise.
    peer: dict[str, Any] | None = None


class Method(Protocol):
    name: str
    baseline: str

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput: ...


# A method named without a sizing (``pld``) is sized as the engine sizes any drafter
# named without one, DEFAULT_SIZING; a run writes that into its run.json's settings under
# this key (``BenchConfig.comparable``). A run.json written before cost-aware sizing became
# the default lacks the key, and its unlabeled methods were sized fixed
# (LEGACY_SIZING_DEFAULT): whoever reads recorded answers (--resume, replay, bench scale's
# prediction) reads an unlabeled method with its own directory's meaning.
SIZING_DEFAULT_KEY = "sizing_default"
LEGACY_SIZING_DEFAULT: Sizing = "fixed"


def recorded_sizing_default(settings: Mapping[str, Any]) -> Sizing:
    """The sizing of a method named without one in the run whose run.json ``settings``
    these are: as recorded; LEGACY_SIZING_DEFAULT where the run.json predates the key;
    DEFAULT_SIZING where there is no run.json ({}: nothing recorded says otherwise)."""
    if not settings:
        return DEFAULT_SIZING
    value = settings.get(SIZING_DEFAULT_KEY, LEGACY_SIZING_DEFAULT)
    for sizing in SIZINGS:
        if value == sizing:
            return sizing
    raise DataError(f"run.json: unknown {SIZING_DEFAULT_KEY} {value!r} "
                    f"(known: {', '.join(SIZINGS)})")


def method_spec(name: str, sizing_default: Sizing | None = None) -> DrafterSpec:
    """A method name parsed into a drafter spec (``ar`` is plain decoding, ``none``).
    ``sizing_default``: the sizing of a name that states none (None: left unstated, for
    the engine to decide, i.e. DEFAULT_SIZING)."""
    spec = DrafterSpec.parse(name)
    if spec.name == "ar":
        return DrafterSpec(NO_DRAFTER, spec.options)
    if spec.sizing is None and sizing_default is not None:
        return replace(spec, sizing=sizing_default)
    return spec


def baseline_of(name: str) -> str:
    if name.startswith("hf-"):
        return "hf-greedy"
    if name.startswith("llamacpp-"):
        return "llamacpp-greedy"
    return "ar"
