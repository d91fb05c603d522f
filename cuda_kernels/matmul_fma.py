"""The FMA fallback of the tiled GEMM (`matmul_tiles`): f32 tiles in shared memory and a per-thread
register micro-tile, the same arguments, row modes and dq32 decoders as the tensor-core kernel.
The cross-check of the tensor-core path (`tensor_cores=False`)."""

from __future__ import annotations

from numba import cuda, float32, int64

from .matmul_tiles import K_STEP, FmaTile, silu_mul


def fma_kernel(dq32, *, tile: FmaTile, grouped: bool, gather: bool, swiglu: bool):
    """Build the f32 FMA GEMM kernel (same arguments as `tc_kernel`; x f32 or f16, out f32)."""
    BM, BN, TX, TY = tile.bm, tile.bn, tile.threads_n, tile.threads_m
    NTHREADS = tile.threads
    TM, TN = BM // TY, BN // TX
    HALF_TN = TN // 2
    SK = K_STEP + 1  # padded shared row: column reads by consecutive threads hit distinct banks
    A_ITERS, ROW_STEP = BM * K_STEP // NTHREADS, NTHREADS // K_STEP
    B_ITERS = (BN + NTHREADS - 1) // NTHREADS
    COLS = BN // 2 if swiglu else BN
    SH_A, SH_B, N_ACC = BM * SK, BN * SK, TM * TN

    @cuda.jit
    def kernel(x, wbuf, base0, base1, row_bytes, n_out, k_dim, group_off, perm, k_top,
               tile_group, tile_m0, n_tiles, n_rows, out):
        tid = cuda.threadIdx.x
        nb = cuda.blockIdx.x
        slot = cuda.blockIdx.y
        if grouped:
            if slot >= n_tiles[0]:
                return
            grp = tile_group[slot]
            m0 = tile_m0[slot]
            row0 = group_off[grp]
            count = group_off[grp + 1] - row0
        else:
            grp = 0
            m0 = slot * BM
            row0 = 0
            count = n_rows
        sA = cuda.shared.array(SH_A, float32)
        sB = cuda.shared.array(SH_B, float32)
        acc = cuda.local.array(N_ACC, float32)
        a = cuda.local.array(TM, float32)
        b = cuda.local.array(TN, float32)
        arow = cuda.local.array(A_ITERS, int64)
        boff = cuda.local.array(B_ITERS, int64)
        for i in range(N_ACC):
            acc[i] = float32(0.0)
        for i in range(A_ITERS):
            m = m0 + tid // K_STEP + i * ROW_STEP
            arow[i] = -1
            if m < count:
                arow[i] = perm[row0 + m] // k_top if gather else row0 + m
        for i in range(B_ITERS):
            r = tid + i * NTHREADS
            if swiglu:
                second = r >= COLS
                f = nb * COLS + (r - COLS if second else r)
            else:
                second = False
                f = nb * COLS + r
            base = base1[grp] if second else base0[grp]
            boff[i] = base + f * row_bytes if f < n_out else -1
        tx, ty = tid % TX, tid // TX
        ac = tid % K_STEP
        for kt in range(k_dim // K_STEP):
            for i in range(A_ITERS):
                r = tid // K_STEP + i * ROW_STEP
                v = float32(0.0)
                if arow[i] >= 0:
                    v = float32(x[arow[i], kt * K_STEP + ac])
                sA[r * SK + ac] = v
            for i in range(B_ITERS):
                r = tid + i * NTHREADS
                if r < BN:
                    if boff[i] >= 0:
                        dq32(wbuf, boff[i], kt, sB, r * SK)
                    else:
                        for w in range(K_STEP):
                            sB[r * SK + w] = float32(0.0)
            cuda.syncthreads()
            for kk in range(K_STEP):
                for i in range(TM):
                    a[i] = sA[(ty + i * TY) * SK + kk]
                for j in range(TN):
                    b[j] = sB[(tx + j * TX) * SK + kk]
                for i in range(TM):
                    for j in range(TN):
                        acc[i * TN + j] += a[i] * b[j]
            cuda.syncthreads()
        for i in range(TM):
            m = m0 + ty + i * TY
            if m < count:
                pos = row0 + m
                if swiglu:
                    for j in range(HALF_TN):
                        col = nb * COLS + tx + j * TX
                        if col < n_out:
                            out[pos, col] = silu_mul(acc[i * TN + j], acc[i * TN + j + HALF_TN])
                else:
                    for j in range(TN):
                        col = nb * COLS + tx + j * TX
                        if col < n_out:
                            out[pos, col] = acc[i * TN + j]

    return kernel


__all__ = ["fma_kernel"]
