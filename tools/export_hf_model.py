"""Export a model as we load it (fp32) to a transformers directory, for other engines.

    .venv/bin/python tools/export_hf_model.py --out build/smollm2-hf [--model SPEC]

Writes ``config.json``, ``model.safetensors``, ``generation_config.json`` (from
``save_pretrained`` of the transformers model holding our loaded weights,
``recallspec.bench.common.hf``) and the tokenizer files our loader reads (``tokenizer.json``,
``tokenizer_config.json``), so vLLM (``make test-vllm``) serves bit-identical weights
with the same vocabulary and chat template. Skips the work when ``--out`` already holds
an export of the same model file (``recallspec_source.json``). The Makefile runs it for
``make test-vllm`` (``build/smollm2-hf/config.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory to write")
    ap.add_argument("--model", default=None, help="model spec (default: SmolLM2-135M-Instruct)")
    args = ap.parse_args()

    import torch

    from recallspec.bench.common.hf import hf_model_from_model
    from recallspec.models import load_model
    from recallspec.models.loader import model_dir, resolve_model

    source = resolve_model(args.model)
    out = Path(args.out)
    stamp = {"source": str(source), "bytes": source.stat().st_size if source.is_file() else None}
    marker = out / "recallspec_source.json"
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        print(f"{out}: up to date")
        return 0
    model, _ = load_model(args.model, dtype=torch.float32)
    hf = hf_model_from_model(model)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(out)
    src_dir = model_dir(args.model)  # holds the tokenizer files our loader reads
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (src_dir / name).is_file():
            shutil.copyfile(src_dir / name, out / name)
    marker.write_text(json.dumps(stamp))
    print(f"{out}: exported {source.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
