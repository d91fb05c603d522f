"""Byte layouts: the one definition of every device buffer's size, dtype, shape and offset.

Each buffer family has ONE function that both prices it (`.total_bytes`) and lays it out (the
regions' offsets): the planner reads the totals, the arena carves the same regions, so the two
cannot disagree. Every region starts on a 256-byte boundary and a layout's total is the sum of
its regions' aligned sizes.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.attn_split import SPLIT_K_TOKENS, max_splits, split_target
from strata.plan.pick import (PICK_FPARAMS, PICK_IPARAMS, PICK_KMAX, PICK_MAX_BIAS, pick_blocks,
                               pick_cand_len)

# Bytes the kernels' constant tables take on a device, every format's at 256-byte alignment
# (strata.cuda_kernels.tables lays them out; a test holds the two together).
FORMAT_TABLES_BYTES = 24 * 1024

ALIGN = 256  # bytes: every region's offset (coalesced loads, 16-byte vector access, cp.async)
ROUTE_TILE_ROWS = 64  # the grouped GEMMs' smallest row tile (cuda_kernels.matmul_tiles)
KV_TYPES = ("f16", "int8", "q4_0")
Q4_0_BLOCK = 32  # values per q4_0 block: one f16 scale + 16 bytes of nibbles
Q4_0_BLOCK_BYTES = 18


@lru_cache(maxsize=None)
def _dtype(dtype: str | type) -> tuple[str, int]:
    dt = np.dtype(dtype)
    return dt.name, dt.itemsize


def align_up(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


@dataclass(frozen=True, slots=True)
class Region:
    """One typed buffer inside a layout. `sub` is set when the region holds a nested layout."""

    name: str
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]
    offset: int  # bytes from the start of the layout; a multiple of ALIGN
    n_bytes: int  # exact size, before alignment
    sub: "Layout | None" = None

    @property
    def aligned_bytes(self) -> int:
        return align_up(self.n_bytes)

    @property
    def end(self) -> int:
        return self.offset + self.aligned_bytes


@dataclass(frozen=True, slots=True)
class Layout:
    """An ordered set of regions; `total_bytes` = sum of their aligned sizes."""

    name: str
    regions: tuple[Region, ...]
    total_bytes: int
    _index: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index.update({r.name: i for i, r in enumerate(self.regions)})

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def region(self, name: str) -> Region:
        i = self._index.get(name)
        if i is None:
            raise KeyError(f"layout {self.name!r} has no region {name!r} "
                           f"(has: {', '.join(self._index)})")
        return self.regions[i]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.regions)

    def sizes(self) -> dict[str, int]:
        """Aligned bytes per region, in layout order."""
        return {r.name: r.aligned_bytes for r in self.regions}


class LayoutBuilder:
    """Appends regions at 256-byte aligned offsets."""

    def __init__(self, name: str):
        self.name = name
        self._regions: list[Region] = []
        self._names: set[str] = set()
        self._end = 0

    def add(self, name: str, dtype: str | type, shape: tuple[int, ...]) -> Region:
        dt_name, n = _dtype(dtype)
        dims = tuple(int(d) for d in shape)
        for d in dims:
            if d < 0:
                raise ValueError(f"{self.name}.{name}: negative dimension in {shape}")
            n *= d
        return self._append(Region(name, dt_name, dims, self._end, n))

    def add_layout(self, name: str, sub: Layout) -> Region:
        """A region holding a whole nested layout (its offsets are relative to this region)."""
        return self._append(Region(name, "uint8", (sub.total_bytes,), self._end,
                                   sub.total_bytes, sub))

    def _append(self, r: Region) -> Region:
        if r.name in self._names:
            raise ValueError(f"{self.name}: region {r.name!r} added twice")
        self._names.add(r.name)
        self._regions.append(r)
        self._end = r.end
        return r

    def build(self) -> Layout:
        return Layout(self.name, tuple(self._regions), self._end)


# -- KV cache ------------------------------------------------------------------------------------

def _check_kv_type(shape: ModelShape, kv_type: str) -> None:
    if kv_type not in KV_TYPES:
        raise ValueError(f"KV type {kv_type!r} is not one of {', '.join(KV_TYPES)}")
    if kv_type == "q4_0" and shape.head_dim % Q4_0_BLOCK:
        raise ValueError(f"--kv q4_0 needs head_dim divisible by {Q4_0_BLOCK} "
                         f"(this model's head_dim is {shape.head_dim})")


def kv_row_bytes(shape: ModelShape, kv_type: str) -> int:
    """Bytes of one (token, kv head) row of K or V, scales excluded."""
    _check_kv_type(shape, kv_type)
    d = shape.head_dim
    return {"f16": 2 * d, "int8": d, "q4_0": d // Q4_0_BLOCK * Q4_0_BLOCK_BYTES}[kv_type]


def kv_side_token_bytes(shape: ModelShape, kv_type: str) -> int:
    """Bytes one token's rows add to one layer's K (or V), every KV head, scales excluded: what
    streamed KV maps, stages and leaves in host memory."""
    return shape.n_head_kv * kv_row_bytes(shape, kv_type)


def kv_token_layer_bytes(shape: ModelShape, kv_type: str) -> int:
    """K+V bytes of one token in one layer, exact (int8's f16 scales included)."""
    scale = 2 if kv_type == "int8" else 0
    return 2 * shape.n_head_kv * (kv_row_bytes(shape, kv_type) + scale)


def kv_bytes_per_token(shape: ModelShape, kv_type: str) -> int:
    """K+V bytes of one token over every layer (before region alignment)."""
    return shape.n_layer * kv_token_layer_bytes(shape, kv_type)


def kv_layout(shape: ModelShape, *, kv_type: str, resident_tokens: int,
              lo: int = 0, hi: int | None = None, max_context: int | None = None) -> Layout:
    """The arena's part of the KV cache for layers [lo, hi).

    K and V are uint8 [L, T, H, row] (one layer's side, flattened, is what the attention kernels
    read): f16 rows of head_dim values; int8 rows of head_dim values with one f16 scale per
    (token, kv head) in K/V_scale [L, T, H]; q4_0 rows of head_dim/32 blocks of 18 bytes.
    T = resident_tokens. Where they are fewer than `max_context` the KV streams: K and V of
    every token are mapped instead (`kv_mapped_layout`: the VRAM rows, then host rows, in one
    address range per layer side), so the arena keeps only int8's scales, for the whole context
    (8 bytes a token and layer: below what an address mapping can split).
    """
    hi = shape.n_layer if hi is None else hi
    n_l, t, h = hi - lo, resident_tokens, shape.n_head_kv
    ctx = t if max_context is None else max_context
    row = kv_row_bytes(shape, kv_type)
    b = LayoutBuilder("kv")
    for side in ("k", "v"):
        if t == ctx:
            b.add(side, np.uint8, (n_l, t, h, row))  # [L, T, H, row_bytes] uint8
        if kv_type == "int8":
            b.add(side + "_scale", np.float16, (n_l, ctx, h))  # [L, ctx, H] f16
    return b.build()


def kv_mapped_layout(shape: ModelShape, *, kv_type: str, resident_tokens: int,
                     lo: int = 0, hi: int | None = None) -> Layout:
    """The VRAM rows of streamed K and V ([L, T, H, row] uint8 each, T = resident_tokens): priced
    with the fixed regions but not part of the arena, since each layer side's VRAM rows and its
    host rows are mapped into one address range (`strata.memory.kv_map`)."""
    hi = shape.n_layer if hi is None else hi
    row = kv_row_bytes(shape, kv_type)
    b = LayoutBuilder("kv_mapped")
    for side in ("k", "v"):
        b.add(side, np.uint8, (hi - lo, resident_tokens, shape.n_head_kv, row))
    return b.build()


def kv_map_unit(shape: ModelShape, kv_type: str, granule_bytes: int) -> int:
    """Resident tokens come in multiples of this when the KV streams: a layer side's VRAM rows
    must end on a granule of the driver's address mappings."""
    return granule_bytes // math.gcd(granule_bytes, kv_side_token_bytes(shape, kv_type))


def _add_kv_stage(b: LayoutBuilder, shape: ModelShape, kv_type: str, stage_tokens: int) -> None:
    # Streamed KV: the prompt path's attention reads every key once per block of queries, so it
    # runs on a VRAM copy of the layer's whole context (its K and V rows, [2, T, H * row]); decode
    # reads each key once and takes the mapped rows directly (it has no copy).
    if stage_tokens > 0:
        b.add("kv_stage", np.uint8, (2, stage_tokens, kv_side_token_bytes(shape, kv_type)))


# -- decode session ------------------------------------------------------------------------------

def session_layout(shape: ModelShape, *, batch: int, max_context: int, kv_type: str = "f16"
                   ) -> Layout:
    """Decode buffers for `batch` sequences and the per-device decode state (shapes are what the
    decode kernels take: split-K partials, MoE scratch, sampler history, expert tables)."""
    if batch < 1 or max_context < 1:
        raise ValueError(f"batch ({batch}) and max_context ({max_context}) must be positive")
    s, e, k, n_b = shape, shape.n_embd, shape.n_expert_used, batch
    qd, kvd = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    # decode attention's split-K partials: the most splits any length up to the context uses
    # (the split length follows the live length: strata.plan.attn_split)
    n_split = max_splits(max_context, split_target(s.n_head_kv), SPLIT_K_TOKENS)
    b = LayoutBuilder("activations")
    b.add("hidden", np.float32, (n_b, e))  # [batch, n_embd] f32
    b.add("residual", np.float32, (n_b, e))
    b.add("normed", np.float32, (n_b, e))
    b.add("q", np.float32, (n_b, qd))  # [batch, n_head * head_dim] f32
    b.add("k", np.float32, (n_b, kvd))  # [batch, n_head_kv * head_dim] f32
    b.add("v", np.float32, (n_b, kvd))
    b.add("attn_out", np.float32, (n_b, qd))
    b.add("attn_part_o", np.float32, (n_b, n_split, s.n_head, s.head_dim))  # per split: P V
    b.add("attn_part_ml", np.float32, (n_b, n_split, s.n_head, 2))  # per split: max, sum
    b.add("router_logits", np.float32, (n_b, s.n_expert))  # [batch, n_expert] f32
    b.add("topk_ids", np.int32, (n_b, k))  # [batch, k] int32
    b.add("topk_weights", np.float32, (n_b, k))
    # the fused router's count of finished blocks (strata.cuda_kernels.router_normed): zero at
    # load, and the kernel's last block sets it back to zero
    b.add("router_done", np.int32, (n_b,))  # [batch] int32
    # the fused MoE launch's grid barrier, one 64-bit count of arrivals (or (arrivals,
    # generation); strata.cuda_kernels.gridsync): zero at load, kept by the kernel after
    b.add("moe_sync", np.int32, (n_b, 2))  # [batch, 2] int32
    # the token choice's (best key, finished blocks, NaN seen) (strata.cuda_kernels.sampling):
    # zero at load, the first two set back to zero by the launch's last block, the flag by the
    # host that reads it; and each sampler block's candidates
    b.add("pick_state", np.uint64, (n_b, 3))  # [batch, 3] uint64
    n_cand = pick_blocks(s.n_vocab) * PICK_KMAX
    # [batch, blocks * 256 + blocks * 2] f32: candidates, then each block's (max, mass)
    b.add("pick_cand_v", np.float32, (n_b, pick_cand_len(s.n_vocab)))
    b.add("pick_cand_i", np.int32, (n_b, n_cand))  # [batch, blocks * 256] int32 token ids
    b.add("moe_h", np.float32, (n_b, k, s.n_ff_expert))  # [batch, k, n_ff] silu(g) * u
    b.add("miss_list", np.int32, (n_b, k))  # experts left to the CPU pool
    b.add("moe_out", np.float32, (n_b, e))
    b.add("logits", np.float32, (n_b, s.n_vocab))  # [batch, n_vocab] f32
    b.add("seq_len", np.int32, (n_b,))  # tokens in each sequence's cache
    b.add("history", np.int32, (n_b, max_context))  # sampled tokens (repeat penalty, output)
    b.add("step_tokens", np.int32, (n_b,))  # each sequence's input token of a batched step
    b.add("n_tokens", np.int32, (n_b,))
    # temperature, top_p, min_p, repeat, presence and frequency penalties
    b.add("sample_fparams", np.float32, (n_b, PICK_FPARAMS))
    b.add("sample_iparams", np.int64, (n_b, PICK_IPARAMS))  # seed, top_k, window, n_bias
    # each row's logit bias: token ids (-1 past the row's n_bias) and the values added
    b.add("sample_bias_ids", np.int32, (n_b, PICK_MAX_BIAS))
    b.add("sample_bias_vals", np.float32, (n_b, PICK_MAX_BIAS))
    b.add("slot_table", np.int32, (s.n_layer, s.n_expert))  # (layer, expert) -> slot, -1 = miss
    b.add("slot_off", np.int64, (s.n_layer * s.n_expert,))  # byte offset of each cache slot
    b.add("host_off", np.int64, (s.n_layer, s.n_expert))  # byte offset of each expert in host
    b.add("hit_counts", np.int64, (s.n_layer, 2))  # per layer: hits, misses
    # the quant formats' lookup tables (IQ grids, non-linear codebooks) and the kernels' other
    # constants, installed once at load: so they come out of the arena, not a second allocation
    b.add("format_tables", np.uint8, (FORMAT_TABLES_BYTES,))
    return b.build()


# -- prompt path ---------------------------------------------------------------------------------

def route_max_tiles(n_entries: int, n_expert: int, tile_rows: int = ROUTE_TILE_ROWS) -> int:
    """Row tiles of any grouping of n_entries rows: every expert adds at most one partial tile."""
    return -(-n_entries // tile_rows) + min(n_expert, n_entries)


def prompt_layout(shape: ModelShape, chunk: int, *, kv_type: str = "f16",
                  kv_stage_tokens: int = 0) -> Layout:
    """The prompt path's buffers for one chunk of `chunk` tokens (priced and carved here only)."""
    if chunk < 1:
        raise ValueError(f"prompt chunk must be positive, got {chunk}")
    s, c, e, k = shape, chunk, shape.n_embd, shape.n_expert_used
    qd, kvd, ck = s.n_head * s.head_dim, s.n_head_kv * s.head_dim, chunk * shape.n_expert_used
    n_tiles = route_max_tiles(ck, s.n_expert)
    b = LayoutBuilder("prompt")
    b.add("hidden", np.float32, (c, e))  # [chunk, n_embd] f32
    b.add("normed", np.float16, (c, e))  # [chunk, n_embd] f16
    b.add("q", np.float32, (c, qd))  # [chunk, n_head * head_dim] f32 (RoPE applied)
    b.add("k", np.float32, (c, kvd))  # [chunk, n_head_kv * head_dim] f32, before the cache
    b.add("v", np.float32, (c, kvd))
    b.add("attn_out", np.float32, (c, qd))
    b.add("router_logits", np.float32, (c, s.n_expert))  # [chunk, n_expert] f32
    b.add("topk_ids", np.int32, (c, k))  # [chunk, k] int32
    b.add("topk_weights", np.float32, (c, k))
    b.add("expert_counts", np.int32, (s.n_expert + 1,))  # the grouping by expert
    b.add("expert_offsets", np.int32, (s.n_expert + 1,))
    b.add("expert_cursor", np.int32, (s.n_expert,))
    b.add("perm_ids", np.int32, (ck,))  # [chunk * k] int32: entry at each grouped position
    b.add("inv_ids", np.int32, (ck,))  # [chunk * k] int32: grouped position of each entry
    b.add("tile_group", np.int32, (n_tiles,))  # the grouped GEMMs' tile schedule
    b.add("tile_m0", np.int32, (n_tiles,))
    b.add("n_tiles", np.int32, (1,))
    b.add("gathered", np.float16, (ck, e))  # [chunk * k, n_embd] f16
    b.add("expert_mid", np.float16, (ck, s.n_ff_expert))  # [chunk * k, n_ff] f16
    b.add("expert_out", np.float32, (ck, e))  # [chunk * k, n_embd] f32
    b.add("logits", np.float32, (s.n_vocab,))  # last token only
    _add_kv_stage(b, shape, kv_type, kv_stage_tokens)
    return b.build()


# -- prefill ring --------------------------------------------------------------------------------

def ring_slot_bytes(shape: ModelShape) -> int:
    """One ring slot: the largest expert blob, aligned."""
    return align_up(shape.expert_slot_bytes_max)


def ring_slots_for(shape: ModelShape, ring_bytes: int) -> int:
    """Slots a ring budget buys: 0 for no ring, else at least 2 (one filling, one read)."""
    if ring_bytes <= 0:
        return 0
    return max(2, ring_bytes // ring_slot_bytes(shape))


def ring_layout(shape: ModelShape, *, ring_bytes: int) -> Layout:
    """The prefill ring: experts streamed from host memory, slots of the largest blob."""
    n = ring_slots_for(shape, ring_bytes)
    b = LayoutBuilder("ring")
    if n:
        b.add("slots", np.uint8, (n, ring_slot_bytes(shape)))  # [n_slot, blob] raw expert bytes
    return b.build()


# -- dense weights -------------------------------------------------------------------------------

def weights_layout(shape: ModelShape, lo: int, hi: int, *, embd_on_host: bool) -> Layout:
    """The dense tensors of layers [lo, hi), plus the globals this range uses, as the engine
    stores them (GGUF's bytes, or a planar layout's: `TensorInfo.vram_bytes`).

    The first range does the embedding lookup (token_embd on the device unless `embd_on_host`);
    the last range owns output_norm and the head. A tied head (no output.weight) reads
    token_embd, so the last range keeps it on the device whatever `embd_on_host` says.
    """
    if not 0 <= lo < hi <= shape.n_layer:
        raise ValueError(f"layer range [{lo}, {hi}) is not inside [0, {shape.n_layer})")
    t = shape.tensors
    tied = "output.weight" not in t
    names: list[str] = []
    if (lo == 0 and not embd_on_host) or (hi == shape.n_layer and tied):
        names.append("token_embd.weight")
    b = LayoutBuilder("weights")
    for name in names:
        b.add(name, np.uint8, (t[name].vram_bytes,))
    for i in range(lo, hi):
        for ti in shape.layers[i].dense:
            b.add(ti.name, np.uint8, (ti.vram_bytes,))
    if hi == shape.n_layer:
        for name in ("output_norm.weight", "output.weight"):
            if name in t:
                b.add(name, np.uint8, (t[name].vram_bytes,))
    return b.build()


def draft_layout(shape: ModelShape, n_spec: int, *, kv_type: str,
                 resident_tokens: int) -> Layout:
    """A draft head for `--spec N`: one block's dense weights (the largest block), that block's
    KV for the resident context, and the verify buffers of N+1 tokens (a prompt-path pass)."""
    if n_spec < 1:
        raise ValueError(f"--spec must be at least 1, got {n_spec}")
    block = max(shape.layer_dense_bytes(i) for i in range(shape.n_layer))
    b = LayoutBuilder("draft")
    b.add("block", np.uint8, (block,))
    b.add_layout("kv", kv_layout(shape, kv_type=kv_type, resident_tokens=resident_tokens,
                                 lo=0, hi=1))
    b.add_layout("verify", prompt_layout(shape, n_spec + 1, kv_type=kv_type))
    return b.build()
