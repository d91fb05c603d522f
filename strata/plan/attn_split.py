"""Decode attention's split policy: how many keys a pass-1 block takes, from the live length.

Flash-decoding cuts the L valid keys of the cache into splits, one pass-1 block per (KV head,
split), and a second pass merges the splits. A split of fixed length leaves a short context with
a handful of blocks on a GPU of 132 SMs (600 keys at 256 a split: 3 per KV head). Here the split
length follows the live length, which the kernels read on the device at every replay of a
captured graph:

    split_len(L) = clamp(round_up(ceil(L / n_target), min_split), min_split, max_split)

with n_target = SPLIT_K_BLOCKS // n_kv_head splits (about two pass-1 blocks per SM at every
length up to n_target * max_split keys: 16K at 4 KV heads), then splits of max_split keys (the
split kernels' shared score buffer holds that many scores per query head). The grid a graph is
captured with and the partials the plan sizes hold `max_splits`: the most splits any length up
to the context can need.

`split_len` is also compiled as a device function by the kernels (one definition of the rule):
it keeps to integer arithmetic, min and max.
"""

from __future__ import annotations

SPLIT_K_TOKENS = 256  # the longest split: the split kernels' shared score buffer, per query head
SPLIT_K_MIN = 16      # the shortest split and the granularity: the tensor-core kernel's key tile
SPLIT_K_GRAIN = 16    # what min_split must be a multiple of (the tensor-core kernel's key tile)
SPLIT_K_BLOCKS = 256  # pass-1 blocks aimed at: about two per SM on a 132-SM H200


def split_target(n_kv_head: int) -> int:
    """Splits per KV head aimed at: SPLIT_K_BLOCKS blocks over the KV heads, at least one."""
    if n_kv_head < 1:
        raise ValueError(f"n_kv_head must be positive, got {n_kv_head}")
    return max(1, SPLIT_K_BLOCKS // n_kv_head)


def split_len(length, n_target, max_split, min_split):
    """Keys per split at `length` valid keys (the rule in the module doc; device-compiled, so
    every argument is explicit)."""
    per = (length + n_target - 1) // n_target
    per = (per + min_split - 1) // min_split * min_split
    return min(max(per, min_split), max_split)


def n_used(length: int, n_target: int, max_split: int = SPLIT_K_TOKENS,
           min_split: int = SPLIT_K_MIN) -> int:
    """Splits that hold keys at `length` valid keys."""
    return -(-length // split_len(length, n_target, max_split, min_split))


def check_split(n_target: int, max_split: int, min_split: int = SPLIT_K_MIN) -> None:
    """ValueError unless n_target >= 1, min_split is a positive multiple of SPLIT_K_GRAIN and
    max_split a positive multiple of min_split."""
    if n_target < 1:
        raise ValueError(f"the split target must be at least 1 split, got {n_target}")
    if min_split < SPLIT_K_GRAIN or min_split % SPLIT_K_GRAIN:
        raise ValueError(f"the shortest split must be a positive multiple of {SPLIT_K_GRAIN} "
                         f"keys, got {min_split}")
    if max_split < min_split or max_split % min_split:
        raise ValueError(f"the longest split must be a positive multiple of {min_split} keys "
                         f"(the shortest), got {max_split}")


def max_splits(n_ctx: int, n_target: int, max_split: int = SPLIT_K_TOKENS,
               min_split: int = SPLIT_K_MIN) -> int:
    """The most splits any length 1..n_ctx uses (exact): a split never holds fewer than
    min_split keys, below the clamp at max_split there are at most n_target splits, and past
    it ceil(L / max_split)."""
    check_split(n_target, max_split, min_split)
    if n_ctx < 1:
        raise ValueError(f"the context must hold at least one position, got {n_ctx}")
    return min(-(-n_ctx // min_split), max(n_target, -(-n_ctx // max_split)))
