"""Drafter specs are parsed once into a typed object, and a request's sizing is what it
states, else the engine config's mode, else cost-aware for a named drafter (plain
decoding is never sized). A mode is a sizing: EMS-SD's batch layouts are refused with a
message naming the benchmark module they live in."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers import BigramModel, ByteTokenizer

from recallspec.cost.curve import CostCurve
from recallspec.decoding.sampling import SamplingParams
from recallspec.drafters.spec import DrafterSpec
from recallspec.engine import Engine, EngineConfig, GenerationResult
from recallspec.errors import DataError, UnknownNameError


def test_a_spec_is_parsed_once_into_a_typed_object() -> None:
    spec = DrafterSpec.parse("sam:index=a.rsidx:delta=3:tree=true:mode=fixed")
    assert spec.name == "sam" and spec.sizing == "fixed"
    assert spec.kwargs == {"index": "a.rsidx", "delta": 3, "tree": True}
    assert DrafterSpec.parse(str(spec)) == spec
    assert DrafterSpec.parse("pld").sizing is None  # not stated: the engine decides
    assert DrafterSpec.parse("portfolio:mode=adaptive") == DrafterSpec.parse(
        "portfolio:sizing=adaptive")
    assert DrafterSpec.parse("pld:mode=ems").sizing == "fixed"  # how older specs said it
    assert DrafterSpec.parse("none:mode=adaptive").sizing == "fixed"  # nothing to size
    assert DrafterSpec.parse("sam+recycling:delta=3") == DrafterSpec.of("sam+recycling",
                                                                        {"delta": 3})
    with pytest.raises(UnknownNameError, match=r"sizing.*bench\.suite\.padded_layouts"):
        DrafterSpec.parse("pld:mode=vanilla")  # a batch layout is a benchmark ablation
    with pytest.raises(DataError, match="key=value"):
        DrafterSpec.parse("pld:3")


def _engine(**cfg: Any) -> Engine:
    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3
    eng = Engine(BigramModel(table), ByteTokenizer(), EngineConfig(**cfg))  # type: ignore[arg-type]
    eng.use_cost_curve(CostCurve((1, 64), (1.0, 1.2), 0.0))
    return eng


def _sizing(eng: Engine, **kw: Any) -> str:
    """The sizing of a request stating ``kw``."""
    rid = eng.add_request(list(b"abcabc"), SamplingParams(max_new_tokens=4), **kw)
    req = eng.scheduler.get(rid)
    assert req is not None
    eng.abort(rid)
    return req.sizing


@pytest.mark.parametrize("word", ["vanilla", "unpad-kv", "unpad-input", "ems"])
def test_a_batch_layout_is_refused_where_a_sizing_is_expected(word: str) -> None:
    """The engine has one batch layout (EMS-SD's, unpadded): a layout word given as a
    mode (the config, ``--mode``, a request, ``generate``) or as a spec's sizing is an
    error that says where the padded layouts live (``ems`` in a spec still reads as
    fixed: older specs and answer files wrote it)."""
    where = r"bench\.suite\.padded_layouts"
    with pytest.raises(UnknownNameError, match=where):
        EngineConfig(mode=word)
    eng = _engine()
    stated: list[dict[str, Any]] = [{"mode": word}, {"mode": word, "sizing": "fixed"}]
    for kw in stated:
        with pytest.raises(UnknownNameError, match=where):
            eng.add_request(list(b"abcabc"), SamplingParams(max_new_tokens=4), drafter="pld",
                            **kw)
        with pytest.raises(UnknownNameError, match=where):
            eng.generate(list(b"abcabc"), SamplingParams(max_new_tokens=4), drafter="pld",
                         **kw)
    assert not eng.has_unfinished()
    if word == "ems":
        assert DrafterSpec.parse("pld:mode=ems").sizing == "fixed"
        with pytest.raises(UnknownNameError, match="'fixed'"):
            EngineConfig(mode=word)  # the message names the sizing it meant
    else:
        with pytest.raises(UnknownNameError, match=where):
            DrafterSpec.parse(f"pld:mode={word}")


def test_a_named_drafter_is_sized_cost_aware_unless_told() -> None:
    eng = _engine()
    assert _sizing(eng, drafter="pld") == "adaptive"
    assert _sizing(eng, drafter=DrafterSpec.parse("pld:mode=fixed")) == "fixed"
    assert _sizing(eng, drafter="pld", mode="fixed") == "fixed"
    assert _sizing(eng, drafter="pld", mode="fixed", sizing="adaptive") == "adaptive"
    assert _sizing(eng, drafter="pld", mode="adaptive") == "adaptive"
    assert _sizing(eng) == "fixed"  # the config's default drafter: none
    assert _sizing(eng, drafter="none", mode="adaptive") == "fixed"
    with pytest.raises(UnknownNameError):
        _sizing(eng, drafter="pld", sizing="bogus")
    assert not eng.has_unfinished()
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    ar = eng.generate(list(b"the cat sat on the mat; the cat"), params)
    sp = eng.generate(list(b"the cat sat on the mat; the cat"), params, drafter="pld")
    assert isinstance(ar, GenerationResult) and isinstance(sp, GenerationResult)
    assert sp.token_ids == ar.token_ids


def test_the_config_ranks_below_the_request_and_above_the_default() -> None:
    eng = _engine(mode="fixed", drafter="llma:mode=adaptive")
    assert _sizing(eng, drafter="pld") == "fixed"  # the config's mode
    assert _sizing(eng, drafter=DrafterSpec.parse("pld:mode=adaptive")) == "adaptive"
    # A spec's text given to the Python API is parsed as the command line parses it.
    assert _sizing(eng, drafter="pld:mode=adaptive") == "adaptive"
    assert _sizing(eng, drafter="pld", mode="adaptive") == "adaptive"
    assert _sizing(eng) == "fixed"  # the config's mode over its spec's sizing
    eng = _engine(drafter="llma:mode=fixed")
    assert _sizing(eng) == "fixed"  # the config's spec
    assert _sizing(eng, drafter="llma") == "adaptive"  # named anew: the default
    with pytest.raises(UnknownNameError, match="mode"):
        EngineConfig(mode="nope")
    with pytest.raises(ValueError, match="kv_dtype"):
        EngineConfig(kv_dtype="int8")  # type: ignore[arg-type]


@pytest.mark.parametrize(("drafter", "mode", "measures"), [
    ("none", None, False),  # `serve --drafter none`: plain decoding never measures
    ("none", "adaptive", False),  # nothing to size, whatever the mode
    ("pld", None, True),  # a named drafter: cost-aware by default
    ("pld:mode=fixed", None, False),
    ("pld", "fixed", False),
    ("pld:mode=fixed", "adaptive", True),  # the config's mode over its spec's sizing
])
def test_serve_measures_the_cost_curve_at_start_only_for_cost_aware_drafting(
    drafter: str, mode: str | None, measures: bool,
) -> None:
    """``recallspec serve`` measures the cost curve before serving only where the default
    drafting (a request naming no drafter) drafts and is sized cost-aware; deciding it
    measures nothing."""
    from recallspec.cli.serve import measures_at_start

    table = torch.randn(256, 256, generator=torch.Generator().manual_seed(0)) * 3
    eng = Engine(BigramModel(table), ByteTokenizer(),  # type: ignore[arg-type]
                 EngineConfig(drafter=drafter, mode=mode))
    assert measures_at_start(eng) is measures
    assert eng.curves.state == "none"  # decided, not measured


def test_serve_refuses_a_bad_default_drafter_at_start() -> None:
    from recallspec.cli.serve import measures_at_start

    eng = _engine(drafter="warp")
    with pytest.raises(UnknownNameError, match="warp"):
        measures_at_start(eng)
