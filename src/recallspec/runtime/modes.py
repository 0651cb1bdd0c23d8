"""How one batched decoding step lays out its inputs and KV cache (EMS-SD's variants).

* ``ems`` (default): ragged inputs (each sequence feeds its own root + draft rows) and
  an unpadded KV cache (each sequence advances by its own accepted count).
* ``vanilla``: the padded baseline of the EMS-SD paper. Every sequence's rows are padded
  to the batch's longest draft, and every sequence's KV cache advances by the batch's
  largest accepted count; the entries a sequence did not accept are padding that later
  attention masks out.
* ``unpad-kv``: padded inputs, unpadded KV cache (half-way ablation).
* ``unpad-input``: ragged inputs, padded KV cache (the other half-way ablation).

How large each sequence's draft is (cost-aware or fixed) is not a layout but the
request's sizing (``spec/draft_sizing.py``, ``engine/config.py``'s ``split_mode``, which
still reads the word ``adaptive`` where a mode is given).

Padding rows and padding KV entries never influence real rows: padding rows are leaves
hanging below the root (no real row attends to them) and padding KV entries are masked.
So every mode commits exactly the same tokens; only the cost differs.
"""

from __future__ import annotations

from dataclasses import dataclass

from recallspec.errors import UnknownNameError


@dataclass(frozen=True)
class BatchMode:
    name: str
    pad_inputs: bool = False  # pad each sequence's rows to the batch's longest run
    pad_kv: bool = False  # advance every KV slot by the batch's largest accepted count


BATCH_MODES: dict[str, BatchMode] = {
    m.name: m
    for m in (
        BatchMode("ems"),
        BatchMode("vanilla", pad_inputs=True, pad_kv=True),
        BatchMode("unpad-kv", pad_inputs=True),
        BatchMode("unpad-input", pad_kv=True),
    )
}
EMS = BATCH_MODES["ems"]  # the default layout


def batch_mode(mode: str | BatchMode) -> BatchMode:
    if isinstance(mode, BatchMode):
        return mode
    try:
        return BATCH_MODES[mode]
    except KeyError:
        raise UnknownNameError(
            f"unknown batch mode {mode!r}; available: {', '.join(BATCH_MODES)}"
        ) from None
