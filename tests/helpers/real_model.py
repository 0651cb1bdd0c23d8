"""How the tests run the real default model: the weight format its engines load."""

from __future__ import annotations

import os

# The weight format the real-model engine tests run on: "auto" (the default: the GGUF's
# own blocks through the quantized kernel) or "float32" (the reference path); CI runs the
# lossless tests on both (`make test-portable`).
TEST_DTYPE = os.environ.get("RECALLSPEC_TEST_DTYPE", "auto")
