"""The Python side of the C++ kernels (``csrc/``): instruction-set and thread choice, the
fp32 and quantized products, GGUF block formats and their repacking.

Every product here runs a fixed float sequence per output, so a row's bits never depend
on the batch, the thread count or the instruction set (the batch-invariance invariant).
"""
