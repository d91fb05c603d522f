"""Decode attention on a real GPU with the split length following the live length: at the 30B's
head shape (32 query heads, head_dim 128) with GQA groups 1/4/8/16, every KV format, lengths from
one key to the whole cache, against float64 references; and a CUDA graph captured at one
length and replayed at others (the length read from device memory at every replay). Every
output is poisoned (NaN) before its run; the cache holds valid keys past every length (a kernel
reading past it would change the result). Prints a table (run with -s).

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_decode_attention_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.kv_problem import attention_reference, filled_side

pytestmark = pytest.mark.gpu
TOL = 1e-4  # f32 accumulation (f16 K/V exact in the tensor cores, Q and P split hi + lo)
N_HEAD, HD = 32, 128
LENGTHS = (1, 15, 16, 17, 600, 1000, 4095, 4096)
ROWS: list[tuple[str, str, float]] = []


@pytest.fixture(scope="module", autouse=True)
def table():
    yield
    print(f"\n{'kernel':<34} {'case':<40} {'rel err':>10}")
    for name, case, err in ROWS:
        print(f"{name:<34} {case:<40} {err:>10.2e} {'ok' if err < TOL else 'FAIL'}")


class _Problem:
    """q, a cache of n_ctx positions all holding keys, the launch's device arguments."""

    def __init__(self, fmt: str, group: int, n_ctx: int, seed: int, min_split=None):
        from numba import cuda

        from strata.cuda_kernels import attention, kvcache
        rng = np.random.default_rng(seed)
        self.n_kv = N_HEAD // group
        lay = kvcache.KvLayout(fmt, n_ctx, self.n_kv, HD)
        self.k, self.kref = filled_side(lay, rng.standard_normal((n_ctx, self.n_kv, HD)), rng)
        self.v, self.vref = filled_side(lay, rng.standard_normal((n_ctx, self.n_kv, HD)), rng)
        self.q = rng.standard_normal((N_HEAD, HD)).astype(np.float32)
        self.qd = cuda.to_device(self.q)
        self.out = cuda.to_device(np.full(self.q.shape, np.nan, np.float32))
        self.seq = cuda.to_device(np.zeros(1, np.int32))
        self.parts = tuple(cuda.to_device(np.full(p.shape, np.nan, np.float32)) for p in
                           attention.allocate_partials(N_HEAD, HD, n_ctx, n_kv_head=self.n_kv))
        self.min_split = min_split

    def launch(self, stream, wide):
        from strata.cuda_kernels import attention
        attention.decode_attention(self.qd, self.k, self.v, self.seq, self.out, self.parts,
                                   stream=stream, wide=wide, min_split=self.min_split)

    def set_length(self, length: int, stream) -> None:
        self.seq.copy_to_device(np.array([length - 1], np.int32), stream=stream)
        self.out.copy_to_device(np.full(self.q.shape, np.nan, np.float32), stream=stream)

    def check(self, name: str, length: int, stream) -> None:
        stream.synchronize()
        got = self.out.copy_to_host().astype(np.float64)
        assert np.isfinite(got).all(), f"{name} L={length}: unwritten or non-finite outputs"
        ref = attention_reference(self.q[None], self.kref, self.vref, length - 1)[0]
        err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        ROWS.append((name, f"L={length} of {self.kref.shape[0]} h{N_HEAD}/{self.n_kv}", err))
        assert err < TOL, f"{name} L={length}: relative error {err:.3e}"


# min_split None: the kernel's own floor (64 keys tensor-core, 16 generic)
CASES = [("f16", None, 1, None), ("f16", None, 4, None), ("f16", None, 8, None),
         ("f16", False, 8, None), ("int8", None, 8, None), ("q4_0", None, 4, None),
         ("f16", None, 8, 16), ("int8", None, 8, 64),
         # a group of 16 (Qwen3-235B's): two tensor-core blocks a KV head
         ("f16", True, 16, None), ("int8", True, 16, None)]


@pytest.mark.parametrize("fmt,wide,group,min_split", CASES)
def test_decode_attention_every_length(fmt, wide, group, min_split):
    """One launch's arguments for all lengths of a 4K cache (as a captured decode step holds
    them), only the device length changing: from one split of one key to 64 of 64 (at the
    kernel's own floor of keys a split, and each kernel at the other's)."""
    from numba import cuda
    p = _Problem(fmt, group, 4096, seed=group, min_split=min_split)
    stream = cuda.stream()
    name = f"decode attn {fmt}" + (" generic" if wide is False else "") + f" g{group}" + \
        f" m{min_split or 'auto'}"
    for length in LENGTHS:
        p.set_length(length, stream)
        p.launch(stream, wide)
        p.check(name, length, stream)


@pytest.mark.parametrize("fmt,wide,n_ctx", [("f16", None, 32768), ("int8", None, 4096)])
def test_decode_attention_graph_replays_at_every_length(fmt, wide, n_ctx):
    """A graph captured at a short length replays right at longer and shorter ones: the split
    length and count come from the device length, not from the capture."""
    from numba import cuda

    from strata.cuda_kernels.graph import capture
    p = _Problem(fmt, 8, n_ctx, seed=7)
    stream = cuda.stream()
    p.set_length(600, stream)
    p.launch(stream, wide)  # compiled and loaded outside the capture
    stream.synchronize()
    graph = capture(lambda s: p.launch(s, wide), stream)
    lengths = (600, 1, 17, n_ctx, 5000 if n_ctx > 5000 else 3000, 16384 if n_ctx > 16384 else 2)
    for length in lengths:
        p.set_length(length, stream)
        graph.replay(stream)
        p.check(f"graph replay {fmt}", length, stream)
