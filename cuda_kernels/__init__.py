"""numba CUDA kernels, one module per operation family (installed as `strata.cuda_kernels`).

Importing this package imports no kernel module: each family (qformats, dequant, matvec, moe,
norm_rope, router, elementwise, sampling, ...) is imported where it is used, so CPU-only commands
never pay for numba's CUDA target.
"""
