"""Ahead-of-time compiled CUDA kernels and the frozen app's runtime set-up (bundle, loader,
numba cache locator, self-check)."""
