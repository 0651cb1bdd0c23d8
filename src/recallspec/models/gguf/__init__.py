"""GGUF files: the header (``header``), each architecture's keys and tensor names
(``arch``), the conversion to our config and float weights (``convert``), the quantized
weights kept in their own blocks (``quantized``) and the embedded tokenizer (``tokenizer``)."""
