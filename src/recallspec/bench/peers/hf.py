"""The ``hf-*`` peers: transformers ``generate`` on our own weights, inside the child
process ``bench/peers/worker.py`` starts (``hf-greedy``; ``hf-pld``: its prompt lookup).

The model is ``bench/common/hf.py``'s transformers CausalLM holding the tensors our
loader read, so only the arithmetic differs from ours. transformers reports no per-step
acceptance: ``HFMethod`` counts its forwards with a pre-forward hook instead.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch
import transformers

from recallspec.bench.common.hf import hf_model_from_model
from recallspec.bench.common.method import TurnOutput
from recallspec.decoding.sampling import SamplingParams
from recallspec.models import load_model

HF_PLD_TOKENS = 10  # hf-pld's prompt_lookup_num_tokens


class HFMethod:
    """transformers ``generate``; accept lengths come from counting its forwards."""

    def __init__(self, hf_model: Any, tokenizer: Any, name: str) -> None:
        self.model = hf_model
        self.tokenizer = tokenizer
        self.name = name
        self.baseline = "hf-greedy"
        self._pld = name == "hf-pld"
        self._starts: list[int] = []

    def _record(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Cache length before each forward = committed tokens - 1 (the last committed
        # token is fed, not cached), so consecutive differences are accept lengths.
        cp = kwargs.get("cache_position")
        if cp is not None and cp.numel():
            self._starts.append(int(cp[0]))
        else:
            pkv = kwargs.get("past_key_values")
            self._starts.append(int(pkv.get_seq_length()) if pkv is not None else 0)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> TurnOutput:
        eos = sorted(self.tokenizer.eos_token_ids)
        ids = torch.tensor([prompt_ids], dtype=torch.long)
        kw: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "eos_token_id": eos if not params.ignore_eos else None,
            "pad_token_id": eos[0] if eos else 0,
        }
        if params.greedy:
            kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            torch.manual_seed(params.seed if params.seed is not None else 0)
            kw.update(
                do_sample=True, temperature=params.temperature,
                top_k=params.top_k or None, top_p=params.top_p,
            )
        if self._pld:
            kw["prompt_lookup_num_tokens"] = HF_PLD_TOKENS
        self._starts = []
        # The hook lives only during this call: hf-greedy and hf-pld share the model.
        hook = self.model.register_forward_pre_hook(self._record, with_kwargs=True)
        try:
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
            wall = time.perf_counter() - t0
        finally:
            hook.remove()
        gen = [int(t) for t in out[0, len(prompt_ids) :].tolist()]
        finish = "length"
        eos_set = set(eos) if not params.ignore_eos else set()
        for i, t in enumerate(gen):  # cut at the first EOS, as our engine stops there
            if t in eos_set:
                gen, finish = gen[: i + 1], "eos"
                break
        committed = len(gen)
        if finish == "eos":
            gen = gen[:-1]
        accepts = _accepts(self._starts, len(prompt_ids), committed)
        return TurnOutput(
            gen, self.tokenizer.decode(gen), accepts, wall, len(prompt_ids), finish
        )


def _accepts(starts: list[int], prompt_len: int, committed: int) -> list[int]:
    """Per-step accept lengths from the cache lengths before each forward.

    ``starts[0]`` is the prefill; decode forward k starts at ``starts[k]`` = committed
    tokens - 1, so it committed ``starts[k + 1] - starts[k]``; the last one ends at the
    output's end (``prompt_len + committed - 1`` cached after it).
    """
    if len(starts) < 2 or committed <= 1:
        return []
    steps = [b - a for a, b in itertools.pairwise(starts[1:])]
    steps.append(prompt_len + committed - 1 - starts[-1])
    # Tokens generated past an EOS / the length cap inside the last step are not committed.
    out, total = [], 0
    for s in steps:
        s = min(s, committed - 1 - total)
        if s <= 0:
            break
        out.append(s)
        total += s
    return out


class HFWorker:
    """The ``hf-*`` child's side of the protocol (``bench/peers/worker.py``): loads our
    model as a transformers one and answers generate requests."""

    def __init__(self, name: str, model_spec: str | None, threads: int, dtype: str) -> None:
        torch.set_num_threads(threads)
        # transformers runs our weights in a torch dtype: the reference fp32 weights for
        # the quantized default (the same values our fp32 path computes with).
        model, tok = load_model(model_spec, dtype=dtype if dtype == "bfloat16" else "float32")
        self.method = HFMethod(hf_model_from_model(model), tok, name)
        del model
        self.info = {"transformers": transformers.__version__, "torch": torch.__version__,
                     "threads": threads}

    def generate(self, req: dict[str, Any]) -> dict[str, Any]:
        params = SamplingParams(
            temperature=float(req["temperature"]), top_p=float(req["top_p"]),
            top_k=int(req["top_k"]), max_new_tokens=int(req["max_new_tokens"]),
            seed=req["seed"], ignore_eos=bool(req["ignore_eos"]),
        )
        o = self.method.generate(list(req["prompt_ids"]), params)
        return {"token_ids": o.token_ids, "accept_lengths": o.accept_lengths,
                "wall_time": o.wall_time, "finish_reason": o.finish_reason}
