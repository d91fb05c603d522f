"""The model file: shape from the header, byte table, and a clear error for each bad input."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from helpers import ggufmake
from strata.gguf import (
    MissingKeyError, NotGGUFError, TensorError, TruncatedError, UnknownArchitectureError,
    UnsupportedQuantError, open_model,
)


def test_shape_and_byte_table(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf")
    mf = open_model(path)
    s = mf.shape
    c = ggufmake.SMALL
    assert (s.n_layer, s.n_embd, s.n_head, s.n_head_kv, s.head_dim) == (2, 64, 4, 2, 16)
    assert (s.n_expert, s.n_expert_used, s.n_ff_expert, s.n_vocab) == (4, 2, 32, 50)
    # F32 everywhere: one expert = gate + up + down = 3 * n_ff * n_embd * 4 bytes
    assert s.expert_slot_bytes(0) == 3 * c["n_ff"] * c["n_embd"] * 4
    assert s.expert_bytes_total == s.n_layer * s.n_expert * s.expert_slot_bytes(0)
    # the byte table accounts for every tensor exactly once
    total = sum(t.n_bytes for t in s.global_tensors) + s.dense_bytes() + s.expert_bytes_total
    assert total == sum(t.n_bytes for t in mf.tensors.values())
    # raw bytes are the tensor's values
    want = gguf.GGUFReader(path).tensors[0]
    got = mf.raw(want.name).view(np.float32).reshape(want.data.shape)
    np.testing.assert_array_equal(got, want.data)
    # one expert's slice of a stacked tensor
    full = mf.raw("blk.1.ffn_up_exps.weight").view(np.float32).reshape(4, 32, 64)
    np.testing.assert_array_equal(mf.expert_raw("blk.1.ffn_up_exps.weight", 2).view(np.float32),
                                  full[2])


def test_not_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(NotGGUFError, match="not a GGUF"):
        open_model(p)


def test_missing_file(tmp_path):
    with pytest.raises(Exception, match="no such file"):
        open_model(tmp_path / "nope.gguf")


def test_truncated_data(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf")
    os.truncate(path, os.path.getsize(path) - 1000)
    with pytest.raises(TruncatedError, match="truncated"):
        open_model(path)


def test_truncated_header(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf")
    os.truncate(path, 300)
    with pytest.raises(TruncatedError, match="header"):
        open_model(path)


def test_unknown_architecture(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", arch="llama")
    with pytest.raises(UnknownArchitectureError, match="'llama'"):
        open_model(path)


def test_missing_key(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", drop_keys=("expert_count",))
    with pytest.raises(MissingKeyError, match="qwen3moe.expert_count"):
        open_model(path)


def test_shape_disagrees_with_metadata(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", reshape={"blk.1.attn_k.weight": (48, 64)})
    with pytest.raises(TensorError, match=r"blk\.1\.attn_k\.weight.*\[64, 48\].*\[64, 32\]"):
        open_model(path)


def test_missing_tensor(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", drop_tensors=("blk.0.ffn_down_exps.weight",))
    with pytest.raises(TensorError, match="missing tensor 'blk.0.ffn_down_exps.weight'"):
        open_model(path)


def test_unsupported_quant(tmp_path):
    T = gguf.GGMLQuantizationType
    # a Q8_K tensor (a type llama.cpp uses for activations, not a storage format Strata reads)
    raw = np.zeros((1, 292), dtype=np.uint8)
    path = ggufmake.write(tmp_path / "m.gguf", n_embd=256, head_dim=64,
                          retype={"output_norm.weight": (T.Q8_K, raw)})
    with pytest.raises(UnsupportedQuantError, match="output_norm.weight.*Q8_K"):
        open_model(path)


def test_no_output_head_means_tied(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", drop_tensors=("output.weight",))
    s = open_model(path).shape
    assert [t.name for t in s.global_tensors] == ["token_embd.weight", "output_norm.weight"]


def test_header_values_match_gguf_py(tmp_path):
    """The fast header reader decodes every value type as gguf-py's reader does."""
    from strata.gguf.metadata import Metadata

    path = str(tmp_path / "kv.gguf")
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_uint8("t.u8", 200); w.add_int8("t.i8", -5); w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000); w.add_uint32("t.u32", 4_000_000_000); w.add_int32("t.i32", -7)
    w.add_uint64("t.u64", 2**40); w.add_int64("t.i64", -(2**40)); w.add_float32("t.f32", 1.5)
    w.add_float64("t.f64", -2.25); w.add_bool("t.b", True); w.add_string("t.s", "héllo ✓")
    w.add_array("t.as", ["a", "", "ü" * 3, "z" * 300])
    w.add_array("t.ai", [1, -2, 3]); w.add_array("t.af", [0.5, 1.5]); w.add_array("t.ab", [True, False])
    w.add_array("t.empty", [])
    w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
    meta = Metadata.read(path)
    ref = gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        got = meta.value(key)
        want = field.contents()
        if isinstance(got, np.ndarray):
            np.testing.assert_array_equal(got, np.asarray(want, dtype=got.dtype), err_msg=key)
        elif isinstance(want, float):
            assert got == pytest.approx(want), key
        else:
            assert got == want, key
    assert meta.int("t.u32") == 4_000_000_000 and meta.str("t.s") == "héllo ✓"
    with pytest.raises(MissingKeyError, match="t.s.*should be an integer"):
        meta.int("t.s")


def test_header_records_a_vocabulary_without_decoding_it(tmp_path):
    """Opening skips over the vocabulary's strings; they are decoded only when asked for."""
    from strata.gguf.metadata import Metadata

    path = str(tmp_path / "v.gguf")
    w = gguf.GGUFWriter(path, "qwen3moe")
    w.add_token_list([f"tok{i}" for i in range(150_000)])
    w.add_uint32("after.vocab", 7)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.close()
    meta = Metadata.read(path)
    assert meta._fields["tokenizer.ggml.tokens"].count == 150_000
    assert not meta._cache  # nothing decoded yet
    assert meta.int("after.vocab") == 7  # the walk found the field behind the strings
    assert meta.value("tokenizer.ggml.tokens")[149_999] == "tok149999"
