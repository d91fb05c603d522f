"""A tiled GEMM's shape and settings (`matmul_tiles`' kernels are built for one): the
tensor-core tile (`TcTile`), the FMA fallback's (`FmaTile`), the defaults measured on the H200
and the per-format settings (`tc_tile`), and the small tile of short prompts."""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from gguf import GGMLQuantizationType

from .launch import MAX_SHARED_BYTES

K_STEP = 32  # values per dequantized chunk (the dq32 contract) = the k depth of a tile step


@dataclass(frozen=True, slots=True)
class TcTile:
    """Tensor-core tile: BM x BN per block, warps_m x warps_n warps of (bm/warps_m) x (bn/warps_n),
    a k step of 32 * kch values (kch dequantized chunks per weight row per step).

    ldsm: MMA fragments read with ldmatrix (else one 32-bit shared load per register);
    pipe: f16 activations copied by cp.async and split-loader weights fetched one step ahead;
    min_blocks: launch bounds (threads, min_blocks) when > 0 (`jit_options`);
    row_threads: threads a split loader may give one weight row (1 or 2; 2 only where the block
    has the threads); skip_pad: a warp skips the MMAs of its 16-row tiles past the group's end;
    a_stages: shared-memory stages of the activation tile (2, or 3: a ring whose rows are
    unpadded with XOR-swizzled 16-byte chunks, so three fit a block's 48 KiB beside B's two
    buffers; used where f16 activations are copied by cp.async and read by ldmatrix at 32-value
    steps, else 2).
    """

    bm: int
    bn: int
    warps_m: int
    warps_n: int
    kch: int = 1
    ldsm: bool = True
    pipe: bool = True
    min_blocks: int = 0  # > 0: launch bounds asking ptxas to fit that many blocks per SM
    row_threads: int = 2
    skip_pad: bool = True
    a_stages: int = 2

    def __post_init__(self):
        wtm, wtn = self.bm // max(self.warps_m, 1), self.bn // max(self.warps_n, 1)
        if min(self.bm, self.bn, self.warps_m, self.warps_n) < 1 or wtm % 16 or wtn % 16 \
                or wtm * self.warps_m != self.bm or wtn * self.warps_n != self.bn:
            raise ValueError(f"bad tensor-core tile {self}: warp tiles must be 16-row multiples "
                             "by 16-column multiples and divide the block tile")
        if self.row_threads not in (1, 2):
            raise ValueError(f"bad tensor-core tile {self}: row_threads must be 1 or 2")
        if (self.bm * 16) % self.threads or self.threads % 16 or self.kch not in (1, 2):
            raise ValueError(f"bad tensor-core tile {self}: bm * 16 must be a multiple of threads"
                             " and kch 1 or 2")
        if self.a_stages not in (2, 3) or (self.a_stages == 3 and self.kch != 1):
            raise ValueError(f"bad tensor-core tile {self}: a_stages must be 2, or 3 at kch 1")
        row = 16 * self.kch + 4  # u32 words a padded tile row holds
        a_row = row - 4 if self.a_stages == 3 else row
        shared = 4 * (self.a_stages * self.bm * a_row + 2 * self.bn * row)
        if shared > MAX_SHARED_BYTES:
            raise ValueError(f"bad tensor-core tile {self}: its buffers need {shared} bytes "
                             f"of shared memory ({MAX_SHARED_BYTES // 1024} KiB at most)")

    @property
    def k_step(self) -> int:
        return K_STEP * self.kch

    @property
    def jit_options(self) -> dict:
        """Extra `cuda.jit` / `compile_ptx` options of this tile's kernels (ahead-of-time builds
        must pass them too)."""
        return {"launch_bounds": (self.threads, self.min_blocks)} if self.min_blocks > 0 else {}

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n


@dataclass(frozen=True, slots=True)
class FmaTile:
    """FMA tile: BM x BN per block, threads_m x threads_n threads of (bm/tm) x (bn/tn) outputs."""

    bm: int
    bn: int
    threads_m: int
    threads_n: int

    def __post_init__(self):
        if min(self.bm, self.bn, self.threads_m, self.threads_n) < 1 \
                or self.bm % self.threads_m or self.bn % self.threads_n \
                or (self.bn // self.threads_n) % 2 or self.threads % 32 \
                or (self.bm * K_STEP) % self.threads:
            raise ValueError(f"bad FMA tile {self}: thread counts must divide the tile, "
                             "columns per thread be even and threads whole warps")

    @property
    def threads(self) -> int:
        return self.threads_m * self.threads_n


# Two blocks an SM (launch bounds (256, 2): 128 registers a thread). Unbounded, ptxas 13 gives
# the kernels 148-168 registers (Q4_K's gate/up 128), which leaves one block an SM; bounded,
# most spill nothing (ptxas 13: 8-16 bytes in Q6_K, Q4_1, 16-120 in the f32-input dense ones,
# which the engine does not launch) and every format
# measured faster on the H200 (bench/probes/prefill_bounds.py, 2026-12-03_prefill_bounds.json):
# grouped Q4_K 112.3 -> 130.5 TFLOP/s (down 1.19 -> 0.89 ms), Q8_0 83.4 -> 88.2, Q6_K 75.7 ->
# 82.0, Q5_K 43.6 -> 51.3; dense f16-input Q8_0 88.8 -> 91.1, Q6_K 82.3 -> 87.4.
# Bounded, every tile's MMAs are issued (skip_pad False): skipping the padding tiles' MMAs costs
# registers, and at 128 those are spills; in one run (2026-12-03_prefill_tiles_bounded.json)
# issuing them all measured faster in all three formats tried, at either row_threads:
# Q8_0 94.2 against 81.5 TFLOP/s (two threads a row), Q6_K 93.5 against 77.4, Q4_K 124.5
# against 111.4 (one thread a row).
# Three activation stages: 5% faster in every split-loader format once the loop's addresses were
# made once a thread (Q4_K gate/up 0.99 against 1.04 ms, down 0.59 against 0.62; Q8_0 132.2
# against 126.2 TFLOP/s: 2026-12-03_gemm_anatomy_v3.json, _kernels_prefill_addressed.json).
TC_TILE = TcTile(bm=128, bn=128, warps_m=2, warps_n=4, min_blocks=2, skip_pad=False, a_stages=3)
# The default tile's settings by weight format, measured on the H200: Q4_K's split loader runs
# fastest with one thread per weight row (bounded: 124.5 against 121.4 TFLOP/s at two;
# unbounded: 113.9 against 90.8, 2026-11-30_kernels_prefill_v4.json and _rev.json); Q8_0 and
# Q6_K with two (bounded: 94.2 / 93.5 against 86.2 / 80.9 at one).
FORMAT_TILE = {int(GGMLQuantizationType.Q4_K): {"row_threads": 1}}


def tc_tile(ggml_type) -> TcTile:
    """The default tensor-core tile with `ggml_type`'s measured settings (made once a setting:
    every prompt-path GEMM launch asks, and `replace` re-validates a tile)."""
    settings = FORMAT_TILE.get(int(ggml_type))
    return _with_settings(TC_TILE, tuple(sorted(settings.items())) if settings else ())


@functools.cache
def _with_settings(base: TcTile, settings: tuple) -> TcTile:
    return replace(base, **dict(settings))


# A 16-row tile for grouped GEMMs whose experts get a few rows each. In a short prompt
# (32 tokens x top-8 over 128 experts: ~2 rows an expert) 126 of the default tile's 128 rows are
# padding, and its warps issue every MMA of them. This tile issues an eighth of those MMAs; its
# four warps split the 128 columns, and its loads are the default's (one thread a weight row).
# The prompt path takes it under CudaOptions.prefill_small_tiles, for chunks with at most
# SMALL_TILE_ROWS_PER_EXPERT entries an expert on average. Not yet timed on a GPU.
SMALL_TC_TILE = TcTile(bm=16, bn=128, warps_m=1, warps_n=4, row_threads=1, skip_pad=False)
SMALL_TILE_ROWS_PER_EXPERT = 8


def takes_small_tile(n_entries: int, n_experts: int) -> bool:
    """Whether a grouped GEMM of `n_entries` rows over `n_experts` experts fits SMALL_TC_TILE's
    use: few enough rows an expert that the default tile would be mostly padding."""
    return 0 < n_entries <= SMALL_TILE_ROWS_PER_EXPERT * n_experts


FMA_TILE = FmaTile(bm=64, bn=64, threads_m=16, threads_n=16)
