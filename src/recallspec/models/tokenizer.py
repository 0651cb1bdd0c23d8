"""Tokenizer wrapper over ``tokenizers.Tokenizer`` plus the model's chat template.

Built from an HF-style directory (``tokenizer.json`` [+ ``tokenizer_config.json``]); GGUF
models reach this through their cached converted directory. The fingerprint depends only on
the vocabulary in id order, so the same vocabulary gives the same fingerprint whichever
format it was loaded from (index files record it to detect a tokenizer mismatch).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from recallspec.errors import ModelLoadError

# Tokens that end an assistant turn in common chat templates; each counts as an extra
# end-of-sequence id when the chat template uses it (or, with no template, when present):
# ChatML's (Qwen, SmolLM), Gemma's, Llama 3's (<|eom_id|>: the end of a tool-call turn in
# its ipython mode, which llama.cpp also stops at) and Phi-3's.
TURN_END_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>")
# Harmony (gpt-oss, OpenAI's o200k_harmony vocabulary): <|end|> ends a message, not the
# turn (the model goes on with "<|start|>assistant<|channel|>final..." after its analysis
# message); <|return|> ends the turn after the final message, <|call|> after a tool call.
HARMONY_TURN_END_TOKENS = ("<|return|>", "<|call|>")
HARMONY_MESSAGE_END = "<|end|>"
HARMONY_CHANNEL = "<|channel|>"


def is_harmony(chat_template: str | None, has_token: Callable[[str], bool]) -> bool:
    """Whether the chat format is harmony: the template writes ``<|channel|>`` (how
    llama.cpp's common/chat.cpp tells gpt-oss's template), or the vocabulary holds both
    ``<|return|>`` and ``<|call|>`` (how llama.cpp's src/llama-vocab.cpp tells it)."""
    if chat_template is not None and HARMONY_CHANNEL in chat_template:
        return True
    return all(has_token(t) for t in HARMONY_TURN_END_TOKENS)


def turn_end_tokens(chat_template: str | None,
                    has_token: Callable[[str], bool]) -> tuple[str, ...]:
    """The tokens that end an assistant turn, each an end-of-sequence id: in a harmony
    format (``is_harmony``) <|return|> and <|call|> (those the vocabulary holds) and never
    <|end|>; otherwise those of ``TURN_END_TOKENS`` the vocabulary holds and the chat
    template uses (all of them with no template). ``has_token``: whether the vocabulary
    holds a token (Phi-3's <|end|> ends its turns, gpt-oss's does not)."""
    if is_harmony(chat_template, has_token):
        return tuple(t for t in HARMONY_TURN_END_TOKENS if has_token(t))
    return tuple(t for t in TURN_END_TOKENS
                 if has_token(t) and (chat_template is None or t in chat_template))


def _token_text(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, Mapping) and isinstance(v.get("content"), str):
        return str(v["content"])
    return None


def vocab_fingerprint(backend: _HFTokenizer) -> str:
    """Hex sha256 of a ``tokenizers.Tokenizer``'s vocabulary in id order, added tokens
    included: ``f"{id}\\0{token}\\0"`` per id, ``""`` for an id without a token. Index
    files record it; the integrations take it of host libraries' tokenizers, so an index
    opened there accepts exactly the vocabularies it does here. (Most of its time is the
    per-id calls; ``get_vocab``, one call, takes longer: it builds a dict of them.)"""
    h = hashlib.sha256()
    for i in range(int(backend.get_vocab_size(with_added_tokens=True))):
        tok = backend.id_to_token(i)
        h.update(f"{i}\x00{'' if tok is None else tok}\x00".encode())
    return h.hexdigest()


class Tokenizer:
    def __init__(
        self, tokenizer: _HFTokenizer, *, chat_template: str | None = None,
        bos_token: str | None = None, eos_token: str | None = None,
        extra_eos_ids: Iterable[int] = (),
    ) -> None:
        self._tok = tokenizer
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = self._id(bos_token)
        self.eos_token_id = self._id(eos_token)
        self._extra_eos_ids = frozenset(extra_eos_ids)
        eos = set(self._extra_eos_ids)
        if is_harmony(chat_template, self._has_token):
            # <|end|> is no end of sequence, whatever listed it (llama.cpp drops it from
            # its end-of-generation ids too), unless it is the tokenizer's own EOS
            end = self._id(HARMONY_MESSAGE_END)
            if end is not None:
                eos.discard(end)
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        for t in turn_end_tokens(chat_template, self._has_token):
            tid = self._id(t)
            assert tid is not None  # (turn_end_tokens gives only tokens it holds)
            eos.add(tid)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.vocab_size: int = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @cached_property
    def fingerprint(self) -> str:
        """``vocab_fingerprint`` of this vocabulary (computed on first use)."""
        return vocab_fingerprint(self._tok)

    def backend_json(self) -> str:
        """The vocabulary and its rules as tokenizer.json text (what the grammar engine
        builds its token table from)."""
        return str(self._tok.to_str())

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def _has_token(self, token: str) -> bool:
        return self._tok.token_to_id(token) is not None

    @classmethod
    def from_dir(cls, directory: str | Path, extra_eos_ids: Iterable[int] = ()) -> Tokenizer:
        d = Path(directory)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError(f"{d} has no tokenizer.json")
        try:
            tok = _HFTokenizer.from_file(str(tj))
        except Exception as e:
            raise ModelLoadError(f"cannot read {tj}: {e}") from None
        cfg: dict[str, Any] = {}
        tc = d / "tokenizer_config.json"
        if tc.is_file():
            cfg = json.loads(tc.read_text())
        template = cfg.get("chat_template")
        jinja = d / "chat_template.jinja"  # transformers >= 4.43 saves it separately
        if template is None and jinja.is_file():
            template = jinja.read_text()
        if isinstance(template, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        return cls(
            tok, chat_template=template if isinstance(template, str) else None,
            bos_token=_token_text(cfg.get("bos_token")),
            eos_token=_token_text(cfg.get("eos_token")),
            extra_eos_ids=extra_eos_ids,
        )

    # ---- encoding ----------------------------------------------------------------
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_prompt(self, text: str) -> list[int]:
        """Ids of a prompt: with the special tokens the tokenizer's post-processor adds
        (Gemma's BOS: without it that model only repeats the prompt's last line), but
        one BOS only when the text (e.g. a rendered chat template) starts with it already.
        Corpus text is encoded without them (``encode``)."""
        ids = self.encode(text, add_special_tokens=True)
        bos = self.bos_token_id
        # Re-encoding without special tokens (is the first BOS the post-processor's?)
        # is needed only in the rare case of a doubled BOS.
        if bos is not None and ids[:2] == [bos, bos] and len(ids) > len(self.encode(text)):
            del ids[0]
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def special_token_id(self, text: str) -> int | None:
        """The id of ``text`` where the vocabulary holds it as one added token marked
        special (what the grammar engine, llguidance, treats as special: text never
        matches it), else None."""
        i = self._tok.token_to_id(text)
        if i is None:
            return None
        added = self._tok.get_added_tokens_decoder().get(i)
        return i if added is not None and added.special and added.content == text else None

    def with_chat_template(self, chat_template: str | None) -> Tokenizer:
        """This vocabulary with another chat template (``recallspec serve
        --chat-template``; the server's template with tools): the end-of-turn ids follow
        the new template, the other end-of-sequence ids stay."""
        return Tokenizer(self._tok, chat_template=chat_template, bos_token=self.bos_token,
                         eos_token=self.eos_token, extra_eos_ids=self._extra_eos_ids)

    # ---- chat ----------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    @cached_property
    def _chat_template(self) -> Any:
        """The chat template compiled once (compiling cost about a small model's decode
        step on every chat request). Rendering is stateless, so one compiled template
        serves every request and thread."""
        return _template_environment().from_string(self.chat_template or "")

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """The conversation rendered as transformers' ``apply_chat_template(...,
        tokenize=False)`` renders it (``_template_environment``): keys whose value is None
        dropped from each message, a message's reasoning under ``reasoning_content`` and
        ``thinking`` whichever name it came under, ``tools`` and ``documents`` None unless
        given, everything the template sees rebuilt from plain JSON types; ``bos_token`` /
        ``eos_token`` the tokenizer's ("" where it has none, as llama-server passes them);
        ``kwargs`` (``tools``, ``enable_thinking``, ``date_string``, ...) as variables,
        over those."""
        if self.chat_template is None:
            raise ModelLoadError("this model's tokenizer has no chat template")
        chat = [_with_reasoning_aliases(_plain({k: v for k, v in m.items() if v is not None}))
                for m in messages]
        variables: dict[str, Any] = {
            "bos_token": self.bos_token or "", "eos_token": self.eos_token or "",
            "tools": None, "documents": None, **_plain(kwargs)}
        return str(self._chat_template.render(
            messages=chat, add_generation_prompt=add_generation_prompt, **variables))


# ---- the chat template's environment ---------------------------------------------------
# As transformers 5.x sets it up (``utils/chat_template_utils.py``,
# ``_cached_compile_jinja_template`` and ``render_jinja_template``), which is what the
# models' templates are written and tested against (llama-server's --jinja engine gives
# them the same functions, and besides passes today's date as ``date_string`` and
# ``datetime`` and ``enable_thinking``: a caller passes those as keyword arguments where
# it wants them): a sandbox without mutation of the template's data, trim_blocks and
# lstrip_blocks, {% break %} / {% continue %}, ``raise_exception``, ``strftime_now``, a
# ``tojson`` that neither escapes HTML nor sorts keys, ``dict`` and a ``namespace`` that
# refuses underscore names, and the ``{% generation %}`` block (rendered as its body: only
# transformers' assistant-token masks read it).

# Names a message's reasoning comes under; templates read the first (and gpt-oss's the
# second), so both are filled from whichever is there.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (dicts, lists, tuples, str, int, float,
    bool, None), anything else as an inert ``"<TypeName>"``: the sandbox then sees no
    object with methods of its own (transformers' ``_plain_template_data``)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None),
                     None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@cache
def _template_environment() -> Any:
    """The Jinja environment every chat template is compiled in (made once)."""
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.utils import Namespace

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: its body, as rendered."""

        tags = {"generation"}  # noqa: RUF012 (jinja2 declares it a set)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    def check_name(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError("chat templates cannot store underscore-prefixed attributes "
                                f"on a namespace, but got {name!r}")

    class TemplateNamespace(Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # Namespace's signature trick
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                check_name(name)
            Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check_name(name)
            Namespace.__setitem__(self, name, value)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[GenerationBlock, "jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env
