"""Decode attention's split policy (strata.plan.attn_split): the split length at a live length,
the splits a grid and the plan's partials must hold, against a brute-force walk over every
length."""

from __future__ import annotations

import pytest

from strata.plan import attn_split
from strata.plan.attn_split import SPLIT_K_MIN, max_splits, n_used, split_len, split_target


def _brute_max(n_ctx: int, n_target: int, max_split: int, min_split: int = SPLIT_K_MIN) -> int:
    return max(-(-n // split_len(n, n_target, max_split, min_split)) for n in range(1, n_ctx + 1))


def test_split_target_fills_the_gpu_about_twice():
    assert attn_split.SPLIT_K_BLOCKS == 256
    assert [split_target(h) for h in (1, 2, 4, 8, 32, 256, 512)] == [256, 128, 64, 32, 8, 1, 1]
    with pytest.raises(ValueError, match="n_kv_head must be positive"):
        split_target(0)


@pytest.mark.parametrize("length,want", [(1, 16), (15, 16), (16, 16), (17, 16), (600, 16),
                                         (1025, 32), (4096, 64), (4097, 80), (10000, 160),
                                         (16384, 256), (32768, 256), (131072, 256)])
def test_split_len_follows_the_length_at_the_30b_shape(length, want):
    # 4 KV heads: 64 splits aimed at, splits of 16..256 keys in steps of 16
    assert split_len(length, split_target(4), 256, 16) == want


@pytest.mark.parametrize("length,want", [(1, 64), (600, 64), (4096, 64), (4097, 128),
                                         (10000, 192), (16384, 256), (131072, 256)])
def test_split_len_with_a_64_key_floor(length, want):
    assert split_len(length, split_target(4), 256, 64) == want


@pytest.mark.parametrize("min_split", [16, 32, 64])
def test_rule_holds_at_every_length(min_split):
    for n_target in (1, 2, 3, 4, 7, 64, 256):
        for max_split in (16, 32, 48, 80, 256):
            floor = min(min_split, max_split)
            for n in range(1, 3000, 7):
                s = split_len(n, n_target, max_split, min_split)
                assert floor <= s <= max_split and (s % floor == 0 or s == max_split)
                # the fewest splits the bounds allow: aimed at n_target, shorter only at the floor
                assert n_used(n, n_target, max_split, min_split) <= \
                    max(n_target, -(-n // max_split))
                assert s == floor or s == max_split or -(-n // (s - floor)) > n_target


@pytest.mark.parametrize("n_target,max_split", [(1, 256), (3, 32), (4, 16), (4, 256),
                                                (64, 256), (7, 48), (5, 80)])
@pytest.mark.parametrize("min_split", [16, 64])
def test_max_splits_is_exact(n_target, max_split, min_split):
    for n_ctx in (1, 15, 16, 17, 100, 600, 1000, 2047, 4096):
        assert max_splits(n_ctx, n_target, max_split, min_split) == \
            _brute_max(n_ctx, n_target, max_split, min_split)


def test_max_splits_at_the_30b_contexts():
    t = split_target(4)
    assert attn_split.SPLIT_K_MIN == 64  # the default floor: a tile for each of four warps
    assert [max_splits(n, t, 256, 64) for n in (256, 600, 4096, 16384, 32768, 131072)] == \
        [4, 10, 64, 64, 128, 512]
    # the default, the generic kernel's floor of 16, holds the splits of either kernel
    assert [max_splits(n, t) for n in (256, 600, 4096, 16384, 32768, 131072)] == \
        [16, 38, 64, 64, 128, 512]
    # n_target 1: the fixed 256-key split of before
    assert [max_splits(n, 1, 256, 16) for n in (600, 4096, 32768)] == [3, 16, 128]


def test_bad_split_parameters_are_refused():
    with pytest.raises(ValueError, match="split target must be at least 1"):
        max_splits(100, 0)
    for bad in (0, 8, 24, 100):
        with pytest.raises(ValueError, match="longest split must be a positive multiple of 16"):
            max_splits(100, 4, bad)
    for bad in (0, 8, 24):
        with pytest.raises(ValueError, match="shortest split must be a positive multiple of 16"):
            max_splits(100, 4, 256, bad)
    assert max_splits(100, 4, 32, 64) == 4  # a floor past the longest split gives way to it
    with pytest.raises(ValueError, match="at least one position"):
        max_splits(0, 4)
