"""The model's top-k next tokens along recorded ``ar`` answers, for replaying drafters
that learn from verification logits (Token Recycling inside ``sam+recycling``).

A verification forward gives logits for the root and every tree node. Along the path
the engine commits, those rows are the rows of a teacher-forced forward over prompt +
answer: the native forward is batch-invariant (a row's logits do not depend on the
other rows of its forward), so one forward per turn reproduces them bit for bit. The
rows of *rejected* nodes (the model's view after a wrong token) are not on that path
and stay unknown: replay feeds such a drafter the committed rows only, an
approximation that the report flags (small under cost-aware sizing, whose trees are a
few nodes).

``topk[t]`` of a turn: the ids of the k largest logits of the row that predicts output
token t (row 0 is the prompt's last token). Computed once per answer file and model,
cached under the recallspec cache directory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from recallspec.decoding.tree import DraftTree
from recallspec.runtime.batch import SequenceInput, build_batch

TOPK = 8  # recycling's TOPK
CHUNK = 512  # prompt rows per forward (the engine's prefill chunk)

TurnTopk = npt.NDArray[np.int32]  # [len(output) (+1 for an EOS), k]


def _turn_topk(model: Any, cache: Any, prompt: Sequence[int], full: Sequence[int],
               k: int) -> TurnTopk:
    slot = cache.allocate()
    try:
        rows: list[torch.Tensor] = []
        seq = [*prompt, *full[:-1]]
        n_prompt = len(prompt)
        for s in range(0, len(seq), CHUNK):
            toks = seq[s : s + CHUNK]
            # Logits from the prompt's last row on; earlier prompt rows need none.
            sel = "all" if s + len(toks) > n_prompt - 1 else "none"
            out = model(build_batch([SequenceInput(slot, s, toks, logits=sel)]), cache)
            cache.commit(slot, s, range(len(toks)))
            if sel == "all":
                first = max(n_prompt - 1 - s, 0)
                rows.append(torch.topk(out[first:].float(), k, dim=-1).indices)
        return torch.cat(rows).numpy().astype(np.int32)
    finally:
        cache.release(slot)


def answer_topk(
    model: Any, records: Sequence[dict[str, Any]], k: int = TOPK,
) -> dict[str, list[TurnTopk]]:
    """question_id -> per turn the top-k ids of each output position (see module doc)."""
    longest = max(len(p) + len(t) + 1 for r in records
                  for p, t in zip(r["choices"][0]["prompt_ids"], r["choices"][0]["token_ids"],
                                  strict=True))
    cache = model.new_cache(1, longest + 1)
    out: dict[str, list[TurnTopk]] = {}
    with torch.inference_mode():
        for r in records:
            c = r["choices"][0]
            eos = (r.get("eos_token_ids") or [0])[0]
            turns = []
            for p, t, f in zip(c["prompt_ids"], c["token_ids"], c["finish_reason"], strict=True):
                full = [*t, eos] if f == "eos" else list(t)
                turns.append(_turn_topk(model, cache, p, full, k) if full else
                             np.zeros((0, k), np.int32))
            out[str(r["question_id"])] = turns
    return out


def cached_answer_topk(
    model: Any, records: Sequence[dict[str, Any]], answers: Path, model_key: str,
    cache_root: Path,
) -> dict[str, list[TurnTopk]]:
    """``answer_topk``, cached per answer file contents and ``model_key``."""
    h = hashlib.sha256(answers.read_bytes() + model_key.encode()).hexdigest()[:16]
    path = cache_root / "replay_topk" / f"{h}.npz"
    if path.is_file():
        with np.load(path) as z:
            by: dict[str, dict[int, TurnTopk]] = {}
            for name in z.files:
                qid, _, turn = name.rpartition("/")
                by.setdefault(qid, {})[int(turn)] = z[name]
            return {q: [ts[i] for i in sorted(ts)] for q, ts in by.items()}
    res = answer_topk(model, records)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    arrays: dict[str, Any] = {f"{q}/{i}": a for q, ts in res.items() for i, a in enumerate(ts)}
    np.savez_compressed(tmp, **arrays)
    tmp.replace(path)
    return res


def committed_logits(
    path_tokens: Sequence[int], rows: TurnTopk, vocab: int,
) -> tuple[DraftTree, torch.Tensor]:
    """The committed path as a chain and logits whose top-k are ``rows`` (ranks kept):
    what replay hands a drafter instead of the verification's logits. ``rows``: one
    row for the root and one per path token."""
    tree = DraftTree.chain(list(path_tokens))
    logits = torch.zeros(len(rows), vocab)
    k = rows.shape[1]
    idx = torch.from_numpy(rows.astype(np.int64))
    logits.scatter_(1, idx, torch.arange(k, 0, -1, dtype=torch.float32).expand(len(rows), k))
    return tree, logits
