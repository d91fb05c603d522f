"""GGML quant formats on the host: the type table and dequantization."""
