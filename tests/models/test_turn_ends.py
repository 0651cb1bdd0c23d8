"""models/tokenizer.py: the tokens that end an assistant turn. Harmony (gpt-oss: a
template writing <|channel|>, or a vocabulary with <|return|> and <|call|>) ends a turn
on <|return|> and <|call|>, never on <|end|>, which only ends a message (the analysis
message, after which the model goes on with its final one), as llama.cpp's
src/llama-vocab.cpp has it; Phi-3 keeps <|end|> as its turn's end."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from recallspec.models.tokenizer import (
    HARMONY_TURN_END_TOKENS,
    TURN_END_TOKENS,
    Tokenizer,
    is_harmony,
    turn_end_tokens,
)

PHI3_TEMPLATE = ("{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] "
                 "+ '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|assistant|>\\n' }}{% endif %}")
HARMONY_TEMPLATE = ("{% for m in messages %}{{ '<|start|>' + m['role'] + '<|message|>' "
                    "+ m['content'] + '<|end|>' }}{% endfor %}"
                    "{{ '<|start|>assistant<|channel|>final<|message|>' }}")
PHI3_VOCAB = ("<unk>", "<s>", "</s>", "<|endoftext|>", "<|assistant|>", "<|system|>",
              "<|end|>", "<|user|>")
HARMONY_VOCAB = ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                 "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>")


def backend(tokens: tuple[str, ...]) -> HFTokenizer:
    vocab = {t: i for i, t in enumerate(dict.fromkeys(("<unk>", *tokens, "hello")))}
    return HFTokenizer(models.WordLevel(vocab, unk_token="<unk>"))


def ends(tok: Tokenizer) -> set[str]:
    return {str(tok.id_to_token(i)) for i in tok.eos_token_ids}


def test_phi3_ends_its_turns_with_end() -> None:
    tok = Tokenizer(backend(PHI3_VOCAB), chat_template=PHI3_TEMPLATE, eos_token="<|endoftext|>")
    assert ends(tok) == {"<|endoftext|>", "<|end|>"}
    # no template: every turn-end token the vocabulary holds
    assert ends(Tokenizer(backend(PHI3_VOCAB))) == {"<|end|>"}


@pytest.mark.parametrize("template", [HARMONY_TEMPLATE, None, PHI3_TEMPLATE],
                         ids=["harmony-template", "no-template", "other-template"])
def test_harmony_vocabulary_ends_on_return_and_call(template: str | None) -> None:
    """By the vocabulary alone (both <|return|> and <|call|>), whatever the template."""
    tok = Tokenizer(backend(HARMONY_VOCAB), chat_template=template, eos_token="<|return|>")
    assert ends(tok) == {"<|return|>", "<|call|>"}
    assert tok.with_chat_template(PHI3_TEMPLATE).eos_token_ids == tok.eos_token_ids


def test_harmony_template_without_call_token() -> None:
    """By the template (<|channel|>): <|end|> is no end even where <|call|> is missing."""
    vocab = tuple(t for t in HARMONY_VOCAB if t != "<|call|>")
    tok = Tokenizer(backend(vocab), chat_template=HARMONY_TEMPLATE)
    assert ends(tok) == {"<|return|>"}
    # the same vocabulary under a template without channels is no harmony: <|end|> ends
    assert ends(tok.with_chat_template(PHI3_TEMPLATE)) == {"<|end|>"}


def test_harmony_drops_end_from_listed_ids_but_not_from_the_eos() -> None:
    b = backend(HARMONY_VOCAB)
    end, text_end = (HARMONY_VOCAB.index(t) + 1 for t in ("<|end|>", "<|endoftext|>"))
    assert (b.token_to_id("<|end|>"), b.token_to_id("<|endoftext|>")) == (end, text_end)
    listed = Tokenizer(b, chat_template=HARMONY_TEMPLATE, eos_token="<|return|>",
                       extra_eos_ids=[end, text_end])
    assert ends(listed) == {"<|return|>", "<|call|>", "<|endoftext|>"}
    own = Tokenizer(b, chat_template=HARMONY_TEMPLATE, eos_token="<|end|>")
    assert own.eos_token_id == end and end in own.eos_token_ids  # its own EOS stays


def test_the_rule() -> None:
    def holds(*tokens: str) -> Callable[[str], bool]:
        return lambda t: t in tokens

    assert is_harmony("... <|channel|>final ...", holds())
    assert is_harmony(None, holds("<|return|>", "<|call|>"))
    assert not is_harmony(None, holds("<|return|>", "<|end|>"))
    assert not is_harmony(PHI3_TEMPLATE, holds(*PHI3_VOCAB))
    assert turn_end_tokens(HARMONY_TEMPLATE, holds(*HARMONY_VOCAB)) == HARMONY_TURN_END_TOKENS
    assert turn_end_tokens(PHI3_TEMPLATE, holds(*PHI3_VOCAB)) == ("<|end|>",)
    assert turn_end_tokens(None, holds(*TURN_END_TOKENS)) == TURN_END_TOKENS
    assert "<|end|>" not in turn_end_tokens(HARMONY_TEMPLATE, holds(*TURN_END_TOKENS))
