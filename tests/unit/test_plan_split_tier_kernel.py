"""Helper tiers' small pieces (no GPU): the tier-hit counting kernel in the simulator against a
plain count and compiled to PTX for sm_90; the slot table with tier slots merged under every
table the expert cache writes (a loan's misses fall back to a tier, never shadow a cache slot)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

from strata.engine.multi.tiers import TierTable, count_tier_hits


def test_counting_kernel_matches_a_plain_count():
    rng = np.random.default_rng(5)
    n_layer, n_expert, n_slot, n_stage = 3, 16, 20, 2
    table = np.full((n_layer, n_expert), -1, np.int32)  # [n_layer, n_expert]
    pairs = rng.choice(n_layer * n_expert, n_slot, replace=False)
    table.reshape(-1)[pairs] = np.arange(n_slot, dtype=np.int32)
    slot_tier = np.where(np.arange(n_slot) < 8, -1, np.arange(n_slot) % n_stage).astype(np.int32)
    counts = cuda.to_device(np.zeros((n_layer, n_stage), np.int64))
    d_table, d_tier = cuda.to_device(table), cuda.to_device(slot_tier)
    want = np.zeros((n_layer, n_stage), np.int64)
    for _ in range(4):
        layer = int(rng.integers(n_layer))
        ids = rng.choice(n_expert, 6, replace=False).astype(np.int32)
        count_tier_hits(cuda.to_device(ids), d_table, layer, d_tier, counts)
        for e in ids:
            s = table[layer, e]
            if s >= 0 and slot_tier[s] >= 0:
                want[layer, slot_tier[s]] += 1
    assert want.sum() > 0 and np.array_equal(counts.copy_to_host(), want)


def test_counting_refuses_more_than_a_warp():
    with pytest.raises(ValueError, match="k = 33"):
        count_tier_hits(cuda.to_device(np.zeros(33, np.int32)),
                        cuda.to_device(np.zeros((1, 4), np.int32)), 0,
                        cuda.to_device(np.zeros(1, np.int32)),
                        cuda.to_device(np.zeros((1, 1), np.int64)))


PTX_SCRIPT = """
from numba import cuda
from strata.cuda_kernels.launch import PTX_CHECKS
import strata.engine.multi.tiers  # registers count_tier_hits (family engine)
(c,) = [c for c in PTX_CHECKS if c.name == "count_tier_hits"]
fn, sig = c.build()
ptx, _ = cuda.compile_ptx(fn, sig, cc=(9, 0))
assert ".target sm_90" in ptx and "atom" in ptx
print("compiled", c.family, c.name)
"""


def test_counting_kernel_compiles_for_sm90():
    # a child process with the simulator off (the simulator emits no PTX)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", PTX_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "compiled engine count_tier_hits" in proc.stdout


class Recorder:
    def __init__(self):
        self.tables, self.loads = [], []

    def write_table(self, table):
        self.tables.append(table.copy())

    def load(self, slot, layer, expert):
        self.loads.append((slot, layer, expert))


def test_tier_slots_fill_only_the_cache_misses():
    tier_slot = np.array([[-1, 5, 6], [7, -1, -1]], np.int32)  # [n_layer, n_expert]
    rec = Recorder()
    t = TierTable(rec, tier_slot)
    own = np.array([[0, -1, -1], [-1, 1, -1]], np.int32)
    t.write_table(own)
    assert rec.tables[-1].tolist() == [[0, 5, 6], [7, 1, -1]]
    lent = own.copy()
    lent[1, 1] = -1  # a prompt's loan: the cache slot is a miss now
    t.write_table(lent)
    assert rec.tables[-1].tolist() == [[0, 5, 6], [7, -1, -1]]
    t.load(1, 1, 1)
    assert rec.loads == [(1, 1, 1)] and rec.tables[-1].dtype == np.int32
