"""Chat templates from the GGUF: each conformance variant with a family template gets it
from its own GGUF (``tokenizer.chat_template``, written by llama.cpp's converter) with the
family's BOS, EOS and turn-end tokens (``recallspec.conformance.tokenizers.FAMILIES``);
our tokenizer renders it as transformers renders the checkpoint's (the engine the
published templates are written against) and encodes the rendered prompt as llama-server
does.

The references: transformers' tokenizer of the variant's checkpoint directory, loaded as
the class its tokenizer_config.json names (``PreTrainedTokenizerFast`` for the byte-level
BPE ones: transformers 5.x swaps in another class for some model types); llama-server's
handling of a rendered prompt (``common_chat_template_direct_apply`` in llama.cpp's
common/chat.cpp: where the vocabulary puts BOS first itself, a BOS the template wrote is
cut from the text, which is then tokenized with the special tokens on); and, where native
llama.cpp is built, llama-server itself (``/apply-template`` and ``/tokenize``).
"""

from __future__ import annotations

import importlib.util
import json
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import pytest
from helpers.availability import native_peer_or_unavailable, unavailable
from helpers.conformance import built

from recallspec.conformance.tokenizers import FAMILIES, Family, family
from recallspec.conformance.variants import VARIANTS, Variant
from recallspec.models.tokenizer import Tokenizer

TEMPLATED = [v.name for v in VARIANTS.values() if v.template is not None]

SYSTEM = {"role": "system", "content": "You are terse. Answer in one line."}
USER = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT = {"role": "assistant", "content": "Paris."}
USER2 = {"role": "user", "content": "And of Italy? Say it\nin two lines:  Rome & co."}
CONVERSATIONS = {
    "user": [USER],
    "system+user": [SYSTEM, USER],
    "user/assistant/user": [USER, ASSISTANT, USER2],
    "system+user/assistant/user": [SYSTEM, USER, ASSISTANT, USER2],
    "user/assistant": [USER, ASSISTANT],
}

# Where a reference is known to tokenize a rendered prompt otherwise than we do, and why.
# Each is checked still to differ (so that a fix shows as a failure here), then reported
# as an expected failure with its reason.
TRANSFORMERS_DIFFERS = {
    "phi3-mini-4k": (
        "transformers 5.x builds a tokenizer.model's tokenizer with Metaspace "
        "(prepend_scheme='first'): no '▁' before the text after a special token; llama.cpp "
        "(and transformers' own GGUF converter for phi3, which ours follows) put one there, "
        "and llama-server agrees with ours (test_llama_server_renders_and_tokenizes_alike)"),
}
SERVER_DIFFERS = {
    "qwen2.5": (
        "a sentencepiece vocabulary under the qwen2 architecture (a stand-in: published "
        "Qwen is byte-level BPE): llama.cpp puts '▁' before the text after every special "
        "token (add_space_prefix, on by default), transformers' GGUF converter (ours) only "
        "at the start"),
}


@dataclass(frozen=True)
class Case:
    variant: Variant
    family: Family
    ours: Tokenizer
    built: Any


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # (its parent package is not there)
        return False


def _require_modules() -> None:
    for module in ("transformers", "sentencepiece"):
        if not _has_module(module):
            unavailable(f"{module} is not installed")


@pytest.fixture(scope="module", params=TEMPLATED)
def case(request: pytest.FixtureRequest) -> Case:
    from recallspec.models import load_tokenizer

    _require_modules()
    variant = VARIANTS[request.param]
    fam = family(variant)
    assert fam is not None
    b = built(variant.name)
    return Case(variant, fam, load_tokenizer(str(b.f32_gguf)), b)


@cache
def _transformers_tokenizer(name: str) -> Any:
    """transformers' tokenizer of the variant's checkpoint, as the class its
    tokenizer_config.json names (a tokenizer.json's: ``PreTrainedTokenizerFast``)."""
    import transformers

    variant, hf_dir = VARIANTS[name], built(name).hf_dir
    if variant.tokenizer == "bpe":
        return transformers.PreTrainedTokenizerFast.from_pretrained(str(hf_dir))
    if not _has_module("google.protobuf"):
        unavailable("protobuf is not installed: transformers reads the sentencepiece "
                    f"tokenizer.model of {name} only with it")
    cls = json.loads((hf_dir / "tokenizer_config.json").read_text())["tokenizer_class"]
    return getattr(transformers, cls).from_pretrained(str(hf_dir))


def _render(tok: Any, messages: list[dict[str, str]], gen: bool, ours: bool,
            **kwargs: Any) -> str:
    """The rendered text, or ``"raised: <message>"`` where the template refuses the
    conversation (Gemma's refuses a system turn): both must refuse it alike."""
    from jinja2.exceptions import TemplateError

    try:
        if ours:
            return str(tok.apply_chat_template(messages, add_generation_prompt=gen, **kwargs))
        return str(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                           **kwargs))
    except TemplateError as e:
        return f"raised: {e}"


def _server_ids(theirs: Any, fam: Family, text: str) -> list[int]:
    """llama-server's ids of a rendered prompt, with transformers' tokenizer: a vocabulary
    that adds BOS itself gets the template's BOS cut from the text and one put first."""
    bos = fam.gguf_bos
    if fam.add_bos and bos is not None:
        if text.startswith(bos):
            text = text[len(bos):]
        return [int(theirs.convert_tokens_to_ids(bos)),
                *theirs.encode(text, add_special_tokens=False)]
    return list(theirs.encode(text, add_special_tokens=False))


def _same_or_known(name: str, known: dict[str, str], ours: list[int], ref: list[int]) -> None:
    if name in known:
        assert ours != ref, f"{name} now agrees: drop it from the known differences"
        pytest.xfail(known[name])
    assert ours == ref


def test_every_template_has_a_family() -> None:
    assert {v.template for v in VARIANTS.values() if v.template is not None} <= set(FAMILIES)


def test_template_comes_from_the_gguf(case: Case) -> None:
    from recallspec.conformance.checkpoints import llama_cpp_source

    assert case.variant.template is not None
    path = llama_cpp_source() / "models" / "templates" / case.variant.template
    assert case.ours.chat_template == path.read_text(encoding="utf-8")


def test_special_tokens(case: Case) -> None:
    """The family's tokens are single tokens of the GGUF's vocabulary; its BOS and EOS are
    the GGUF's, and every turn-end token stops generation."""
    fam, ours = case.family, case.ours
    for token in (*fam.special, *fam.plain):
        i = ours._tok.token_to_id(token)
        assert i is not None, token
        assert ours.encode(token) == [i] and ours.decode([i]) == token, token
    assert fam.gguf_bos is not None
    assert ours.bos_token == fam.gguf_bos
    assert ours.bos_token_id == ours._tok.token_to_id(fam.gguf_bos)
    assert ours.eos_token == fam.eos
    assert ours.eos_token_id == ours._tok.token_to_id(fam.eos)
    for token in fam.turn_end:
        assert ours._tok.token_to_id(token) in ours.eos_token_ids, token


def test_special_tokens_match_transformers(case: Case) -> None:
    fam, ours = case.family, case.ours
    theirs = _transformers_tokenizer(case.variant.name)
    for token in (*fam.special, *fam.plain):
        assert ours._tok.token_to_id(token) == theirs.convert_tokens_to_ids(token), token
    assert theirs.bos_token == fam.bos  # (None where the family names none)
    assert theirs.eos_token == ours.eos_token
    assert theirs.eos_token_id == ours.eos_token_id
    assert theirs.chat_template == ours.chat_template
    assert len(theirs) == ours.vocab_size


@pytest.mark.parametrize("gen", [True, False], ids=["generation-prompt", "no-generation-prompt"])
@pytest.mark.parametrize("conversation", list(CONVERSATIONS))
def test_render_and_encode_match_transformers(case: Case, conversation: str, gen: bool) -> None:
    theirs_tok = _transformers_tokenizer(case.variant.name)
    messages = CONVERSATIONS[conversation]
    ours = _render(case.ours, messages, gen, ours=True)
    theirs = _render(theirs_tok, messages, gen, ours=False)
    assert ours == theirs
    if ours.startswith("raised: "):
        return
    _same_or_known(case.variant.name, TRANSFORMERS_DIFFERS, case.ours.encode_prompt(ours),
                   _server_ids(theirs_tok, case.family, ours))


def _post(base: str, path: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


@pytest.mark.peer
def test_llama_server_renders_and_tokenizes_alike(case: Case) -> None:
    """llama-server on the variant's GGUF: its prompt for each conversation that ends in a
    user turn (with the generation prompt, as its chat endpoint renders them) is our
    rendering less the BOS its tokenizer puts first itself, and its ids of that prompt are
    our ``encode_prompt`` of ours. llama-server gives every template today's date as
    ``date_string`` and ``datetime`` and ``enable_thinking`` true (common/chat.cpp); ours
    gets the same here. Conversations the template refuses under transformers are left
    out (llama-server folds a system turn into the first user turn for a template
    without one)."""
    from recallspec.bench.common.llamacpp import LlamaServer, ServerConfig

    native_peer_or_unavailable()
    now = datetime.now()
    context = {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y"),
               "enable_thinking": True}
    ours, fam = case.ours, case.family
    config = ServerConfig(str(case.built.f32_gguf), threads=2, ctx_per_slot=1024,
                          start_timeout_s=120.0, request_timeout_s=60.0)
    with LlamaServer(config) as server:
        for name, messages in CONVERSATIONS.items():
            if messages[-1]["role"] != "user":
                continue
            text = _render(ours, messages, True, ours=True, **context)
            if text.startswith("raised: "):
                continue
            prompt = _post(server.base, "/apply-template", {"messages": messages})["prompt"]
            cut = fam.add_bos and fam.gguf_bos is not None and text.startswith(fam.gguf_bos)
            assert (text[len(str(fam.gguf_bos)):] if cut else text) == prompt, name
            ids = _post(server.base, "/tokenize", {"content": prompt, "add_special": True,
                                                   "parse_special": True})["tokens"]
            _same_or_known(case.variant.name, SERVER_DIFFERS, ours.encode_prompt(text), ids)


# ---- the template environment, on a template that uses all of it -----------------------

_FEATURES = """\
{%- set ns = namespace(n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'skip' %}{% continue %}{% endif -%}
  {%- if loop.index > 5 %}{% break %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  {%- generation -%}[{{ m.role }}:{{ m.content | trim }}]{%- endgeneration -%}
  {%- if m.reasoning_content is defined %}<r>{{ m.reasoning_content }}</r>{% endif -%}
  {%- if m.thinking is defined %}<t>{{ m.thinking }}</t>{% endif -%}
  {%- if m.tool_calls is defined %}{{ m.tool_calls | tojson }}{% endif -%}
  {%- if m.name is defined %}(named){% endif %}
{% endfor -%}
{{ ns.n }} {{ tools is none }} {{ documents is none }} {{ {'b': 1, 'a': '<&>'} | tojson }}
{{ {'é': [1, 2]} | tojson(indent=2) }} {{ dict(x=1) | tojson }}
{{ strftime_now('%Y') | length }} {{ bos_token }}{{ eos_token }}
{%- if add_generation_prompt %}<gen>{% endif %}
{%- if messages | length > 9 %}{{ raise_exception('too many: ' ~ messages | length) }}{% endif %}
"""


def test_environment_matches_transformers() -> None:
    """tojson (no HTML escaping, keys in order, indent), namespace, dict, loop controls,
    {% generation %}, strftime_now, raise_exception, tools / documents None, None-valued
    keys dropped and reasoning aliased: as transformers renders them."""
    _require_modules()
    import transformers
    from jinja2.exceptions import SecurityError, TemplateError
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    backend = HFTokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "<unk>": 2}, unk_token="<unk>"))
    ours = Tokenizer(backend, chat_template=_FEATURES, bos_token="<s>", eos_token="</s>")
    theirs = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    theirs.chat_template = _FEATURES
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "  Be brief.  ", "name": None},
        {"role": "skip", "content": "hidden"},
        {"role": "user", "content": "Hi <b>&</b> \u00e9", "reasoning": None},
        {"role": "assistant", "content": "Hello", "reasoning": "thought",
         "tool_calls": [{"function": {"name": "f", "arguments": {"z": 1, "a": "\u00e9"}}}]},
        {"role": "user", "content": "more", "name": "bob"},
        {"role": "assistant", "content": "x", "thinking": "t2"},
        {"role": "user", "content": "past the break"},
    ]
    for gen in (True, False):
        expected = theirs.apply_chat_template(messages, tokenize=False,
                                              add_generation_prompt=gen)
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == expected
    too_many = [{"role": "user", "content": str(i)} for i in range(10)]
    with pytest.raises(TemplateError, match="too many: 10"):
        theirs.apply_chat_template(too_many, tokenize=False)
    with pytest.raises(TemplateError, match="too many: 10"):
        ours.apply_chat_template(too_many)
    sneaky = Tokenizer(backend, chat_template="{% set ns = namespace(_x=1) %}{{ ns._x }}")
    with pytest.raises(SecurityError):
        sneaky.apply_chat_template([USER])


# ---- the harmony family's tokenizer files, without a GGUF ---------------------------------

def test_harmony_family_tokenizer(tmp_path: Any) -> None:
    """The gpt-oss variant's tokenizer files (before conversion): its harmony tokens are
    single special tokens, BOS / EOS are gpt-oss's, its turns end on <|return|> and
    <|call|> and not on <|end|> (which ends a message), and its template renders tools
    as the "harmony" family with every grammar marker a token reference."""
    from recallspec.conformance.checkpoints import llama_cpp_source
    from recallspec.conformance.tokenizers import write_tokenizer
    from recallspec.errors import RecallspecError
    from recallspec.server.tool_grammar import FAMILY_MARKERS
    from recallspec.server.tool_support import ToolSupport

    variant = VARIANTS["gpt-oss"]
    assert variant.template == "openai-gpt-oss-120b.jinja"
    fam = family(variant)
    assert fam is not None
    try:
        source = llama_cpp_source()
    except RecallspecError as e:
        unavailable(str(e))
    ids = write_tokenizer(variant, tmp_path, source)
    ours = Tokenizer.from_dir(tmp_path, extra_eos_ids=[ids["eos_id"]])
    template = source / "models" / "templates" / variant.template
    assert ours.chat_template == template.read_text(encoding="utf-8")
    for token in ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>", "<|endoftext|>"):
        assert token in fam.special
        i = ours.special_token_id(token)
        assert i is not None and ours.encode(token) == [i] and ours.decode([i]) == token
    assert (ours.bos_token, ours.eos_token) == ("<|startoftext|>", "<|return|>")
    assert ids["eos_id"] == ours.eos_token_id and ids["bos_id"] == ours.bos_token_id
    assert {ours.id_to_token(i) for i in ours.eos_token_ids} == set(fam.turn_end) == {
        "<|return|>", "<|call|>"}
    support = ToolSupport.of(ours)
    assert (support.origin, support.family) == ("model", "harmony")
    assert set(support.special_tokens) == set(FAMILY_MARKERS["harmony"])
    text = ours.apply_chat_template([USER])
    assert text.endswith("<|start|>user<|message|>What is the capital of France?<|end|>"
                         "<|start|>assistant")


def test_harmony_gguf_turn_ends_and_tool_support() -> None:
    """The same of the gpt-oss variant's GGUF, as our loader reads it: <|end|> is no end
    of the turn, and the server reads its calls as harmony with token references."""
    from recallspec.models import load_tokenizer
    from recallspec.server.tool_grammar import FAMILY_MARKERS
    from recallspec.server.tool_support import ToolSupport

    _require_modules()
    ours = load_tokenizer(str(built("gpt-oss").f32_gguf))
    assert {ours.id_to_token(i) for i in ours.eos_token_ids} == {"<|return|>", "<|call|>"}
    support = ToolSupport.of(ours)
    assert (support.origin, support.family) == ("model", "harmony")
    assert support.special_tokens == {m: ours.special_token_id(m)
                                      for m in FAMILY_MARKERS["harmony"]}
