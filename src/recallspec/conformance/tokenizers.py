"""A variant checkpoint's tokenizer files: our default model's byte-level BPE
``tokenizer.json``, or a small sentencepiece model trained here (variants.py says which
and why), with the family's chat template from the llama.cpp source's
``models/templates/`` and the family's special tokens (``FAMILIES``), so that the GGUF
llama.cpp's converter makes carries the template with the BOS, EOS and turn-end tokens
it is written for."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recallspec.conformance.variants import Variant
from recallspec.errors import RecallspecError

SPM_VOCAB = 4096
# A sentencepiece model's unknown, BOS, EOS and padding pieces as (id, piece), -1 for
# none: Llama 2's (sentencepiece's own defaults).
_LLAMA2_PIECES = ((0, "<unk>"), (1, "<s>"), (2, "</s>"), (-1, "<pad>"))


class ConformanceSetupError(RecallspecError):
    """Something the suite builds with is missing or failed (converter, quantizer)."""


@dataclass(frozen=True)
class Family:
    """A chat family's special tokens, as its published tokenizer files name them.

    ``special``: added tokens marked special (the converter makes them control tokens);
    ``plain``: added tokens that are not (user-defined tokens in the GGUF). ``bos`` /
    ``eos``: tokenizer_config.json's ``bos_token`` / ``eos_token`` (``bos`` None where the
    family names none; ``config_bos`` is then the token config.json's ``bos_token_id``
    names, which the converter writes as the GGUF's BOS). ``turn_end``: the tokens that end
    an assistant turn in the template, the stop tokens. ``add_bos``: whether the tokenizer
    itself puts BOS first (tokenizer_config's ``add_bos_token``, which the converter
    writes into the GGUF; a tokenizer.json's post-processor does not: see
    ``_write_bpe``). ``spm_pieces``: a sentencepiece model's unknown / BOS / EOS / padding
    pieces as (id, piece), -1 for none (Llama 2's unless given).
    """

    special: tuple[str, ...]
    eos: str
    turn_end: tuple[str, ...]
    bos: str | None = None
    config_bos: str | None = None
    plain: tuple[str, ...] = ()
    add_bos: bool = False
    tokenizer_class: str = "LlamaTokenizer"  # for a sentencepiece model
    spm_pieces: tuple[tuple[int, str], ...] = _LLAMA2_PIECES

    @property
    def gguf_bos(self) -> str | None:
        """The token the GGUF names as BOS."""
        return self.bos if self.bos is not None else self.config_bos


# Llama 3.x Instruct: tokenizer_config's eos_token is <|eot_id|>, the end of every turn;
# <|eom_id|> ends an assistant's tool call in the 3.1 template's ipython mode (3.2's
# template does not write it). Its tokenizer puts <|begin_of_text|> first.
_LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")
# Qwen2.5 / Qwen3: ChatML; no BOS of its own (config.json's bos_token_id is
# <|endoftext|>), eos_token <|im_end|>, the turn end; the tool-call (and Qwen3's
# reasoning) tags are added tokens that are not special.
_QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

FAMILIES: dict[str, Family] = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": Family(
        _LLAMA3_SPECIAL, bos="<|begin_of_text|>", eos="<|eot_id|>",
        turn_end=("<|eot_id|>", "<|eom_id|>"), add_bos=True),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": Family(
        _LLAMA3_SPECIAL, bos="<|begin_of_text|>", eos="<|eot_id|>", turn_end=("<|eot_id|>",),
        add_bos=True),
    # Mistral Nemo (v3 tekken): BOS <s> put first by the tokenizer; an assistant turn ends
    # with </s>, the EOS (the template writes eos_token after it).
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": Family(
        ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]",
         "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]"),
        bos="<s>", eos="</s>", turn_end=("</s>",), add_bos=True),
    "Qwen-Qwen2.5-7B-Instruct.jinja": Family(
        _QWEN_SPECIAL, config_bos="<|endoftext|>", eos="<|im_end|>", turn_end=("<|im_end|>",),
        plain=("<tool_call>", "</tool_call>")),
    "Qwen-Qwen3-0.6B.jinja": Family(
        _QWEN_SPECIAL, config_bos="<|endoftext|>", eos="<|im_end|>", turn_end=("<|im_end|>",),
        plain=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               "<think>", "</think>")),
    # Gemma 2: <pad> <eos> <bos> <unk> <mask> first, as in its tokenizer.model, all
    # special (its tokenizer_config says so); BOS put first by the tokenizer; a turn ends
    # with <end_of_turn> (the EOS, <eos>, ends the text).
    "google-gemma-2-2b-it.jinja": Family(
        ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>", eos="<eos>", turn_end=("<end_of_turn>",), add_bos=True,
        tokenizer_class="GemmaTokenizer",
        spm_pieces=((3, "<unk>"), (2, "<bos>"), (1, "<eos>"), (0, "<pad>"))),
    # Phi-3.5-mini: Llama 2's sentencepiece vocabulary and its chat tokens added after it;
    # eos_token <|endoftext|>, a turn ends with <|end|>; no BOS put first.
    "microsoft-Phi-3.5-mini-instruct.jinja": Family(
        ("<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"),
        bos="<s>", eos="<|endoftext|>", turn_end=("<|end|>",)),
    # SmolLM3: a Llama 3 vocabulary with ChatML turns; no BOS of its own (config.json's
    # bos_token_id is <|begin_of_text|>), eos_token <|im_end|>, the turn end.
    "HuggingFaceTB-SmolLM3-3B.jinja": Family(
        ("<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"),
        config_bos="<|begin_of_text|>", eos="<|im_end|>", turn_end=("<|im_end|>",),
        plain=("<think>", "</think>")),
    # gpt-oss (o200k_harmony): openai/gpt-oss-20b's tokenizer_config.json names
    # <|startoftext|> BOS (not put first: the template starts with <|start|>system),
    # <|return|> EOS and <|endoftext|> padding; its added tokens are all special, here in
    # their published id order (199998-200018) less the <|reserved_*|> ones. A turn ends
    # with <|return|> (the final message) or <|call|> (a tool call); <|end|> ends a
    # message, not the turn.
    "openai-gpt-oss-120b.jinja": Family(
        ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
         "<|start|>", "<|end|>", "<|message|>", "<|call|>", "<|endofprompt|>"),
        bos="<|startoftext|>", eos="<|return|>", turn_end=("<|return|>", "<|call|>")),
    # Granite 3.x: <|end_of_text|> is BOS, EOS and the end of every turn.
    "ibm-granite-granite-3.3-2B-Instruct.jinja": Family(
        ("<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>",
         "<|start_of_cite|>", "<|end_of_cite|>", "<|start_of_plugin|>", "<|end_of_plugin|>"),
        bos="<|end_of_text|>", eos="<|end_of_text|>", turn_end=("<|end_of_text|>",)),
}


def family(variant: Variant) -> Family | None:
    """The variant's chat family (None for a variant without a template)."""
    if variant.template is None:
        return None
    fam = FAMILIES.get(variant.template)
    if fam is None:
        raise ConformanceSetupError(f"no special tokens are known for the chat template "
                                    f"{variant.template} (add it to FAMILIES)")
    return fam


def _template(variant: Variant, source: Path) -> str | None:
    if variant.template is None:
        return None
    path = source / "models" / "templates" / variant.template
    if not path.is_file():
        raise ConformanceSetupError(f"chat template {path} is missing")
    return path.read_text(encoding="utf-8")


def write_tokenizer(variant: Variant, out: Path, source: Path) -> dict[str, int]:
    """The checkpoint's tokenizer files into ``out`` (``source``: the llama.cpp tree whose
    models/templates/ holds the family's chat template); returns its vocab size and bos /
    eos ids (for config.json)."""
    template = _template(variant, source)
    fam = family(variant)
    if variant.tokenizer == "bpe":
        return _write_bpe(variant, out, template, fam)
    return _write_spm(out, template, fam)


def _write_bpe(variant: Variant, out: Path, template: str | None,
               fam: Family | None) -> dict[str, int]:
    from tokenizers import AddedToken, Tokenizer

    from recallspec.models.loader import model_dir

    src = model_dir(None)  # the default model's tokenizer, as converted from its GGUF
    cfg: dict[str, Any] = json.loads((src / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = variant.tokenizer_class
    if template is not None:
        cfg["chat_template"] = template
    if fam is None:
        shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
    else:
        tok = Tokenizer.from_file(str(src / "tokenizer.json"))
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in fam.special])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in fam.plain])
        # (The post-processor stays without BOS even where the family's puts it first: the
        # converter recognizes a vocabulary by the hash of a text's ids as the tokenizer
        # encodes it, special tokens included, and knows no SmolLM2 vocabulary with a BOS
        # added. add_bos_token below is what it writes into the GGUF.)
        tok.save(str(out / "tokenizer.json"))
        cfg.update(bos_token=fam.bos, eos_token=fam.eos, pad_token=fam.eos,
                   add_bos_token=fam.add_bos)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    bos_token = fam.gguf_bos if fam is not None else cfg["bos_token"]
    return {"vocab_size": int(tok.get_vocab_size(with_added_tokens=True)),
            "bos_id": _id(tok, bos_token), "eos_id": _id(tok, cfg["eos_token"])}


def _id(tok: Any, token: object) -> int:
    text = token["content"] if isinstance(token, dict) else token
    i = tok.token_to_id(str(text))
    if i is None:
        raise ConformanceSetupError(f"token {text!r} is not in the vocabulary")
    return int(i)


def _write_spm(out: Path, template: str | None, fam: Family | None) -> dict[str, int]:
    """A sentencepiece model; a family's tokens that are not among its pieces follow them
    (ids SPM_VOCAB...) in added_tokens.json and, with their special flags, in
    tokenizer_config.json's added_tokens_decoder: the files a published checkpoint (Phi-3,
    Gemma) carries them in, and the ones llama.cpp's converter
    (``_create_vocab_sentencepiece``, Phi-3's ``set_vocab``) and transformers read."""
    if fam is None:
        (out / "tokenizer.model").write_bytes(_train_sentencepiece())
        cfg: dict[str, Any] = {
            "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}
        if template is not None:
            cfg["chat_template"] = template
        (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
        _write_tokenizer_json(out)
        return {"vocab_size": SPM_VOCAB, "bos_id": 1, "eos_id": 2}
    (out / "tokenizer.model").write_bytes(_train_sentencepiece(fam.spm_pieces))
    pieces = {piece: i for i, piece in fam.spm_pieces if i >= 0}
    ids = dict(pieces)
    added: dict[str, int] = {}
    for t in (*fam.special, *fam.plain):
        if t not in ids:
            ids[t] = added[t] = SPM_VOCAB + len(added)
    special = set(fam.special)
    decoder = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                        "single_word": False, "special": t in special}
               for t, i in sorted(ids.items(), key=lambda kv: kv[1])
               if t in added or t in special}
    named = {name: piece for (_, piece), name in zip(fam.spm_pieces, ("unk", "bos", "eos", "pad"),
                                                     strict=True) if piece in pieces}
    cfg = {"tokenizer_class": fam.tokenizer_class, "bos_token": fam.bos, "eos_token": fam.eos,
           "unk_token": named.get("unk"), "pad_token": named.get("pad", fam.eos),
           "add_bos_token": fam.add_bos, "add_eos_token": False,
           "added_tokens_decoder": decoder}
    if template is not None:
        cfg["chat_template"] = template
    (out / "added_tokens.json").write_text(json.dumps(added, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    _write_tokenizer_json(out)
    return {"vocab_size": SPM_VOCAB + len(added), "bos_id": ids[str(fam.gguf_bos)],
            "eos_id": ids[fam.eos]}


def _write_tokenizer_json(out: Path) -> None:
    """``tokenizer.json`` beside ``tokenizer.model``, as published sentencepiece
    checkpoints carry both: transformers' conversion of the files in ``out`` (our loader
    of a checkpoint directory reads tokenizer.json; llama.cpp's converter reads
    tokenizer.model)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(out)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))


def _train_sentencepiece(
        pieces: Sequence[tuple[int, str]] = _LLAMA2_PIECES) -> bytes:
    """A sentencepiece BPE model (byte fallback, as Llama's and Gemma's) of SPM_VOCAB
    pieces, trained on text made from our default model's vocabulary: deterministic
    (one thread, input in order) and offline. ``pieces``: the unknown, BOS, EOS and
    padding pieces as (id, piece), -1 for none."""
    import sentencepiece as spm

    from recallspec.models import load_tokenizer

    (unk_id, unk), (bos_id, bos), (eos_id, eos), (pad_id, pad) = pieces
    names = {} if tuple(pieces) == _LLAMA2_PIECES else {
        "unk_piece": unk, "bos_piece": bos, "eos_piece": eos, "pad_piece": pad}
    tok = load_tokenizer(None)
    lines = [tok.decode(list(range(i, min(i + 48, tok.vocab_size))))
             for i in range(0, tok.vocab_size, 48)]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=SPM_VOCAB,
        model_type="bpe", byte_fallback=True, num_threads=1, shuffle_input_sentence=False,
        input_sentence_size=0, seed_sentencepiece_size=100000, character_coverage=1.0,
        unk_id=unk_id, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, minloglevel=2, **names)
    return buf.getvalue()
