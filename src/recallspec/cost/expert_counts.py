"""What a mixture of experts' native forward tells its pricing: the shape
(``cost/experts.py: ExpertShape``, read from the model's weights) and the distinct
experts a forward woke (read from the forward's counters).

The native forward counts, in every forward and whether or not its profiling is on
(integer increments, no clock), ``expert_runs`` ((layer, expert) products run: each
expert that any row chose, once per layer and forward) and ``expert_rows`` ((layer,
row) routings), and keeps the last call's own (``NativeModel.last_experts``). So
expert_runs / layers of one forward is the distinct experts it woke per layer.
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
    """The distinct experts per layer the native forward's last call woke."""

    def __init__(self, native: Any, layers: int) -> None:
        self._native, self._layers = native, layers

    @staticmethod
    def of(model: Any) -> WokenExperts | None:
        """The counter of a mixture of experts' native forward (None: not one)."""
        if not getattr(model.config, "moe", False) or getattr(model, "native", None) is None:
            return None
        return WokenExperts(model.native, int(model.config.num_layers))

    def last(self, rows: int) -> float | None:
        """Distinct experts per layer the last forward call woke (read right after the
        forward meant: the counts are the model's, whoever called it); None where that
        call's routings are not ``rows`` x layers (a forward of other rows, or of fewer
        layers: a self-draft's; one refused before its layers ran)."""
        runs, routed = self._native.last_experts()
        if rows < 1 or routed != rows * self._layers:
            return None
        return runs / self._layers
