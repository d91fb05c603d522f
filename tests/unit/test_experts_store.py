"""The host expert store: one blob per (layer, expert) laid out gate | up | down, equal to the
GGUF file's own expert slices, aligned, the plan's slot size; the embedding rows after them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers.engine_models import CONFIG, model_path
from strata.experts import blob_layout, build_store
from strata.experts.store import BLOB_ALIGN
from strata.gguf import open_model


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q8_0"])
def test_blobs_are_the_files_expert_slices(tmp_models, mix):
    mf = open_model(model_path(tmp_models, mix))
    s = mf.shape
    store = build_store(mf, with_embd=True)
    for il in range(s.n_layer):
        lay = blob_layout(s, il)
        assert lay.n_bytes == s.expert_slot_bytes(il)  # the plan's slot size
        for e in (0, s.n_expert // 2, s.n_expert - 1):
            want = np.concatenate([mf.expert_raw(f"blk.{il}.{n}.weight", e).reshape(-1)
                                   for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")])
            np.testing.assert_array_equal(store.blob(il, e), want)
            assert store.host_off[il, e] % BLOB_ALIGN == 0
    t = mf.tensors["token_embd.weight"]
    np.testing.assert_array_equal(store.embd(t.n_rows, t.row_bytes), mf.raw_rows(t.name))
    assert store.embd_off % BLOB_ALIGN == 0 and store.fill_seconds > 0


def test_store_without_embedding_refuses_rows(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    store = build_store(mf, with_embd=False)
    assert store.embd_off == -1 and store.n_bytes == store.expert_bytes
    with pytest.raises(ValueError, match="without the token embedding"):
        store.embd(1, 1)


def test_progress_reaches_the_total(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    seen = []
    build_store(mf, with_embd=True, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1][0] == seen[-1][1] and all(a <= b for a, b in seen)


@pytest.mark.parametrize("mix", ["LEGACY_MIX", "IQ_MIX"])
def test_gate_and_up_of_different_formats_keep_their_own_sizes(tmp_models, mix):
    mf = open_model(model_path(tmp_models, mix))  # LEGACY_MIX: gate Q4_0, up Q5_0
    s = mf.shape
    store = build_store(mf, with_embd=False)
    for il in range(s.n_layer):
        lay = blob_layout(s, il)
        gate, up, _ = s.layers[il].experts
        assert lay.mixed and (lay.gate_type, lay.up_type) == (gate.ggml_type, up.ggml_type)
        assert lay.down_off == lay.gate_bytes + lay.up_bytes != 2 * lay.gate_bytes
        assert lay.n_bytes == s.expert_slot_bytes(il)
        e = s.n_expert - 1
        want = np.concatenate([mf.expert_raw(f"blk.{il}.{n}.weight", e).reshape(-1)
                               for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")])
        np.testing.assert_array_equal(store.blob(il, e), want)


def test_expert_parts_that_break_aligned_loads_are_refused(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    s = mf.shape
    gate, up, down = s.layers[0].experts
    layers = list(s.layers)
    layers[0] = dataclasses.replace(layers[0], experts=(
        gate, dataclasses.replace(up, n_bytes=up.n_bytes + 8 * s.n_expert), down))
    bad = dataclasses.replace(s, layers=tuple(layers))
    with pytest.raises(ValueError, match="up matrix is .* not a multiple of 16"):
        blob_layout(bad, 0)
    assert CONFIG.n_layer == s.n_layer


@pytest.mark.parametrize("mix", ["Q4_K_M", "IQ_MIX"])
def test_the_fill_is_the_same_on_any_number_of_threads(tmp_models, mix, monkeypatch):
    from strata.experts import store as store_mod
    mf = open_model(model_path(tmp_models, mix))
    bufs, seen = [], []
    for n in (1, 3):
        monkeypatch.setattr(store_mod, "FILL_THREADS", n)
        s = build_store(mf, with_embd=True, progress=lambda d, t: seen.append((d, t)))
        bufs.append(s.buffer)
    # every byte written the same, the alignment pads (never written) aside
    for il in range(mf.shape.n_layer):
        for e in range(mf.shape.n_expert):
            off, n_bytes = int(s.host_off[il, e]), s.layouts[il].n_bytes
            np.testing.assert_array_equal(bufs[0][off:off + n_bytes], bufs[1][off:off + n_bytes])
    np.testing.assert_array_equal(bufs[0][s.embd_off:], bufs[1][s.embd_off:])
    assert all(a <= b for a, b in seen) and seen[-1][0] == seen[-1][1] == s.n_bytes


def test_a_fill_thread_count_below_one_is_refused(monkeypatch):
    from strata.experts import store as store_mod
    monkeypatch.setattr(store_mod, "FILL_THREADS", 0)
    with pytest.raises(ValueError, match="FILL_THREADS must be at least 1"):
        store_mod.fill_threads()
