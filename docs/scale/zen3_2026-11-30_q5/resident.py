"""Resident weight bytes of a GGUF loaded in this process (no repack cache read or written)."""
import os, sys, tempfile
os.environ["RECALLSPEC_CACHE_DIR"] = tempfile.mkdtemp()
from recallspec.models import load_model
p = sys.argv[1]
m, _ = load_model(p, repack_cache=False)
wb = m.weight_bytes()
print(f"{os.path.basename(p)}: weights {wb/1e6:.1f} MB, file {os.path.getsize(p)/1e6:.1f} MB, {wb/os.path.getsize(p):.3f}x")
