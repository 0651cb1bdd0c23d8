"""The settings of ``recallspec bench scale``: which (shape, quantization) entries it
measures and how (``bench/scale/command.py`` runs them).

Light on purpose (no torch): the CLI builds its parser from these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from recallspec.bench.common.args import positive_ints
from recallspec.bench.common.shapes import QUANTS, get_shape
from recallspec.errors import DataError, UnknownNameError

SHAPES_Q4KM = ("smollm2-360m", "qwen2.5-1.5b", "smollm2-1.7b", "llama-3.2-1b",
               "llama-3.2-3b", "smollm3-3b", "phi-4-mini", "gemma-3-4b", "qwen3-4b",
               "llama-3.1-8b")
# Every dense shape at Q4_K_M (what most downloads are), two of them also at Q4_0 and Q8_0.
# (Not the mixtures of experts, qwen3-30b-a3b and gpt-oss-20b: their Q8_0 intermediates,
# 32 and 22 GB, and quantized files, about 19 and 12 GB, fit few machines; name one, or a
# reduction such as qwen3-30b-a3b-L8, with --shapes; gpt-oss-20b at MXFP4_MOE, as it is
# published.)
DEFAULT_MATRIX: tuple[tuple[str, str], ...] = (
    *((s, "Q4_K_M") for s in SHAPES_Q4KM),
    ("smollm2-1.7b", "Q4_0"), ("smollm2-1.7b", "Q8_0"),
    ("llama-3.1-8b", "Q4_0"), ("llama-3.1-8b", "Q8_0"),
)
PREDICT_METHODS = ("ar", "pld", "llma", "sam+recycling:mode=adaptive", "portfolio:mode=adaptive")


@dataclass(frozen=True)
class ScaleConfig:
    # (shape, quantization); a shape is ``get_shape``'s: a registry name, or <name>-L<n>,
    # its first n layers (a reduced shape, so labelled: e.g. qwen3-30b-a3b-L8, whose F16
    # intermediate fits where the full one's 61 GB does not).
    entries: tuple[tuple[str, str], ...] = DEFAULT_MATRIX
    repeats: int = 3
    new_tokens: int = 128  # decode: tokens generated
    prefill: int = 512  # prefill: prompt tokens
    ks: tuple[int, ...] = (1, 2, 4, 8, 16, 32)  # verification rows
    cached: int = 512  # tokens in the KV cache under the verification curve
    threads: int | None = None  # both engines (default: torch's, i.e. every core)
    llamacpp: bool = True
    answers: str | None = None  # a `recallspec bench` output directory (SmolLM2, Spec-Bench)
    methods: tuple[str, ...] = PREDICT_METHODS
    stream_mib: int = 1024
    overwrite: bool = False  # measure entries already in OUT/scale.json again
    decode_rounds: int = 3  # paired decode rounds (with llamacpp; 0: none)
    prefill_rounds: int = 3  # paired prefill rounds (with llamacpp; 0: none)
    pair_idle_s: float = 5.0  # idle before each side of a paired round
    ttft_repeats: int = 1  # time to first token from fresh processes (0: not measured)
    # The batched verification curve (``bench/scale/moe_batch.py``): sequences per forward
    # (None: the child's default, a mixture of experts' BATCH_SEQS and none for a dense
    # model; (): none) and draft rows per sequence.
    batch_seqs: tuple[int, ...] | None = None
    batch_ks: tuple[int, ...] = (1, 4)

    def __post_init__(self) -> None:
        if not self.entries:
            raise DataError("bench scale: no (shape, quantization) to measure")
        for shape, quant in self.entries:
            try:
                s = get_shape(shape)
            except UnknownNameError as e:
                raise DataError(str(e)) from None
            if quant not in QUANTS:
                raise DataError(f"unknown quantization {quant!r} (known: {', '.join(QUANTS)})")
            if quant == "MXFP4_MOE" and not s.experts:
                # (llama-quantize would write every matrix of a dense shape in Q8_0: a
                # Q8_0 file under another name)
                raise DataError(f"{shape}: MXFP4_MOE quantizes a mixture's experts; "
                                f"{shape} is a dense {s.arch} (name a mixture of experts, "
                                "e.g. gpt-oss-20b, or another quantization)")
        if self.repeats < 1 or self.new_tokens < 2 or self.prefill < 1 or self.cached < 1:
            raise DataError("need repeats >= 1, new_tokens >= 2, prefill >= 1, cached >= 1")
        if not self.ks or min(self.ks) < 1 or 1 not in self.ks:
            raise DataError(f"ks must be positive and include 1 (the ratios' base): {self.ks}")
        if self.decode_rounds < 0 or self.prefill_rounds < 0:
            raise DataError("decode_rounds and prefill_rounds must be >= 0, got "
                            f"{self.decode_rounds} and {self.prefill_rounds}")
        if self.pair_idle_s < 0:
            raise DataError(f"pair_idle_s must be >= 0, got {self.pair_idle_s}")
        if self.ttft_repeats < 0:
            raise DataError(f"ttft_repeats must be >= 0, got {self.ttft_repeats}")
        if (self.batch_seqs and min(self.batch_seqs) < 1) or not self.batch_ks or min(
                self.batch_ks) < 1:
            raise DataError("batch_seqs and batch_ks must be positive, got "
                            f"{self.batch_seqs} and {self.batch_ks}")
        if self.answers is not None and "ar" not in self.methods:
            raise DataError("the predicted speedups need 'ar' among the methods")


def seq_counts(s: str) -> tuple[int, ...]:
    """``--batch-seqs`` (``bench scale`` and its child): comma-separated positive
    integers, or 0 / none (no batched curve), as an argparse ``type``."""
    return () if s.strip().lower() in ("0", "none", "") else positive_ints(s)


def parse_entries(shapes: str | None, quants: str | None) -> tuple[tuple[str, str], ...]:
    """``--shapes a,b --quants Q4_K_M,Q8_0``: their product; neither: the default matrix;
    only ``--quants``: every shape at those; only ``--shapes``: those at Q4_K_M."""
    if not shapes and not quants:
        return DEFAULT_MATRIX
    ss = [s.strip() for s in (shapes or ",".join(SHAPES_Q4KM)).split(",") if s.strip()]
    qs = [q.strip() for q in (quants or "Q4_K_M").split(",") if q.strip()]
    return tuple((s, q) for s in ss for q in qs)
