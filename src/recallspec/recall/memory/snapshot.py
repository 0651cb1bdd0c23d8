"""Response-memory snapshots: every tenant's documents in one checked file.

Layout (little-endian), the same discipline as index files (a magic, a checksummed
header naming the tokenizer, a checksummed payload, atomic writes)::

    b"RSMEMORY"                 magic (8 bytes)
    u64 header_bytes            length of the JSON header
    header                      JSON: format, tokenizer fingerprint, vocab_size,
                                tenants [[name, n_docs, n_tokens], ...], payload_bytes,
                                payload_hash (blake2b-128, hex)
    16 bytes                    blake2b-128 of the header bytes
    payload                     per tenant: int64 offsets[n_docs + 1], uint32 tokens

Any problem is an ``IndexFileError`` naming the file: a snapshot written with another
tokenizer, truncated or corrupted is refused, never half-loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from itertools import pairwise
from pathlib import Path

import numpy as np
import numpy.typing as npt

from recallspec.errors import IndexFileError
from recallspec.recall.fileio import atomic_path
from recallspec.recall.view import flatten

MAGIC = b"RSMEMORY"
FORMAT = 1
Doc = npt.NDArray[np.uint32]


def _digest(data: bytes | memoryview) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def save_snapshot(path: str | os.PathLike[str], docs: dict[str, list[Doc]],
                  fingerprint: str, vocab_size: int) -> int:
    """Write ``docs`` (tenant -> documents) atomically; returns the file size."""
    chunks: list[bytes] = []
    tenants = []
    for name, tenant_docs in docs.items():
        tokens, offsets = flatten(tenant_docs)
        chunks += [offsets.astype("<i8").tobytes(), tokens.astype("<u4").tobytes()]
        tenants.append([name, len(tenant_docs), int(tokens.shape[0])])
    payload = b"".join(chunks)
    header = json.dumps({
        "format": FORMAT, "fingerprint": fingerprint, "vocab_size": vocab_size,
        "tenants": tenants, "payload_bytes": len(payload),
        "payload_hash": _digest(payload).hex(),
    }, separators=(",", ":")).encode()
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header + _digest(header))
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    return len(MAGIC) + 8 + len(header) + 16 + len(payload)


def load_snapshot(path: str | os.PathLike[str], fingerprint: str,
                  vocab_size: int) -> dict[str, list[Doc]]:
    """Read and check a snapshot written by ``save_snapshot``."""
    p = Path(path)

    def bad(why: str) -> IndexFileError:
        return IndexFileError(f"{p}: {why}")

    try:
        data = memoryview(p.read_bytes())
    except OSError as e:
        raise bad(f"cannot read the memory snapshot: {e.strerror or e}") from None
    if bytes(data[:8]) != MAGIC or len(data) < 16:
        raise bad("not a response-memory snapshot (bad magic)")
    (n,) = struct.unpack("<Q", data[8:16])
    if 16 + n + 16 > len(data):
        raise bad("truncated header")
    header = bytes(data[16 : 16 + n])
    if _digest(header) != bytes(data[16 + n : 32 + n]):
        raise bad("header checksum mismatch (corrupt file)")
    try:
        h = json.loads(header)
    except json.JSONDecodeError:
        raise bad("unreadable header") from None
    if h.get("format") != FORMAT:
        raise bad(f"snapshot format {h.get('format')!r}, this version reads {FORMAT}")
    if h.get("fingerprint") != fingerprint:
        raise bad("written with a different tokenizer; start without it or delete it")
    if h.get("vocab_size") != vocab_size:
        raise bad(f"vocabulary size {h.get('vocab_size')} does not match the model's "
                  f"{vocab_size}")
    payload = data[32 + n :]
    if len(payload) != h.get("payload_bytes") or _digest(payload).hex() != h.get("payload_hash"):
        raise bad("payload size or checksum mismatch (truncated or corrupt file)")
    out: dict[str, list[Doc]] = {}
    pos = 0
    try:
        for name, n_docs, n_tokens in h["tenants"]:
            offsets = np.frombuffer(payload, "<i8", n_docs + 1, pos).astype(np.int64)
            pos += 8 * (n_docs + 1)
            tokens = np.frombuffer(payload, "<u4", n_tokens, pos).astype(np.uint32)
            pos += 4 * n_tokens
            if offsets[0] != 0 or offsets[-1] != n_tokens or np.any(np.diff(offsets) < 0):
                raise ValueError("bad offsets")
            if n_tokens and int(tokens.max()) >= vocab_size:
                raise ValueError("token id out of range")
            out[str(name)] = [tokens[a:b] for a, b in pairwise(offsets.tolist())]
    except (ValueError, TypeError, KeyError) as e:
        raise bad(f"inconsistent payload ({e})") from None
    if pos != len(payload):
        raise bad("inconsistent payload (trailing bytes)")
    return out
