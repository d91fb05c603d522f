"""Decode attention's split policy: how many keys a pass-1 block takes, from the live length.

Flash-decoding cuts the L valid keys of the cache into splits, one pass-1 block per (KV head,
split), and a second pass merges the splits. A split of fixed length leaves a short context with
a handful of blocks on a GPU of 132 SMs (600 keys at 256 a split: 3 per KV head). Here the split
length follows the live length, which the kernels read on the device at every replay of a
captured graph:

    split_len(L) = clamp(round_up(ceil(L / n_target), m), m, max_split),
    m = min(min_split, max_split)

with n_target = SPLIT_K_BLOCKS // n_kv_head splits (about two pass-1 blocks per SM at every
length up to n_target * max_split keys: 16K at 4 KV heads), then splits of max_split keys (the
split kernels' shared score buffer holds that many scores per query head). The grid a graph is
captured with and the partials the plan sizes hold `max_splits`: the most splits any length up
to the context can need. min_split is the shortest split and the granularity where the longest
allows it, and it is the kernel's: the tensor-core kernel's four warps take a 16-key tile each,
so its splits hold at least SPLIT_K_MIN = 64 keys (at 16 three of them sat idle); the generic
kernel's block takes 16 keys a round, so its splits keep SPLIT_K_GRAIN = 16 (more blocks in
parallel). On the H200 at 600 live keys of a 4K cache (30B-A3B shape) the tensor-core kernel's
pass 1 + combine went from 12.1 to 10.4 us a layer at 64 (11.7 at 128) and D1 decode from 326.8
to 331.8 tok/s; the generic kernel (int8 KV) took 13.7 us at 16 and 18.0 at 64; at 4K and 32K
the splits are longer than either floor
(`bench/results/2026-12-01_kernels_decode_attention_floor.json`). Partials sized for
SPLIT_K_GRAIN (the default here) hold the splits of either kernel.

`split_len` is also compiled as a device function by the kernels (one definition of the rule):
it keeps to integer arithmetic, min and max.
"""

from __future__ import annotations

SPLIT_K_TOKENS = 256  # the longest split: the split kernels' shared score buffer, per query head
SPLIT_K_MIN = 64      # the tensor-core kernel's shortest split (where max_split allows)
SPLIT_K_GRAIN = 16    # what split bounds are multiples of; the generic kernel's shortest split
SPLIT_K_BLOCKS = 256  # pass-1 blocks aimed at: about two per SM on a 132-SM H200


def split_target(n_kv_head: int) -> int:
    """Splits per KV head aimed at: SPLIT_K_BLOCKS blocks over the KV heads, at least one."""
    if n_kv_head < 1:
        raise ValueError(f"n_kv_head must be positive, got {n_kv_head}")
    return max(1, SPLIT_K_BLOCKS // n_kv_head)


def split_len(length, n_target, max_split, min_split):
    """Keys per split at `length` valid keys (the rule in the module doc; device-compiled, so
    every argument is explicit)."""
    floor = min(min_split, max_split)
    per = (length + n_target - 1) // n_target
    per = (per + floor - 1) // floor * floor
    return min(max(per, floor), max_split)


def n_used(length: int, n_target: int, max_split: int = SPLIT_K_TOKENS,
           min_split: int = SPLIT_K_GRAIN) -> int:
    """Splits that hold keys at `length` valid keys."""
    return -(-length // split_len(length, n_target, max_split, min_split))


def check_split(n_target: int, max_split: int, min_split: int = SPLIT_K_GRAIN) -> None:
    """ValueError unless n_target >= 1 and both split bounds are positive multiples of
    SPLIT_K_GRAIN."""
    if n_target < 1:
        raise ValueError(f"the split target must be at least 1 split, got {n_target}")
    for what, n in (("shortest", min_split), ("longest", max_split)):
        if n < SPLIT_K_GRAIN or n % SPLIT_K_GRAIN:
            raise ValueError(f"the {what} split must be a positive multiple of {SPLIT_K_GRAIN} "
                             f"keys, got {n}")


def max_splits(n_ctx: int, n_target: int, max_split: int = SPLIT_K_TOKENS,
               min_split: int = SPLIT_K_GRAIN) -> int:
    """The most splits any length 1..n_ctx uses (exact): a split never holds fewer than
    min(min_split, max_split) keys, below the clamp at max_split there are at most n_target
    splits, and past it ceil(L / max_split)."""
    check_split(n_target, max_split, min_split)
    if n_ctx < 1:
        raise ValueError(f"the context must hold at least one position, got {n_ctx}")
    floor = min(min_split, max_split)
    return min(-(-n_ctx // floor), max(n_target, -(-n_ctx // max_split)))
