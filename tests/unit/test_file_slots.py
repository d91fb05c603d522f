"""`FileSlots` (the expert cache filled straight from the model file) under numba's CUDA
simulator: slots in any order over several layers, a staging buffer of a few blobs (many chunks,
both buffers in turn), loads queued until the table is written — every slot holds its expert's
blob as the file has it (gate | up | down), the read order is the file's, and the prefetch
hint is asked for every byte read."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numba import cuda

from strata.engine.cuda import file_slots
from strata.experts.store import blob_layout
from strata.gguf import open_model
from strata.gguf.arch.qwen3moe import EXPERT_NAMES
from strata.synth import PRESETS, write_model

SMALL = dataclasses.replace(
    PRESETS["tiny"], name="file-slots", n_layer=3, n_embd=128, n_head=2, n_head_kv=1,
    head_dim=64, n_expert=8, n_expert_used=2, n_ff_expert=64, n_vocab=512, n_ctx_train=256)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("file_slots") / "small-Q4_K_M.gguf"
    write_model(path, SMALL, mix="Q4_K_M", seed=3, progress=False)
    return open_model(path)


def _check_blob(got, mf, lay, layer, expert):
    for n, off in zip(EXPERT_NAMES, (0, lay.up_off, lay.down_off)):
        want = mf.expert_raw(f"blk.{layer}.{n}.weight", expert).reshape(-1)
        np.testing.assert_array_equal(got[off:off + want.size], want)


@pytest.mark.parametrize("stage_blobs,ranked", [(1, True), (3, True), (3, False)])
def test_slots_in_any_order_hold_their_experts_blobs(model, monkeypatch, stage_blobs, ranked):
    layers = (0, 3)
    layouts = tuple(blob_layout(model.shape, i) for i in range(SMALL.n_layer))
    nb = [lay.n_bytes for lay in layouts]
    assert len(set(nb)) > 1  # the mix's layers differ: blobs of several sizes
    monkeypatch.setattr(file_slots, "STAGE_BYTES", stage_blobs * max(nb))
    asked = []
    real = type(model).prefetch
    monkeypatch.setattr(type(model), "prefetch",
                        lambda self, name, lo=0, hi=None: (asked.append((name, lo, hi)),
                                                           real(self, name, lo, hi)))
    rng = np.random.default_rng(5)
    pairs = [(il, e) for il in range(3) for e in rng.permutation(SMALL.n_expert)[:6]]
    # slots in rank order, random against the file's; or in the file's (runs of slots)
    order = rng.permutation(len(pairs)) if ranked else np.arange(len(pairs))
    n_slots = len(pairs) + 2
    # the first half of the slots a little larger than a blob (no two copied in one go), the
    # rest packed (consecutive slots copied together)
    in_slot = [pairs[k] for k in order] + [(0, 0)] * 2
    sizes = [nb[il] + 256 * (s < n_slots // 2) for s, (il, _) in enumerate(in_slot)]
    slot_offset = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    cache = cuda.to_device(np.zeros(sum(sizes), np.uint8))
    table = cuda.to_device(np.full((3, SMALL.n_expert), -1, np.int32))
    fs = file_slots.FileSlots(model, layouts, table, cache, slot_offset, cuda.stream(), layers)
    host_table = np.full((3, SMALL.n_expert), -1, np.int32)
    for slot, k in enumerate(order):
        il, e = pairs[k]
        fs.load(slot, int(il), int(e))
        host_table[il, e] = slot
    assert fs.n_bytes == 0 and fs.pending  # queued until the table is written
    fs.write_table(host_table)
    fs.stream.synchronize()
    fs.release()
    got = cache.copy_to_host()
    for slot, k in enumerate(order):
        il, e = pairs[k]
        off = int(slot_offset[slot])
        _check_blob(got[off:off + nb[il]], model, layouts[il], il, e)
    np.testing.assert_array_equal(table.copy_to_host(), host_table)
    assert fs.n_bytes == sum(nb[il] for il, _ in pairs) and not fs.pending
    # every expert read was prefetched first, and the chunks went in the file's order
    for il, e in pairs:
        for n, size in zip(EXPERT_NAMES, (layouts[il].gate_bytes, layouts[il].up_bytes,
                                          layouts[il].down_bytes)):
            assert any(name == f"blk.{il}.{n}.weight" and lo <= e * size and (e + 1) * size <= hi
                       for name, lo, hi in asked)
    starts = [(int(name.split(".")[1]), lo) for name, lo, _ in asked if "gate" in name]
    assert starts == sorted(starts)


def test_a_layer_it_does_not_hold_is_refused(model):
    layouts = tuple(blob_layout(model.shape, i) for i in range(SMALL.n_layer))
    fs = file_slots.FileSlots(model, layouts, None, None, np.zeros(1, np.int64), None, (0, 2))
    with pytest.raises(ValueError, match="layer 2"):
        fs.load(0, 2, 0)


def test_prefetch_checks_its_range(model):
    t = model.tensors["blk.0.ffn_gate_exps.weight"]
    model.prefetch(t.name, 0, t.n_bytes)  # a hint: nothing to see but no error
    model.prefetch(t.name, 5, 5)
    with pytest.raises(ValueError, match="not within"):
        model.prefetch(t.name, 0, t.n_bytes + 1)
    with pytest.raises(ValueError, match="not within"):
        model.prefetch(t.name, 10, 5)
