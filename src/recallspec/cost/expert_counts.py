"""What a mixture of experts' native forward tells its pricing: the shape
(``cost/experts.py: ExpertShape``, read from the model's weights) and the distinct
experts a forward woke (read from the forward's counters).

The native forward counts ``expert_runs`` ((layer, expert) products run: each expert
that any row chose, once per layer and forward), ``expert_rows`` ((layer, row)
routings) and ``calls`` (forwards) while its profiling is on (``NativeModel.profile``;
profiling adds a clock read between a forward's parts and changes no value). So
expert_runs / layers over one forward is the distinct experts it woke per layer.
"""

from __future__ import annotations

from typing import Any

from recallspec.cost.experts import ExpertShape


def expert_bytes(model: Any) -> int:
    """Resident bytes of a mixture of experts' experts: every layer's expert matrices and
    (gpt-oss) their biases, the parts of which a token reads experts_per_token of
    num_experts (every expert of a layer is the same size)."""
    return sum(int(w.nbytes) for layer in model.layers
               for w in (*layer.expert_gate_up, *layer.expert_down,
                         *layer.expert_gate_up_b, *layer.expert_down_b))


def expert_shape(model: Any) -> ExpertShape | None:
    """The pricing shape of a mixture of experts run by the native forward (None: a
    dense model, or one without the native forward, which counts no experts).

    ``expert_share``: one expert's matrices and biases in one layer over the bytes a
    token's forward reads: every resident weight but the embedding table (one row a
    token; counted when tied, as the head) and, of the experts, K of E."""
    c = model.config
    if not getattr(c, "moe", False) or getattr(model, "native", None) is None:
        return None
    e, k, layers = int(c.num_experts), int(c.experts_per_token), list(model.layers)
    experts = expert_bytes(model)
    embed = model.embed_w
    read = int(model.weight_bytes()) - (0 if embed is model.lm_head_w else int(embed.nbytes))
    read -= experts - experts * k // e
    one = experts / (len(layers) * e)
    return ExpertShape(e, k, len(layers), min(one / read, 1.0) if read > 0 else 1.0)


class WokenExperts:
    """The distinct experts per layer one native forward woke: its counters read
    before (``begin``) and after (``end``) it."""

    def __init__(self, native: Any, layers: int) -> None:
        self._native, self._layers = native, layers
        self._at: tuple[int, int, int] | None = None

    @staticmethod
    def of(model: Any) -> WokenExperts | None:
        """The counter of a mixture of experts' native forward (None: not one)."""
        if expert_shape(model) is None:
            return None
        return WokenExperts(model.native, int(model.config.num_layers))

    def _read(self) -> tuple[int, int, int]:
        p = self._native.profile(reset=False)
        return int(p["expert_runs"]), int(p["expert_rows"]), int(p["calls"])

    def begin(self) -> None:
        """Before the forward: profiling on (every time: another owner may have turned
        it off), the counters noted."""
        self._native.set_profiling(True)
        self._at = self._read()

    def end(self, rows: int) -> float | None:
        """After it: distinct experts per layer the forward of ``rows`` rows woke; None
        where the counters do not show exactly one forward of ``rows`` rows through
        every layer since ``begin`` (a drafter's own forward ran between, or another
        owner reset the counters or turned profiling off)."""
        if self._at is None:
            return None
        runs0, rows0, calls0 = self._at
        self._at = None
        runs, routed, calls = self._read()
        if calls - calls0 != 1 or routed - rows0 != rows * self._layers or rows < 1:
            return None
        return (runs - runs0) / self._layers

    def stop(self) -> None:
        """Profiling off (the forward's default)."""
        self._native.set_profiling(False)
        self._at = None
