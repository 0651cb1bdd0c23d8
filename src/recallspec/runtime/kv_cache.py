"""Per-sequence KV cache ("unpadded KV cache", EMS-SD).

Storage is one tensor per K and V with layout ``[layers, slots, kv_heads, max_len,
head_dim]``. Each sequence owns one slot and its own length, so sequences of different
lengths share the cache without padding, and ``k[layer, slot, :, :n]`` is a strided view
that attention reads without a copy. The tensors are reserved address space, not
memory: a page is committed when a row on it is first written and given back when its
slot frees it (``kv_memory.py``), so the cache occupies the rows sequences hold, not
slots x ``max_len``; ``resident_rows`` bounds them (the scheduler admits requests
within a budget of rows).

Invariant: positions ``[0, length(slot))`` of a slot hold the keys/values of the
sequence's committed tokens, in order. A forward may write speculative rows past the
length; ``commit`` then keeps the accepted ones (compacting a tree path) and the rest
is garbage that later writes overwrite.

Masked entries: ``pad`` appends entries to a slot that count towards its length but
are never attended to (nothing in the engine writes them; EMS-SD's padded-KV baselines,
a benchmark ablation in ``bench/suite/padded_layouts.py``, do). ``valid_prefix`` gives the mask
of real entries, ``logical_length`` counts them, and every reader of a slot honours
them (``SequenceInput.cache_valid``). The capability stays here, generic, because the
native forward implements the mask in C++ (``csrc/native/native_plan.cpp``): moving it
out would change the C++ side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from recallspec.errors import ResourceError
from recallspec.runtime.kv_memory import LazyTensor, available_memory


class KVCacheFullError(RuntimeError):
    """Raised when a slot or the cache as a whole has no room for a request."""


@dataclass(frozen=True)
class KVPrefix:
    """A snapshot of one slot's committed entries, for a reader that feeds tokens after
    them without committing (a self-draft sharing the target's cache writes speculative
    rows past ``length``, which the next verification forward overwrites)."""

    cache: KVCache
    slot: int
    length: int  # entries in the slot, padding included: the next row's cache position
    logical_length: int  # real entries: the next token's position
    valid: torch.Tensor | None  # [length] bool, None when the slot holds no padding


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        max_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if num_slots < 1 or max_len < 1:
            raise ValueError("KV cache needs at least one slot and one position")
        shape = (num_layers, num_slots, num_kv_heads, max_len, head_dim)
        # Pages committed as rows are written, given back as slots free them
        # (``kv_memory.py``); a device other than the CPU gets plain zeros.
        self._lazy: tuple[LazyTensor, LazyTensor] | None = None
        if torch.device(device).type == "cpu":
            self._lazy = (LazyTensor(shape, dtype), LazyTensor(shape, dtype))
            self.k, self.v = self._lazy[0].tensor, self._lazy[1].tensor  # [L, S, Hkv, N, D]
        else:
            self.k = torch.zeros(shape, dtype=dtype, device=device)
            self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.num_slots = num_slots
        self._lengths = [0] * num_slots
        self._holes = [0] * num_slots  # padding entries below each slot's length
        self._valid = torch.ones(num_slots, max_len, dtype=torch.bool)  # [S, N]
        self._free = list(range(num_slots - 1, -1, -1))
        self._allocations = [0] * num_slots  # times each slot was allocated
        # Rows each slot may hold in memory (an upper bound: what was written or announced
        # with ``expect`` since the slot last gave its rows back).
        self._resident = [0] * num_slots

    # ---- slot lifecycle -------------------------------------------------
    def allocate(self, slot: int | None = None) -> int:
        """Take a free slot (length 0): ``slot`` if given (it must be free), else the
        next one. Its rows stay as they were until written (``resume``)."""
        if not self._free:
            raise KVCacheFullError(f"all {self.num_slots} KV-cache slots are in use")
        if slot is None:
            slot = self._free.pop()
        elif slot in self._free:
            self._free.remove(slot)
        else:
            raise ValueError(f"slot {slot} is not free")
        self._allocations[slot] += 1
        self._lengths[slot] = 0
        self._holes[slot] = 0
        self._valid[slot] = True
        return slot

    def release(self, slot: int, keep: int = 0) -> None:
        """Free the slot; the memory of its rows from ``keep`` on goes back to the system
        (rows below ``keep`` stay as they are: a prefix retained for later prompts)."""
        self._check_slot(slot)
        if slot in self._free:
            raise ValueError(f"slot {slot} is not allocated")
        self._lengths[slot] = 0
        self._free.append(slot)
        self.give_back(slot, keep)

    def give_back(self, slot: int, keep: int = 0) -> None:
        """Return the memory of a free slot's rows from ``keep`` on (they read as zeros
        afterwards; a retained prefix shorter than ``keep`` stays intact)."""
        self._check_slot(slot)
        if slot not in self._free:
            raise ValueError(f"slot {slot} is in use: its rows cannot be given back")
        if not 0 <= keep <= self.max_len:
            raise ValueError(f"cannot keep {keep} rows of {self.max_len}")
        if self._lazy is not None and keep < self.max_len:
            layers, _, heads, n, d = self.k.shape
            row = d * self.k.element_size()
            for lazy in self._lazy:
                for layer in range(layers):
                    for h in range(heads):
                        base = (((layer * self.num_slots + slot) * heads + h) * n) * row
                        lazy.give_back(base + keep * row, base + n * row)
        self._resident[slot] = min(self._resident[slot], keep)

    def expect(self, slot: int, rows: int) -> None:
        """Note that the slot's sequence may write up to ``rows`` rows (its prompt, its
        new tokens and a draft's): counted in ``resident_rows`` from now on."""
        self._check_slot(slot)
        self._resident[slot] = max(self._resident[slot], min(rows, self.max_len))

    def resident_rows(self, slot: int | None = None) -> int:
        """Rows the slot (None: every slot) may hold in memory: an upper bound of what
        its sequences wrote or announced (``expect``) since it last gave rows back."""
        if slot is None:
            return sum(self._resident)
        self._check_slot(slot)
        return self._resident[slot]

    def resume(self, slot: int, length: int) -> None:
        """Take the first ``length`` rows of a freshly allocated slot as committed: they
        hold the keys and values of the tokens its new sequence starts with (a prefix
        kept from the slot's previous sequence, ``engine/prefix_cache.py``)."""
        self._check_slot(slot)
        if self._lengths[slot] or self._holes[slot] or slot in self._free:
            raise ValueError(f"slot {slot} must be freshly allocated to resume")
        if not 0 <= length <= self.max_len:
            raise ValueError(f"cannot resume {length} rows of {self.max_len}")
        self._lengths[slot] = length
        self.expect(slot, length)

    def rows(self, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the slot's first ``n`` rows' keys and values, each
        [layers, kv_heads, n, head_dim] (``load`` puts them back, bit for bit)."""
        self._check_slot(slot)
        return self.k[:, slot, :, :n].clone(), self.v[:, slot, :, :n].clone()

    def load(self, slot: int, k: torch.Tensor, v: torch.Tensor, n: int) -> None:
        """Write the first ``n`` rows of ``k``, ``v`` (from ``rows``) into a freshly
        allocated slot and take them as committed (``resume``)."""
        if k.shape[2] < n or v.shape != k.shape or k.dtype != self.k.dtype:
            raise ValueError("rows to load must come from a cache of this layout")
        self.resume(slot, n)
        self.k[:, slot, :, :n] = k[:, :, :n]
        self.v[:, slot, :, :n] = v[:, :, :n]

    def copy(self, src: int, dst: int, n: int) -> None:
        """Write the first ``n`` committed rows of slot ``src`` (in use) into the freshly
        allocated slot ``dst`` and take them as committed there (``resume``): bit for bit,
        one copy (a request starting from a running request's prompt)."""
        self._check_slot(src)
        if n > self._lengths[src] or self._holes[src]:
            raise ValueError(f"slot {src} holds {self._lengths[src]} plain rows, not {n}")
        self.load(dst, self.k[:, src], self.v[:, src], n)  # (views: no copy before load's)

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocations(self, slot: int) -> int:
        """How many times the slot was allocated: a free slot's rows are those its last
        sequence left only while this count is unchanged (whoever allocates it, e.g. a
        test or a tool running the model on this cache, may overwrite them)."""
        self._check_slot(slot)
        return self._allocations[slot]

    def free_slot_ids(self) -> list[int]:
        """The free slots, the next one ``allocate`` would take first."""
        return self._free[::-1]

    def length(self, slot: int) -> int:
        self._check_slot(slot)
        return self._lengths[slot]

    def logical_length(self, slot: int) -> int:
        """Real (non-padding) entries of the slot: the position of its next token."""
        return self.length(slot) - self._holes[slot]

    def prefix(self, slot: int) -> KVPrefix:
        """The slot's committed entries as a ``KVPrefix``."""
        return KVPrefix(self, slot, self.length(slot), self.logical_length(slot),
                        self.valid_prefix(slot))

    def valid_prefix(self, slot: int) -> torch.Tensor | None:
        """[length] bool mask of real entries, or None when the slot holds no padding."""
        if not self._holes[slot]:
            return None
        return self._valid[slot, : self._lengths[slot]].clone()

    def pad(self, slot: int, n: int) -> None:
        """Append ``n`` padding entries (masked out of all later attention)."""
        self._check_slot(slot)
        start = self._lengths[slot]
        if start + n > self.max_len:
            raise KVCacheFullError(
                f"slot {slot} overflows the cache ({start + n} > {self.max_len})"
            )
        self._valid[slot, start : start + n] = False
        self._lengths[slot] = start + n
        self._holes[slot] += n

    @staticmethod
    def bytes_needed(
        *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype,
    ) -> int:
        """Bytes the K and V tensors of such a cache occupy (checked before allocating)."""
        elem = torch.empty(0, dtype=dtype).element_size()
        return 2 * num_layers * num_slots * max_len * num_kv_heads * head_dim * elem

    @staticmethod
    def check_fits(
        *, num_layers: int, num_slots: int, max_len: int, num_kv_heads: int, head_dim: int,
        dtype: torch.dtype,
    ) -> None:
        """Refuse (``ResourceError``, naming the longest sequences that would fit)
        ``num_slots`` sequences of ``max_len`` positions that do not fit in the memory
        available now, leaving 20% for activations, drafters and the rest of the process,
        instead of letting the machine fail later. The wording names no setting: the
        engine's, a draft model's and a calibration's caches are all checked here; the
        engine adds its settings."""
        need = KVCache.bytes_needed(num_layers=num_layers, num_slots=num_slots,
                                    max_len=max_len, num_kv_heads=num_kv_heads,
                                    head_dim=head_dim, dtype=dtype)
        avail = available_memory()
        if avail is None:
            return
        if need > 0.8 * avail:
            fit = int(0.8 * avail // (need / (num_slots * max_len) * num_slots))
            raise ResourceError(
                f"{num_slots} sequence(s) of {max_len} positions need "
                f"{need / 2**30:.1f} GiB of KV cache, {avail / 2**30:.1f} GiB available (at "
                f"most {fit} positions a sequence fit, leaving 20% for the rest)"
            )

    def budget_rows(self) -> int:
        """Rows the cache may hold in memory at once: 80% of the memory available now
        (what is resident already included), at most every slot full, at least one."""
        avail = available_memory()
        total = self.num_slots * self.max_len
        if avail is None:
            return total
        fit = int((0.8 * avail) // self.bytes_per_token()) + self.resident_rows()
        return max(min(fit, total), self.max_len)

    def bytes_per_token(self) -> int:
        """K+V bytes one token occupies across all layers."""
        _, _, h, _, d = self.k.shape
        return 2 * self.k.shape[0] * h * d * self.k.element_size()

    # ---- writes ------------------------------------------------------------
    def write(
        self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
        k: torch.Tensor, v: torch.Tensor,
    ) -> None:
        """Write rows at arbitrary (slot, position) pairs of one layer.

        slots, positions: [T] int64; k, v: [T, Hkv, D] (rounded to nearest even into a
        16-bit cache, as the native forward does).
        """
        self.k[layer, slots, :, positions] = k.to(self.k.dtype)
        self.v[layer, slots, :, positions] = v.to(self.v.dtype)

    def reserve(self, slot: int, n_new: int) -> None:
        """Check that ``n_new`` rows fit after the slot's committed length."""
        need = self._lengths[slot] + n_new
        if need > self.max_len:
            raise KVCacheFullError(
                f"slot {slot} needs {need} positions but the cache holds {self.max_len}"
            )

    def commit(self, slot: int, start: int, keep: Sequence[int]) -> None:
        """Make ``keep`` (offsets from ``start`` of rows written by the last forward)
        the slot's next committed tokens, in order, and set the length accordingly.

        ``start`` must equal the committed length before the forward. Rows not kept
        (rejected draft tokens) are dropped; a tree path is compacted so that its
        nodes become contiguous.
        """
        self._check_slot(slot)
        if start != self._lengths[slot]:
            raise ValueError(
                f"commit at {start} but slot {slot} has length {self._lengths[slot]}"
            )
        m = len(keep)
        if start + m > self.max_len:
            raise KVCacheFullError(
                f"slot {slot} overflows the cache ({start + m} > {self.max_len})"
            )
        if any(o != i for i, o in enumerate(keep)):
            src = torch.tensor([start + o for o in keep], dtype=torch.int64)
            dst = torch.arange(start, start + m, dtype=torch.int64)
            # Gather first (advanced indexing copies), then scatter: safe when ranges overlap.
            self.k[:, slot, :, dst] = self.k[:, slot, :, src]
            self.v[:, slot, :, dst] = self.v[:, slot, :, src]
        if self._holes[slot]:
            self._valid[slot, start : start + m] = True
        self._lengths[slot] = start + m
        if start + m > self._resident[slot]:
            self._resident[slot] = start + m

    def rollback(self, slot: int, length: int) -> None:
        """Forget everything after ``length`` committed tokens."""
        self._check_slot(slot)
        if not 0 <= length <= self._lengths[slot]:
            raise ValueError(
                f"cannot roll slot {slot} back to {length} (has {self._lengths[slot]})"
            )
        self._lengths[slot] = length
        if self._holes[slot]:
            self._holes[slot] = int((~self._valid[slot, :length]).sum())
            self._valid[slot, length:] = True

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"KV-cache slot {slot} out of range [0, {self.num_slots})")
