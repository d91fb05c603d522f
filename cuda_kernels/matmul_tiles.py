"""Tiled GEMM kernels over quantized weights: out[r, n] = sum_k x[row(r), k] * W[n, k].

W is stored in a GGML format, one row per output feature, each group's (expert's) matrix at its
own byte offset of one uint8 buffer. A block computes a BM x BN output tile: per step of 32 k
values it dequantizes the BN weight rows' next 32 values into shared memory (the format's `dq32`
decoder) and stages the BM activation rows, then multiplies the two tiles.

Two bodies share the tile machinery:
* tensor cores (`tc_kernel`): tiles held as f16 pairs, fragments read with `ldmatrix`, warps
  issue `mma.sync.m16n8k16` with f32 accumulators; two shared-memory buffers (or a ring of
  three activation stages, `TcTile.a_stages`), one barrier per k step, every shared and global
  address made once a thread (the loop adds stage offsets and constants): step k+1's f16 activations (cp.async) and weight words (a format's split loader,
  `matmul_loads`) are requested before step k's MMAs and decoded after them, so memory latency
  and dequantization overlap the tensor-core work; a tile's settings by weight format
  (`tc_tile`: threads per weight row, MMAs of 16-row tiles past a group's end skipped);
* FMA (`matmul_fma.fma_kernel`): f32 tiles and a per-thread register micro-tile, the fallback
  path.

Row modes, fixed when a kernel is built:
* grouped: the block's row tile comes from the routing schedule (tile_group, tile_m0, n_tiles);
  rows of group g are positions group_off[g]:group_off[g+1]; else dense rows 0..n_rows.
* gather: the activation row of position p is token perm[p] // k_top (the MoE gate/up input),
  else row p itself.
* swiglu: the tile's columns pair gate rows (base0) with up rows (base1) of the same feature and
  the epilogue writes silu(gate) * up; else plain columns of one matrix (base0).
"""

from __future__ import annotations

import math

from numba import cuda, float32, int64, uint32, uint64

from .intrinsics import st_x4
from .mma import (SIMULATED, cp_async16_at, cp_async_commit, cp_async_wait,
                  cp_async_wait_group1, gaddr, ldsm_x4_at, mma_16816, pack_half2, smem_u32)
from .tile_shapes import (  # noqa: F401 (re-exported: the engine and benches import them here)
    FMA_TILE, FORMAT_TILE, K_STEP, SMALL_TC_TILE, SMALL_TILE_ROWS_PER_EXPERT, TC_TILE, FmaTile,
    TcTile, takes_small_tile, tc_tile)

SHARED_ALIGN = None if SIMULATED else 16  # ldmatrix / cp.async rows are 16-byte aligned


@cuda.jit(device=True, inline="always")
def silu_mul(gate, up):
    """silu(gate) * up = gate * sigmoid(gate) * up (exp overflow for very negative gate gives -0)."""
    return gate / (float32(1.0) + math.exp(-gate)) * up


def tc_kernel(dq32, *, tile: TcTile, x_half: bool, grouped: bool, gather: bool, swiglu: bool,
              out_half: bool, loader=None):
    """Build the tensor-core GEMM kernel for one weight decoder and one set of modes.

    Kernel arguments: (x, wbuf, base0, base1, row_bytes, n_out, k_dim, group_off, perm, k_top,
    tile_group, tile_m0, n_tiles, n_rows, out); x is u32 pairs of f16 ([n, k/2]) when `x_half`
    else f32 [n, k]; out is u32 pairs of f16 ([rows, n_out/2]) when `out_half` else f32.
    `loader`: the format's split (fetch, decode) loader (`matmul_loads`), used when the tile
    pipelines (`tile.pipe`, 32-value steps, one weight row per thread at most); else `dq32`.
    """
    BM, BN, WN = tile.bm, tile.bn, tile.warps_n
    NTHREADS = tile.threads
    WTM, WTN = tile.bm // tile.warps_m, tile.bn // tile.warps_n
    MT, NT = WTM // 16, WTN // 8
    HALF_NT, HALF_WTN = NT // 2, WTN // 2
    KCH = tile.kch
    WPR = 16 * KCH  # u32 words (f16 pairs) per row per step
    SA = WPR + 4  # shared row: 4 words of pad, so fragment reads hit 32 distinct banks
    B_ITEMS = BN * KCH  # (row, chunk) pairs per step
    # f16 activations are copied global -> shared by cp.async (16 bytes, issued before the MMAs,
    # awaited after): every thread takes A_CHUNKS of them and no register staging is needed.
    CPR = WPR // 4  # 16-byte chunks per A row per step
    PIPE_A = tile.pipe and x_half and (BM * CPR) % NTHREADS == 0
    # With enough threads, one thread per weight row decodes B while the others stage A, so no
    # thread idles through the other's work; small tiles give every thread both jobs.
    # (with f32 activations the A threads also convert: measured slower, so both jobs are shared)
    ROLE_SPLIT = (not PIPE_A and x_half and NTHREADS >= 2 * B_ITEMS
                  and (NTHREADS - B_ITEMS) % WPR == 0 and (BM * WPR) % (NTHREADS - B_ITEMS) == 0)
    # A split loader serves 32-value steps with every weight row owned by 1 or 2 threads
    SPLIT = loader is not None and tile.pipe and KCH == 1 and NTHREADS >= B_ITEMS
    PARTS = 2 if (SPLIT and PIPE_A and tile.row_threads == 2
                  and NTHREADS >= 2 * B_ITEMS) else 1  # threads per weight row
    fetch, decode, N_RAW = loader(PARTS) if SPLIT else (None, None, 1)
    SKIP = tile.skip_pad
    LDSM = tile.ldsm
    # A ring of three activation stages (copied two steps ahead): its rows are WPR words unpadded,
    # the 16-byte chunk c of row r stored at chunk c ^ ((r >> 1) & 3), so the 8 rows an ldmatrix
    # phase reads (one chunk each) still fall in 8 distinct 16-byte bank groups
    SWZ = PIPE_A and LDSM and KCH == 1 and tile.a_stages == 3
    SAA = WPR if SWZ else SA  # u32 words an A row takes in shared memory
    WORDS_A, WORDS_B = BM * SAA, BN * SA
    if PIPE_A:
        NBT = min(NTHREADS, B_ITEMS * PARTS)  # threads decoding B (the rest only copy A)
        NAT, A_ITERS, ROW_STEP = NTHREADS, BM * CPR // NTHREADS, NTHREADS // CPR
    else:
        NBT = B_ITEMS if ROLE_SPLIT else NTHREADS
        NAT = NTHREADS - NBT if ROLE_SPLIT else NTHREADS  # threads staging A
        A_ITERS, ROW_STEP = BM * WPR // NAT, NAT // WPR
    B_ITERS = 1 if SPLIT else (B_ITEMS + NBT - 1) // NBT
    N_ACC = MT * NT * 4
    COLS = BN // 2 if swiglu else BN  # output features per block
    # array sizes must be plain constants for numba's typing, not expressions
    SH_A, SH_B, N_AFR, N_BFR = (3 if SWZ else 2) * WORDS_A, 2 * WORDS_B, MT * 4, NT * 2
    # a thread's shared-memory byte addresses, made once (adr, u32): sA's and sB's starts, its
    # B fragment row, its A fragment row at each k sub-step, its A copies' destinations; and its
    # A copies' global sources at step 0 (ga, u64). The hot loop adds constants and the stage.
    ADR_SA, ADR_SB, ADR_B, ADR_AF = 0, 1, 2, 3
    ADR_AD = ADR_AF + 2 * KCH
    N_ADR = ADR_AD + A_ITERS
    BYTES_A, BYTES_B = 4 * WORDS_A, 4 * WORDS_B  # one stage / buffer

    @cuda.jit(device=True, inline="always")
    def addresses(x, arow, sA, sB, adr, ga, wm, wn, lane, at):
        """Fill the thread's address registers (see ADR_*)."""
        adr[ADR_SA] = smem_u32(sA)
        adr[ADR_SB] = smem_u32(sB)
        adr[ADR_B] = uint32(4 * ((wn * WTN + (lane >> 4) * 8 + (lane & 7)) * SA
                                 + ((lane >> 3) & 1) * 4))
        a_row = (wm * WTM + (lane & 15)) * SAA
        for kk in range(2 * KCH):
            ka = kk * 8 + (lane >> 4) * 4
            if SWZ:  # chunk 2kk + lane // 16 of row 16m + lane % 16: (row >> 1) & 3 is the lane's
                ka = 4 * ((2 * kk + (lane >> 4)) ^ (((lane & 15) >> 1) & 3))
            adr[ADR_AF + kk] = uint32(4 * (a_row + ka))
        if PIPE_A:
            c = at % CPR
            for i in range(A_ITERS):
                r = at // CPR + i * ROW_STEP
                adr[ADR_AD + i] = uint32(4 * (r * SAA + (4 * (c ^ ((r >> 1) & 3)) if SWZ
                                                         else 4 * c)))
                ga[i] = gaddr(x, max(arow[i], 0), 4 * c)

    @cuda.jit(device=True, inline="always")
    def load_a(x, arow, sA, buf, kt, at, adr, ga):
        if PIPE_A:
            for i in range(A_ITERS):
                cp_async16_at(sA, adr[ADR_SA] + uint32(buf * BYTES_A) + adr[ADR_AD + i], x,
                              ga[i] + uint64(kt * (4 * WPR)), arow[i] >= 0)
            return
        aw = at % WPR
        for i in range(A_ITERS):
            r = at // WPR + i * ROW_STEP
            src = arow[i]
            word = uint32(0)
            if src >= 0:
                if x_half:
                    word = uint32(x[src, kt * WPR + aw])
                else:
                    c = kt * 2 * WPR + 2 * aw
                    word = pack_half2(x[src, c], x[src, c + 1])
            sA[buf * WORDS_A + r * SA + aw] = word

    @cuda.jit(device=True, inline="always")
    def load_b(wbuf, boff, vals, raw, sB, buf, kt, bt):
        if SPLIT and PARTS == 2:
            if bt < 2 * B_ITEMS:
                dst = buf * WORDS_B + (bt // 2) * SA
                if boff[0] >= 0:
                    decode(raw, kt, bt % 2, sB, dst)
                else:
                    for w in range(8):
                        sB[dst + (bt % 2) * 8 + w] = uint32(0)
            return
        for i in range(B_ITERS):
            item = bt + i * NBT
            if item < B_ITEMS:
                r, c = item // KCH, item % KCH
                dst = buf * WORDS_B + r * SA + 16 * c
                if boff[i] >= 0:
                    if SPLIT:  # one thread a row
                        decode(raw, kt, 0, sB, dst)
                    else:
                        dq32(wbuf, boff[i], kt * KCH + c, vals, 0)
                        for w in range(4):  # 16-byte stores (conflict-free, as the loaders')
                            v = 8 * w
                            st_x4(sB, dst + 4 * w, pack_half2(vals[v], vals[v + 1]),
                                  pack_half2(vals[v + 2], vals[v + 3]),
                                  pack_half2(vals[v + 4], vals[v + 5]),
                                  pack_half2(vals[v + 6], vals[v + 7]))
                else:
                    for w in range(16):
                        sB[dst + w] = uint32(0)

    @cuda.jit(device=True, inline="always")
    def fetch_b(wbuf, boff, raw, kt, tid):
        """Start loading step kt's weight words into registers (the split loader's part)."""
        if SPLIT:
            if tid < B_ITEMS * PARTS and boff[0] >= 0:
                fetch(wbuf, boff[0], kt, raw, tid % PARTS)

    @cuda.jit(device=True, inline="always")
    def prefetch(x, arow, sA, wbuf, boff, raw, buf, kt, tid, adr, ga):
        """Start step kt's loads that complete in the background: its A tile (cp.async) and the
        split loader's weight words."""
        fetch_b(wbuf, boff, raw, kt, tid)
        if PIPE_A:
            load_a(x, arow, sA, buf, kt, tid, adr, ga)

    @cuda.jit(device=True, inline="always")
    def finish(x, arow, sA, wbuf, boff, vals, raw, sB, buf, kt, tid, adr, ga):
        """Complete buffer `buf` for step kt: decode B, stage A if not copied asynchronously."""
        if PIPE_A:
            if tid < NBT:
                load_b(wbuf, boff, vals, raw, sB, buf, kt, tid)
            cp_async_wait()
        elif ROLE_SPLIT:
            if tid < NBT:
                load_b(wbuf, boff, vals, raw, sB, buf, kt, tid)
            else:
                load_a(x, arow, sA, buf, kt, tid - NBT, adr, ga)
        else:
            load_a(x, arow, sA, buf, kt, tid, adr, ga)
            load_b(wbuf, boff, vals, raw, sB, buf, kt, tid)

    @cuda.jit(device=True, inline="always")
    def load_fragments(sA, sB, abuf, buf, kk, afr, bfr, wm, wn, lane, n_live, adr):
        if LDSM:
            a_at = adr[ADR_SA] + uint32(abuf * BYTES_A) + adr[ADR_AF + kk]
            b_at = adr[ADR_SB] + uint32(buf * BYTES_B) + adr[ADR_B] + uint32(32 * kk)
            for mt in range(MT):
                if mt >= n_live:
                    break
                a0, a1, a2, a3 = ldsm_x4_at(sA, a_at + uint32(mt * 64 * SAA))
                afr[mt * 4] = a0
                afr[mt * 4 + 1] = a1
                afr[mt * 4 + 2] = a2
                afr[mt * 4 + 3] = a3
            for np2 in range(NT // 2):
                b0, b1, b2, b3 = ldsm_x4_at(sB, b_at + uint32(np2 * 64 * SA))
                bfr[np2 * 4] = b0
                bfr[np2 * 4 + 1] = b1
                bfr[np2 * 4 + 2] = b2
                bfr[np2 * 4 + 3] = b3
            return
        g, t = lane >> 2, lane & 3
        for mt in range(MT):
            if mt >= n_live:
                break
            ra = abuf * WORDS_A + (wm * WTM + mt * 16 + g) * SA + kk * 8 + t
            afr[mt * 4 + 0] = sA[ra]
            afr[mt * 4 + 1] = sA[ra + 8 * SA]
            afr[mt * 4 + 2] = sA[ra + 4]
            afr[mt * 4 + 3] = sA[ra + 8 * SA + 4]
        for nt in range(NT):
            rb = buf * WORDS_B + (wn * WTN + nt * 8 + g) * SA + kk * 8 + t
            bfr[nt * 2] = sB[rb]
            bfr[nt * 2 + 1] = sB[rb + 4]

    @cuda.jit(device=True, inline="always")
    def mma_step(sA, sB, abuf, buf, acc, afr, bfr, wm, wn, lane, n_live, adr):
        """The warp's MMAs of one k step (A stage `abuf`, B buffer `buf`) over its first n_live
        16-row tiles (the others hold only rows past the group's end: their work is skipped)."""
        for kk in range(2 * KCH):
            load_fragments(sA, sB, abuf, buf, kk, afr, bfr, wm, wn, lane, n_live, adr)
            for mt in range(MT):
                if mt >= n_live:
                    break
                for nt in range(NT):
                    c = (mt * NT + nt) * 4
                    d = mma_16816(afr[mt * 4], afr[mt * 4 + 1], afr[mt * 4 + 2], afr[mt * 4 + 3],
                                  bfr[nt * 2], bfr[nt * 2 + 1],
                                  acc[c], acc[c + 1], acc[c + 2], acc[c + 3])
                    acc[c] = d[0]
                    acc[c + 1] = d[1]
                    acc[c + 2] = d[2]
                    acc[c + 3] = d[3]

    @cuda.jit(device=True, inline="always")
    def store_pair(out, pos, col, n_out, v0, v1):
        if out_half:
            if col < n_out:
                out[pos, col // 2] = pack_half2(v0, v1)
        else:
            if col < n_out:
                out[pos, col] = v0
            if col + 1 < n_out:
                out[pos, col + 1] = v1

    @cuda.jit(device=True, inline="always")
    def epilogue(out, acc, nb, m0, row0, count, n_out, wm, wn, lane):
        g, t = lane >> 2, lane & 3
        for mt in range(MT):
            for h in range(2):
                m = m0 + wm * WTM + mt * 16 + g + 8 * h
                if m < count:
                    pos = row0 + m
                    if swiglu:
                        for nt in range(HALF_NT):
                            cg = (mt * NT + nt) * 4 + 2 * h
                            cu = (mt * NT + nt + HALF_NT) * 4 + 2 * h
                            col = nb * COLS + wn * HALF_WTN + nt * 8 + 2 * t
                            store_pair(out, pos, col, n_out, silu_mul(acc[cg], acc[cu]),
                                       silu_mul(acc[cg + 1], acc[cu + 1]))
                    else:
                        for nt in range(NT):
                            c = (mt * NT + nt) * 4 + 2 * h
                            col = nb * COLS + wn * WTN + nt * 8 + 2 * t
                            store_pair(out, pos, col, n_out, acc[c], acc[c + 1])

    @cuda.jit(device=True, inline="always")
    def weight_row(r, nb):
        """(feature, which matrix) of tile row r: swiglu pairs gate and up within each warp."""
        if swiglu:
            within = r % WTN
            return nb * COLS + (r // WTN) * HALF_WTN + within % HALF_WTN, within >= HALF_WTN
        return nb * COLS + r, False

    @cuda.jit(**({} if SIMULATED else tile.jit_options))
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
        sA = cuda.shared.array(SH_A, uint32, alignment=SHARED_ALIGN)
        sB = cuda.shared.array(SH_B, uint32, alignment=SHARED_ALIGN)
        vals = cuda.local.array(K_STEP, float32)
        raw = cuda.local.array(N_RAW, uint32)
        acc = cuda.local.array(N_ACC, float32)
        afr = cuda.local.array(N_AFR, uint32)
        bfr = cuda.local.array(N_BFR, uint32)
        arow = cuda.local.array(A_ITERS, int64)
        boff = cuda.local.array(B_ITERS, int64)
        adr = cuda.local.array(N_ADR, uint32)
        ga = cuda.local.array(A_ITERS, uint64)
        for i in range(N_ACC):
            acc[i] = float32(0.0)
        at = tid - NBT if ROLE_SPLIT else tid
        per_row = CPR if PIPE_A else WPR
        for i in range(A_ITERS):
            m = m0 + at // per_row + i * ROW_STEP
            arow[i] = -1
            if m < count and at >= 0:
                arow[i] = perm[row0 + m] // k_top if gather else row0 + m
        for i in range(B_ITERS):
            f, second = weight_row(tid // PARTS if SPLIT else (tid + i * NBT) // KCH, nb)
            base = base1[grp] if second else base0[grp]
            boff[i] = base + f * row_bytes if f < n_out else -1
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // WN, warp % WN
        addresses(x, arow, sA, sB, adr, ga, wm, wn, lane, at)
        n_k = k_dim // (K_STEP * KCH)
        # warp-uniform; every tile live without skip_pad
        n_live = min(MT, max(0, (count - m0 - wm * WTM + 15) // 16)) if SKIP else MT
        if SWZ:
            # three A stages: step kt+2's copies are issued before step kt's MMAs and awaited
            # only at the end of step kt+1 (one cp.async group a step, the newest left in
            # flight); B as below, one step ahead
            prefetch(x, arow, sA, wbuf, boff, raw, 0, 0, tid, adr, ga)
            cp_async_commit()
            if n_k > 1:
                load_a(x, arow, sA, 1, 1, tid, adr, ga)
            cp_async_commit()
            if tid < NBT:
                load_b(wbuf, boff, vals, raw, sB, 0, 0, tid)
            cp_async_wait_group1()
            cuda.syncthreads()
            a_cur, a_next, a_free = 0, 1, 2
            for kt in range(n_k):
                # stage a_free was last read in step kt-1, finished before the last barrier
                buf = kt & 1
                if kt + 1 < n_k:
                    fetch_b(wbuf, boff, raw, kt + 1, tid)
                if kt + 2 < n_k:
                    load_a(x, arow, sA, a_free, kt + 2, tid, adr, ga)
                cp_async_commit()
                if n_live > 0:
                    mma_step(sA, sB, a_cur, buf, acc, afr, bfr, wm, wn, lane, n_live, adr)
                if kt + 1 < n_k and tid < NBT:
                    load_b(wbuf, boff, vals, raw, sB, buf ^ 1, kt + 1, tid)
                cp_async_wait_group1()  # step kt+1's copies have landed
                cuda.syncthreads()
                a_cur, a_next, a_free = a_next, a_free, a_cur
            epilogue(out, acc, nb, m0, row0, count, n_out, wm, wn, lane)
            return
        prefetch(x, arow, sA, wbuf, boff, raw, 0, 0, tid, adr, ga)
        finish(x, arow, sA, wbuf, boff, vals, raw, sB, 0, 0, tid, adr, ga)
        cuda.syncthreads()
        for kt in range(n_k):
            # start step kt+1's loads, issue step kt's MMAs, then finish kt+1 into the other
            # buffer (decode, await the copies): load latency and decoding overlap the
            # tensor-core work in flight. That buffer was last read in step kt-1, which every
            # warp finished before the last barrier.
            buf = kt & 1
            if kt + 1 < n_k:
                prefetch(x, arow, sA, wbuf, boff, raw, buf ^ 1, kt + 1, tid, adr, ga)
            if n_live > 0:
                mma_step(sA, sB, buf, buf, acc, afr, bfr, wm, wn, lane, n_live, adr)
            if kt + 1 < n_k:
                finish(x, arow, sA, wbuf, boff, vals, raw, sB, buf ^ 1, kt + 1, tid, adr, ga)
            cuda.syncthreads()
        epilogue(out, acc, nb, m0, row0, count, n_out, wm, wn, lane)

    return kernel


def n_col_blocks(n_out: int, block_cols: int, swiglu: bool) -> int:
    """Blocks along the output features: a swiglu tile of BN columns makes BN/2 features."""
    return math.ceil(n_out / (block_cols // 2 if swiglu else block_cols))


