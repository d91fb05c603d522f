"""Strata: Mixture-of-Experts GGUF inference on GPUs smaller than the model."""

__version__ = "0.1.0"
