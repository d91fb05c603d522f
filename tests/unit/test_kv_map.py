"""`strata.memory.kv_map` without a GPU: its argument checks, and under the CUDA simulator (no
driver to map with) one device array per range that the KV kernels read and write. The mapping
itself, VRAM rows then host rows in one address range, is checked on a GPU
(`tests/gpu/test_kv_stream_gpu.py`, `bench/probes/kv_vmm.py`)."""

from __future__ import annotations

import numpy as np
import pytest

from strata.cuda_kernels.intrinsics import SIMULATED
from strata.memory.kv_map import KvMap


@pytest.mark.parametrize("n, side, resident", [(0, 4096, 0), (2, 4096, 4096), (2, 4096, -1)])
def test_bad_ranges_are_refused(n, side, resident):
    with pytest.raises(ValueError, match="streamed KV"):
        KvMap(n, side, resident)


@pytest.mark.skipif(not SIMULATED, reason="the simulator's stand-in (NUMBA_ENABLE_CUDASIM=1)")
def test_simulated_ranges_hold_what_the_kv_write_puts_there():
    from numba import cuda

    from strata.cuda_kernels import kvcache
    lay = kvcache.KvLayout("f16", 24, 2, 64)
    side = lay.n_ctx * lay.n_kv_head * lay.row_bytes
    m = KvMap(4, side, 8 * lay.n_kv_head * lay.row_bytes)
    assert len(m.views) == 4 and all(v.shape == (side,) for v in m.views)
    src = np.random.default_rng(1).standard_normal((20, 2, 64)).astype(np.float32)
    k = kvcache.KvSide(lay, m.views[1], cuda.device_array(1, np.float16))
    kvcache.kv_write(cuda.to_device(src), k, cuda.to_device(np.zeros(1, np.int32)))
    got = m.views[1].copy_to_host()[:20 * 2 * 128].view(np.float16).reshape(20, 2, 64)
    assert np.array_equal(got, src.astype(np.float16))
    m.close()
    assert m.views == []
