"""The simulator's bodies of `mma`'s warp-level primitives (NUMBA_ENABLE_CUDASIM=1): each with the
per-lane semantics of its PTX instruction, the lanes of one simulated warp exchanging their
fragments at a barrier (`_WarpExchange`; the test suite's greenlet simulator swaps in its own,
`tests/helpers/simulator_green.py`). `mma` binds its names to these under the simulator.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import numpy as np

# ----------------------------------------------------------------------------------------------
# Simulator: lanes of one simulated warp meet at a barrier to exchange values.


class _WarpExchange:
    """All-gather among the 32 lanes of one simulated warp. Each lane writes its slot and takes a
    ticket; the lane holding the exchange's last ticket computes the shared result and wakes the
    other 31, each blocked on a lock of its own. A wake-up is one lock release per waiting lane
    (a `threading.Barrier` re-takes one shared condition lock per lane on the way out: about
    twice the CPU per exchange, which is what the simulator's tensor-core tiles spend their time
    on). `next()` on an `itertools.count` is atomic under the GIL, so tickets need no lock.

    Safe to reuse at once: a woken lane may write its next slot, since this exchange's result
    already exists; the next result is computed only when every lane has arrived again, that is
    after each has read this one."""

    def __init__(self):
        self.slots = [None] * 32
        self.result = None
        self.tickets = itertools.count()
        self.wake = [threading.Lock() for _ in range(32)]
        for lock in self.wake:
            lock.acquire()

    def run(self, lane, value, combine):
        """Every lane passes its `value`; the last to arrive computes `combine(slots)` (the same
        function from every lane of one exchange); all get the result."""
        self.slots[lane] = value
        if next(self.tickets) % 32 == 31:
            result = self.result = combine(self.slots)
            for other, lock in enumerate(self.wake):
                if other != lane:
                    lock.release()
            return result
        if not self.wake[lane].acquire(timeout=_TIMEOUT_S):
            raise RuntimeError(f"simulated warp exchange: lane {lane} waited {_TIMEOUT_S} s for "
                               "the other lanes (do all 32 lanes of the warp take part?)")
        return self.result


_TIMEOUT_S = 120
_exchanges: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_exchanges_lock = threading.Lock()


def _warp_exchange():
    """(exchange of the calling simulated thread's warp, its lane). Blocks must be whole warps.
    The pair is kept on the thread (one simulated thread per CUDA thread and launch)."""
    me = threading.current_thread()
    pair = getattr(me, "_strata_warp", None)
    if pair is None:
        manager = me._manager  # the simulator's BlockManager: one per block launch
        warp = me.thread_id // 32
        with _exchanges_lock:
            per_block = _exchanges.setdefault(manager, {})
            ex = per_block.get(warp)
            if ex is None:
                ex = per_block[warp] = _WarpExchange()
        pair = me._strata_warp = (ex, me.thread_id % 32)
    return pair


_LANE = np.arange(32)
_G, _T = _LANE >> 2, _LANE & 3
# Rows/columns of the 8 halves each lane holds of A, the 4 of B, the 4 accumulators of C.
_A_ROW = np.stack([_G, _G, _G + 8, _G + 8, _G, _G, _G + 8, _G + 8], axis=1)
_A_COL = np.stack([2 * _T, 2 * _T + 1] * 2 + [2 * _T + 8, 2 * _T + 9] * 2, axis=1)
_B_ROW = np.stack([2 * _T, 2 * _T + 1, 2 * _T + 8, 2 * _T + 9], axis=1)
_B_COL = np.stack([_G] * 4, axis=1)
_C_ROW = np.stack([_G, _G, _G + 8, _G + 8], axis=1)
_C_COL = np.stack([2 * _T, 2 * _T + 1, 2 * _T, 2 * _T + 1], axis=1)


def _mma_combine(slots):
    regs = np.array([s[:6] for s in slots], dtype=np.uint32)  # [32 lanes, a0..a3 b0 b1]
    halves_a = regs[:, :4].view(np.float16).astype(np.float64)  # [32, 8]
    halves_b = regs[:, 4:6].view(np.float16).astype(np.float64)  # [32, 4]
    acc = np.array([s[6:] for s in slots], dtype=np.float32).astype(np.float64)  # [32, 4]
    a = np.zeros((16, 16))
    b = np.zeros((16, 8))
    c = np.zeros((16, 8))
    a[_A_ROW, _A_COL] = halves_a
    b[_B_ROW, _B_COL] = halves_b
    c[_C_ROW, _C_COL] = acc
    d = (a @ b + c).astype(np.float32)
    return list(map(tuple, d[_C_ROW, _C_COL]))  # each lane's 4 float32, split once a warp


def _mma_16816_sim(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    ex, lane = _warp_exchange()
    return ex.run(lane, (a0, a1, a2, a3, b0, b1, c0, c1, c2, c3), _mma_combine)[lane]


def _shfl_xor_sim(value, lane_mask):
    ex, lane = _warp_exchange()
    values = ex.run(lane, value, list)
    return values[lane ^ lane_mask]


def _ldsm_combine(slots):
    out = np.zeros((32, 4), dtype=np.uint32)
    for lane in range(32):
        for m in range(4):
            arr, i = slots[8 * m + (lane >> 2)]
            out[lane, m] = arr[i + (lane & 3)]
    return out


def _ldsm_sim(combine):
    """The simulator's ldmatrix x4 whose fragments `combine` deals out."""
    def lanes(slots):  # each lane's 4 words as np.uint32, split once a warp
        return list(map(tuple, combine(slots)))

    def ldsm(arr, i):
        ex, lane = _warp_exchange()
        return ex.run(lane, (arr, int(i)), lanes)[lane]
    return ldsm


# ldmatrix .trans (e.g. V fragments): lane l names a row as for `ldsm_x4`; it receives, of each
# matrix m, the halves (row 2t, column g) and (row 2t + 1, column g), g = l >> 2, t = l & 3.


def _ldsm_trans_combine(slots):
    out = np.zeros((32, 4), dtype=np.uint32)
    lanes = np.arange(32)
    g, t = lanes >> 2, lanes & 3
    for m in range(4):
        rows = np.array([[arr[i + w] for w in range(4)] for arr, i in slots[8 * m:8 * m + 8]],
                        dtype=np.uint32).view(np.uint16)  # [8 rows, 8 columns] f16 bits
        out[:, m] = rows[2 * t, g].astype(np.uint32) | (rows[2 * t + 1, g].astype(np.uint32) << 16)
    return out


def _cp_async16_sim(dst, i, src, row, col, valid):
    for w in range(4):
        dst[i + w] = src[row, col + w] if valid else np.uint32(0)


def _cp_async_wait_sim():
    return None


def _smem_u32_sim(arr):
    """The simulator's shared 'address' of an array is 0: the addressed intrinsics take the
    array beside the address and read a byte offset from its first element."""
    return 0


def _gaddr_sim(arr, row, col):
    return int(row) * arr.strides[0] + int(col) * arr.strides[1]


def _gaddr1_sim(arr, i):
    return int(i) * arr.strides[0]


def _ldsm_x4_at_sim(arr, addr):
    return ldsm_x4(arr, int(addr) // 4)


def _ldsm_x4_trans_at_sim(arr, addr):
    return ldsm_x4_trans(arr, int(addr) // 4)


def _cp_async16_at_sim(dst, daddr, src, gaddr, valid):
    i, g = int(daddr) // 4, int(gaddr)
    if src.ndim == 1:  # a byte array (gaddr1): four little-endian words from byte g
        b = [int(src[g + k]) if valid else 0 for k in range(16)] if src.itemsize == 1 else None
        if b is None:
            raise TypeError("the simulator's cp_async16_at reads 1-d arrays of bytes only")
        for w in range(4):
            dst[i + w] = np.uint32(b[4 * w] | b[4 * w + 1] << 8 | b[4 * w + 2] << 16
                                   | b[4 * w + 3] << 24)
        return
    row, col = g // src.strides[0], (g % src.strides[0]) // src.strides[1]
    for w in range(4):
        dst[i + w] = src[row, col + w] if valid else np.uint32(0)


def _syncwarp_sim():
    """A barrier of the simulated warp's 32 lanes (the simulator has no `syncwarp`)."""
    ex, lane = _warp_exchange()
    ex.run(lane, 0, list)


def _cp_async_commit_sim():  # the simulator's copies complete at once: groups are no-ops
    return None


def _cp_async_wait_group1_sim():
    return None


def _halves(word):
    return np.array([word], dtype=np.uint32).view(np.float16).astype(np.float64)  # [2]


def _h2_sub_fma_sim(w, sub, scale, add):
    """(w - sub) * scale + add on f16 pairs; the subtraction exact (as the kernels use it)."""
    v = (_halves(w) - _halves(sub)) * _halves(scale) + _halves(add)
    return np.uint32(v.astype(np.float16).view(np.uint32)[0])


def _h2_sub_sim(a, b):
    """a - b on f16 pairs (rounded to f16)."""
    v = _halves(a) - _halves(b)
    return np.uint32(v.astype(np.float16).view(np.uint32)[0])


def _shfl_idx_sim(value, src):
    ex, lane = _warp_exchange()
    values = ex.run(lane, value, list)
    return values[int(src) & 31]


def _warp_all_sim(pred):
    ex, lane = _warp_exchange()
    return all(ex.run(lane, bool(pred), list))


def _pack_half2_sim(lo, hi):
    pair = np.array([lo, hi], dtype=np.float32).astype(np.float16)
    return np.uint32(pair.view(np.uint32)[0])


def _half2_lo_sim(word):
    return np.float32(np.array([word], dtype=np.uint32).view(np.float16)[0])


def _half2_hi_sim(word):
    return np.float32(np.array([word], dtype=np.uint32).view(np.float16)[1])


mma_16816 = _mma_16816_sim
shfl_xor = _shfl_xor_sim
pack_half2 = _pack_half2_sim
half2_lo = _half2_lo_sim
half2_hi = _half2_hi_sim
ldsm_x4 = _ldsm_sim(_ldsm_combine)
ldsm_x4_trans = _ldsm_sim(_ldsm_trans_combine)
cp_async16 = _cp_async16_sim
cp_async_wait = _cp_async_wait_sim
cp_async_commit = _cp_async_commit_sim
smem_u32 = _smem_u32_sim
gaddr = _gaddr_sim
gaddr1 = _gaddr1_sim
ldsm_x4_at = _ldsm_x4_at_sim
ldsm_x4_trans_at = _ldsm_x4_trans_at_sim
cp_async16_at = _cp_async16_at_sim
cp_async_wait_group1 = _cp_async_wait_group1_sim
h2_sub_fma = _h2_sub_fma_sim
h2_sub = _h2_sub_sim
shfl_idx = _shfl_idx_sim
warp_all = _warp_all_sim
syncwarp = _syncwarp_sim
