"""Tokenizer wrapper over ``tokenizers.Tokenizer`` plus the model's chat template.

Built from an HF-style directory (``tokenizer.json`` [+ ``tokenizer_config.json``]); GGUF
models reach this through their cached converted directory. The fingerprint depends only on
the vocabulary in id order, so the same vocabulary gives the same fingerprint whichever
format it was loaded from (index files record it to detect a tokenizer mismatch).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _HFTokenizer

from recallspec.errors import ModelLoadError

# Tokens that end an assistant turn in common chat templates; each counts as an extra
# end-of-sequence id when the chat template uses it (or, with no template, when present).
TURN_END_TOKENS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>")


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
    opened there accepts exactly the vocabularies it does here. (~0.5 s at Gemma's 262k
    ids, most of it the per-id calls; ``get_vocab``, one call, takes longer: it builds a
    dict of them.)"""
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
        eos = {i for i in extra_eos_ids}
        if self.eos_token_id is not None:
            eos.add(self.eos_token_id)
        for t in TURN_END_TOKENS:
            tid = self._id(t)
            if tid is not None and (chat_template is None or t in chat_template):
                eos.add(tid)
        self.eos_token_ids: frozenset[int] = frozenset(eos)
        self.vocab_size: int = int(tokenizer.get_vocab_size(with_added_tokens=True))

    @cached_property
    def fingerprint(self) -> str:
        """``vocab_fingerprint`` of this vocabulary (computed on first use)."""
        return vocab_fingerprint(self._tok)

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

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

    # ---- chat ----------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    @cached_property
    def _chat_template(self) -> Any:
        """The chat template compiled once (compiling took ~7 ms, a 135M model's decode
        step, on every chat request). Rendering is stateless, so one compiled template
        serves every request and thread."""
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template or "")

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if self.chat_template is None:
            raise ModelLoadError("this model's tokenizer has no chat template")
        template = self._chat_template
        return template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs,
        )
