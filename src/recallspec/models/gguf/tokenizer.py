"""A GGUF's tokenizer as ``tokenizer.json`` and ``tokenizer_config.json``, written once when
the file is first converted (``models/gguf/convert.py``: ``convert_gguf``).

The reference is transformers' GGUF tokenizer converter (``AutoTokenizer`` with
``gguf_file``): whatever we write must equal what it makes, byte for byte (the tests check
it on the real models' files and on headers varied from them). Importing transformers and
running its converter costs a first run more than llama-server's whole start at the 1.7B
shape, so byte-level BPE vocabularies (``tokenizer.ggml.model`` "gpt2": SmolLM2, Llama-3,
Qwen) are built here with ``tokenizers`` alone, in the same steps as transformers'
``byte_level_tokenizer`` + ``GPT2Tokenizer`` + ``TokenizersBackend`` (a fraction of the
converter's time); so are Gemma's sentencepiece vocabularies, in the steps of its
``gemma_tokenizer`` + ``GemmaTokenizer`` (well under the time with transformers' import).
Anything this does not know to give the same (other sentencepiece vocabularies, a
pre-tokenizer type outside ``_SPLITS``, named special tokens that are not marked as
control tokens, merges stored in a Gemma file) goes to transformers' converter, which
stays the reference.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from recallspec.errors import ModelLoadError
from recallspec.models.gguf.header import Header

# GGUF key (after "tokenizer.") -> the name transformers' converter gives its value: its own
# table (``transformers.integrations.gguf.GGUF_TOKENIZER_MAPPING``), which the tests
# compare with this one.
TOKENIZER_KEYS = {
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
    "ggml.precompiled_charsmap": "precompiled_charsmap",
    "ggml.bos_token_id": "bos_token_id",
    "ggml.eos_token_id": "eos_token_id",
    "ggml.unknown_token_id": "unk_token_id",
    "ggml.padding_token_id": "pad_token_id",
    "ggml.add_space_prefix": "add_prefix_space",
}
TOKENIZER_CONFIG_KEYS = {
    "chat_template": "chat_template",
    "ggml.add_bos_token": "add_bos_token",
    "ggml.add_eos_token": "add_eos_token",
}
_SPECIAL = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
            ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id"))

# GGUF token types (llama.cpp's llama_token_type) that transformers' converter adds as
# special (CONTROL) or as plain added tokens (USER_DEFINED).
_CONTROL, _USER_DEFINED = 3, 4

# Byte-level pre-tokenizers by ``tokenizer.ggml.pre``: None is ByteLevel's own GPT-2 split;
# a pattern is split first (isolated), then mapped to bytes without ByteLevel's regex.
# Only types whose result the tests compare with transformers' are listed; any other
# goes to transformers.
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS: dict[str | None, str | None] = {
    None: None, "default": None, "gpt-2": None, "smollm": None,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2,
}


def tokenizer_arrays() -> set[str]:
    """The metadata keys whose arrays the conversion reads (``read_header``'s ``arrays``)."""
    return {f"tokenizer.{key}" for key in TOKENIZER_KEYS}


def gguf_tokenizer_dict(header: Header) -> dict[str, Any]:
    """The tokenizer description transformers' converter takes, from a header read with
    ``tokenizer_arrays()``, as ``transformers.integrations.gguf.get_gguf_tokenizer`` builds
    it (which reads them again through its own reader; the tests check both agree)."""
    values: dict[str, Any] = {**header.metadata, **header.arrays}
    return {name: values[f"tokenizer.{key}"] for key, name in TOKENIZER_KEYS.items()
            if f"tokenizer.{key}" in values}


def gguf_tokenizer_config(header: Header) -> dict[str, Any]:
    """The keyword arguments transformers gives the tokenizer class for a GGUF (its
    special tokens, whether it adds BOS/EOS: they set the post-processor), as
    ``get_gguf_tokenizer`` builds them (its third value; checked by the tests)."""
    meta, tokens = header.metadata, header.arrays.get("tokenizer.ggml.tokens", [])
    cfg: dict[str, Any] = {name: meta[f"tokenizer.{key}"]
                           for key, name in TOKENIZER_CONFIG_KEYS.items()
                           if f"tokenizer.{key}" in meta}
    if meta.get("tokenizer.ggml.model") == "llama":
        # transformers' rule: a sentencepiece vocabulary without the flag adds BOS (as
        # llama.cpp does)
        cfg.setdefault("add_bos_token", True)
    for name, key in _SPECIAL:
        i = meta.get(f"tokenizer.ggml.{key}")
        cfg[name] = tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None
    return cfg


@cache
def _byte_spelling() -> tuple[str, ...]:
    """GPT-2's byte alphabet: byte b is written as character ``_byte_spelling()[b]``
    (printable Latin-1 bytes as themselves, the other 68 from U+0100 up, in byte order)."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    spelled = dict(zip(kept, kept, strict=True))
    for n, b in enumerate(b for b in range(256) if b not in spelled):
        spelled[b] = 0x100 + n
    return tuple(chr(spelled[b]) for b in range(256))


def byte_level_json(header: Header) -> str | None:
    """``tokenizer.json`` of a byte-level BPE vocabulary, built as transformers' converter
    builds it, or None where this cannot promise the same (the caller then asks
    transformers): another tokenizer model, a pre-tokenizer type outside ``_SPLITS``, a
    named special token not among the control tokens (transformers would add it anew), a
    merge that is not two symbols."""
    from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    meta, arrays = header.metadata, header.arrays
    pre = meta.get("tokenizer.ggml.pre")
    if meta.get("tokenizer.ggml.model") != "gpt2" or pre not in _SPLITS:
        return None
    tokens: list[str] = arrays.get("tokenizer.ggml.tokens") or []
    types: list[int] = arrays.get("tokenizer.ggml.token_type") or []
    merge_lines: list[str] = arrays.get("tokenizer.ggml.merges") or []
    pairs = [m.split(" ") for m in merge_lines]
    if not tokens or not pairs or any(len(p) != 2 for p in pairs):
        return None
    merges = [(a, b) for a, b in pairs]
    spelling = _byte_spelling()
    alphabet = set(spelling)
    # A token written outside the byte alphabet is respelled byte by byte, as transformers
    # does (a later duplicate spelling overwrites an earlier one in both).
    vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i
             for i, t in enumerate(tokens)}
    control = [t for t, k in zip(tokens, types, strict=False)
               if k == _CONTROL and set(t) <= alphabet]
    config = gguf_tokenizer_config(header)
    named = {str(config[name]) for name, _ in _SPECIAL if config[name] is not None}
    if not named <= set(control):
        return None
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                        end_of_word_suffix="", fuse_unk=False))
    split = _SPLITS[pre]
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return _with_added_tokens(tok, tokens, types, control, config)


# Architectures whose sentencepiece vocabulary transformers builds with its Gemma rules
# (``GGUF_SENTENCEPIECE_BUILDERS``), and the special tokens ``GemmaTokenizer`` names
# itself (its BPE's unknown token is always "<unk>").
_GEMMA_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})
_GEMMA_NAMED = frozenset({"<unk>", "<bos>", "<eos>", "<pad>", "<mask>"})


def gemma_json(header: Header) -> str | None:
    """``tokenizer.json`` of a Gemma sentencepiece vocabulary, built as transformers builds
    it, or None where this cannot promise the same (the caller then asks transformers):
    another tokenizer model or architecture, merges in the file, a special token that
    transformers would name but the file does not mark as a control token."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    meta, arrays = header.metadata, header.arrays
    if (meta.get("tokenizer.ggml.model") != "llama"
            or meta.get("general.architecture") not in _GEMMA_ARCHS
            or "tokenizer.ggml.merges" in arrays):
        return None
    tokens: list[str] = arrays.get("tokenizer.ggml.tokens") or []
    types: list[int] = arrays.get("tokenizer.ggml.token_type") or []
    control = [t for t, k in zip(tokens, types, strict=False) if k == _CONTROL]
    config = gguf_tokenizer_config(header)
    named = {str(config[name]) for name, _ in _SPECIAL if config[name] is not None}
    if not tokens or not (named | _GEMMA_NAMED) <= set(control):
        return None
    # A token of spaces only is stored with real spaces; the model looks it up as "▁"s.
    spelled = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = dict(zip(spelled, range(len(spelled)), strict=True))  # a repeated token: its last id
    tok = Tokenizer(BPE(vocab=vocab, merges=_merges_by_position(vocab), fuse_unk=True,
                        unk_token="<unk>", dropout=None, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous",
                                             invert=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.normalizer = normalizers.Replace(" ", "\u2581")
    # (control and user-defined tokens as the file spells them, as transformers adds them)
    return _with_added_tokens(tok, tokens, types, control, config)


def _merges_by_position(vocab: dict[str, int]) -> list[tuple[str, str]]:
    """The merges transformers derives for a file without any (``generate_merges`` with
    each token's negated id as its score): every split of a token into two tokens, the
    tokens by id, a token's splits with the longer left part first. (Its sort key, score
    then the parts' lengths, is unique per merge, so this order is the one it sorts to.)"""
    has = vocab.__contains__
    by_id = sorted(vocab, key=vocab.__getitem__)
    return [(t[:i], t[i:]) for t in by_id for i in range(len(t) - 1, 0, -1)
            if has(t[:i]) and has(t[i:])]


def _with_added_tokens(tok: Any, tokens: list[str], types: list[int], control: list[str],
                       config: dict[str, Any]) -> str:
    """``tok``'s JSON after transformers' last steps for a GGUF vocabulary
    (``add_gguf_special_tokens``, then the tokenizer class's post-processor): the control
    tokens added as special, then the user-defined ones already in the vocabulary as
    plain added tokens, then BOS/EOS as the file asks."""
    from tokenizers import AddedToken, processors

    if control:
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    in_vocab = tok.get_vocab()
    user = [AddedToken(t, normalized=False, special=False)
            for t, k in zip(tokens, types, strict=False) if k == _USER_DEFINED and t in in_vocab]
    if user:
        tok.add_tokens(user)
    tok.post_processor = _post_processor(config, tok, processors)
    return str(tok.to_str())


def _post_processor(config: dict[str, Any], tok: Any, processors: Any) -> Any:
    """The template transformers' ``TokenizersBackend.update_post_processor`` sets: BOS
    and/or EOS around each sequence where the file asks for them and names the token."""
    bos, eos = config["bos_token"], config["eos_token"]
    add_bos = bool(config.get("add_bos_token", False)) and bos is not None
    add_eos = bool(config.get("add_eos_token", False)) and eos is not None
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = (f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1"
            f"{' ' + eos + ':1' if add_eos else ''}")
    # (token_to_id: one lookup, where get_vocab() would build a dict of every id again)
    special = ([(bos, tok.token_to_id(bos))] if add_bos else []) + (
        [(eos, tok.token_to_id(eos))] if add_eos else [])
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def transformers_json(path: Path, header: Header) -> str:
    """``tokenizer.json`` by transformers' GGUF converter and tokenizer class (which sets
    the post-processor that adds BOS): what ``AutoTokenizer.from_pretrained(...,
    gguf_file=...)`` makes, without its readers."""
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import convert_gguf_tokenizer
    except ImportError:
        raise ModelLoadError(
            f"converting the tokenizer of {path} the first time needs transformers (a "
            "dependency of recallspec: reinstall it); later loads use the cached tokenizer.json"
        ) from None
    arch = str(header.metadata.get("general.architecture"))
    try:
        backend, _ = convert_gguf_tokenizer(arch, gguf_tokenizer_dict(header))
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, **gguf_tokenizer_config(header))
    except Exception as e:
        raise ModelLoadError(f"cannot convert the tokenizer of {path}: {e}") from None
    return str(tok.backend_tokenizer.to_str())


def tokenizer_files(path: Path, header: Header) -> tuple[str, dict[str, Any]]:
    """tokenizer.json text and a tokenizer_config.json dict for GGUF ``path``, from its
    header read with ``tokenizer_arrays()``."""
    if not header.arrays.get("tokenizer.ggml.tokens"):
        raise ModelLoadError(f"{path} has no tokenizer vocabulary (tokenizer.ggml.tokens)")
    config = gguf_tokenizer_config(header)
    text = byte_level_json(header) or gemma_json(header) or transformers_json(path, header)
    # The special tokens as the class got them; add_bos_token as the file says (no
    # sentencepiece default: tokenizer_config.json has always said so).
    files: dict[str, Any] = {name: config[name] for name, _ in _SPECIAL}
    files["add_bos_token"] = bool(header.metadata.get("tokenizer.ggml.add_bos_token", False))
    files["chat_template"] = header.metadata.get("tokenizer.chat_template")
    return text, files


__all__ = ["TOKENIZER_CONFIG_KEYS", "TOKENIZER_KEYS", "byte_level_json", "gemma_json",
           "gguf_tokenizer_config", "gguf_tokenizer_dict", "tokenizer_arrays", "tokenizer_files",
           "transformers_json"]
