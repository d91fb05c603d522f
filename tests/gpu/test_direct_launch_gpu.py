"""Direct launches (cuda_kernels/direct_launch.py) on a real GPU: a kernel with every kind of
argument the engine passes, launched through numba and then directly, writes the same bytes; a
new kind of argument goes through numba once and then directly; a launch the driver refuses
raises numba's CudaAPIError naming the kernel; threads launching one kernel at once do not mix
their parameters; a CUDA-graph capture records direct launches.

    STRATA_TEST_GPU=1 python -m pytest -s tests/gpu/test_direct_launch_gpu.py
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _kernel():
    from numba import cuda

    @cuda.jit
    def mix(x2, w8, out, n, scale16, flag, k64, f64, bias):
        # out[i] = x2[i // 8, i % 8] * scale16 + w8[i] + (k64 % 7) + f64 (+ bias if flag)
        i = cuda.grid(1)
        if i < n:
            v = x2[i // x2.shape[1], i % x2.shape[1]] * np.float32(scale16) + w8[i]
            v += np.float32(k64 % 7) + np.float32(f64)
            if flag:
                v += bias
            out[i] = v
    return mix


def _reference(x2, w8, scale16, flag, k64, f64, bias):
    # the kernel's order of operations; x2 holds integers and scale16 few bits, so a fused
    # multiply-add rounds as the separate ones do
    v = x2.reshape(-1) * np.float32(np.float16(scale16)) + w8.astype(np.float32)
    v = v + (np.float32(k64 % 7) + np.float32(f64))
    return v + np.float32(bias) if flag else v


def _launch_all(kern, out, args, stream=0, n=None):
    n = n or out.shape[0]
    kern[(n + 127) // 128, 128, stream](args[0], args[1], out, n, *args[2:])


def test_direct_launches_write_what_numba_writes():
    from numba import cuda

    from strata.cuda_kernels import direct_launch as dl
    from strata.cuda_kernels import launch  # noqa: F401 - applies the patch
    assert dl.ENABLED, "STRATA_DIRECT_LAUNCH is off in this environment"
    kern = _kernel()
    rng = np.random.default_rng(5)
    n = 8 * 1000
    x2 = rng.integers(-1000, 1000, (1000, 8)).astype(np.float32)  # [1000, 8] f32
    w8 = rng.integers(0, 256, n).astype(np.uint8)           # [n] u8
    d_x, d_w = cuda.to_device(x2), cuda.to_device(w8)
    out = cuda.device_array(n, np.float32)
    stream = cuda.stream()
    before = dict(dl.COUNTS)
    for i, (s16, flag, k64, f64, bias) in enumerate([
            (np.float16(0.75), True, 1 << 40, 0.125, np.float32(-2.0)),
            (np.float16(-1.5), False, -123456789012, -3.5, np.float32(9.0)),
            (np.float16(3.0), np.bool_(True), 5, 1e-3, np.float32(0.5))]):
        for st in (0, stream):
            out.copy_to_device(np.full(n, np.nan, np.float32))
            _launch_all(kern, out, (d_x, d_w, s16, flag, k64, f64, bias), st)
            cuda.synchronize()
            want = _reference(x2, w8, s16, flag, k64, f64, bias)
            np.testing.assert_array_equal(out.copy_to_host(), want, err_msg=f"case {i}, {st}")
    # np.bool_ and bool share a numba type but not a key: each kind's first launch is numba's
    assert dl.COUNTS["numba"] - before["numba"] == 2
    assert dl.COUNTS["direct"] - before["direct"] == 4
    # a slice (new device-array object, same kind) goes directly and reads its own pointer
    half = n // 2
    out.copy_to_device(np.full(n, np.nan, np.float32))
    kern[(half + 127) // 128, 128](d_x[half // 8:], d_w[half:], out[half:], half,
                                    np.float16(1.0), False, 0, 0.0, np.float32(0))
    cuda.synchronize()
    got = out.copy_to_host()
    assert np.isnan(got[:half]).all()
    np.testing.assert_array_equal(got[half:], _reference(x2[half // 8:], w8[half:], 1.0, False,
                                                         0, 0.0, 0))


def test_a_refused_launch_raises_and_names_the_kernel():
    from numba import cuda
    from numba.cuda.cudadrv.driver import CudaAPIError

    from strata.cuda_kernels import launch  # noqa: F401
    kern = _kernel()
    d = cuda.to_device(np.ones((4, 8), np.float32))
    w = cuda.to_device(np.ones(32, np.uint8))
    out = cuda.device_array(32, np.float32)
    args = (d, w, out, 32, np.float16(1), True, 3, 0.5, np.float32(1))
    kern[1, 32](*args)  # numba's launch, recording the layout
    with pytest.raises(CudaAPIError, match="mix"):
        kern[1, 4096](*args)  # more threads than a block may have
    kern[1, 32](*args)  # and the kernel still launches
    cuda.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), np.full(32, 1 + 1 + 3 + 0.5 + 1,
                                                              np.float32))


def test_threads_do_not_mix_parameters():
    from numba import cuda

    from strata.cuda_kernels import launch  # noqa: F401
    kern = _kernel()
    n = 4096
    rng = np.random.default_rng(9)
    x2 = rng.integers(-1000, 1000, (n // 8, 8)).astype(np.float32)
    w8 = rng.integers(0, 256, n).astype(np.uint8)
    d_x, d_w = cuda.to_device(x2), cuda.to_device(w8)
    outs = [cuda.device_array(n, np.float32) for _ in range(4)]
    _launch_all(kern, outs[0], (d_x, d_w, np.float16(1), True, 0, 0.0, np.float32(0)))
    errors = []

    def worker(t):
        try:  # a new thread has no current context: its first launch is numba's, which sets it
            s = cuda.stream()
            for r in range(200):
                _launch_all(kern, outs[t], (d_x, d_w, np.float16(1), True, t, float(r),
                                            np.float32(t)), s)
            s.synchronize()
        except Exception as e:  # reported below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    for t in range(4):
        want = _reference(x2, w8, 1.0, True, t, 199.0, t)
        np.testing.assert_array_equal(outs[t].copy_to_host(), want, err_msg=f"thread {t}")


def test_a_graph_captures_direct_launches():
    from numba import cuda

    from strata.cuda_kernels import direct_launch as dl
    from strata.cuda_kernels.graph import capture
    kern = _kernel()
    n = 1024
    x2 = np.arange(n, dtype=np.float32).reshape(n // 8, 8)
    w8 = (np.arange(n) % 251).astype(np.uint8)
    d_x, d_w = cuda.to_device(x2), cuda.to_device(w8)
    out = cuda.device_array(n, np.float32)
    s = cuda.stream()
    args = (d_x, d_w, np.float16(2), False, 9, 0.0, np.float32(0))
    _launch_all(kern, out, args, s)  # numba's launch first
    s.synchronize()
    direct = dl.COUNTS["direct"]
    g = capture(lambda st: _launch_all(kern, out, args, st), s)
    assert dl.COUNTS["direct"] == direct + 1
    out.copy_to_device(np.full(n, np.nan, np.float32))
    g.replay(s)
    s.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), _reference(x2, w8, 2.0, False, 9, 0.0, 0))
