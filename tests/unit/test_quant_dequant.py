"""`dequantize` of whole rows and tensors against gguf-py's dequantizer, and its input checks."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from helpers import ggufmake
from strata.gguf import ModelFileError, open_model
from strata.quant import dequant
from strata.quant.dequant import dequantize, dequantize_tensor
from strata.quant.random_blocks import random_blocks
from strata.quant.types import SUPPORTED_NAMES, quant_type

ALL = list(SUPPORTED_NAMES)
# Types gguf-py quantizes from values: real blocks, not only random ones.
QUANTIZABLE = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4"]


def reference(raw: np.ndarray, name: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gguf_quants.dequantize(raw, T[name]), dtype=np.float32)


def row_len(name: str) -> int:
    """A short row: two blocks of the format (two 256-value super-blocks for K/i-quants)."""
    return 2 * max(quant_type(name).block_size, 32)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("n_rows", [1, 3, 8])
def test_random_valid_rows_match_gguf(name, n_rows):
    q = quant_type(name)
    n = row_len(name)
    rng = np.random.default_rng(n_rows)
    raw = random_blocks(name, n_rows * n // q.block_size, rng).reshape(n_rows, q.row_bytes(n))
    got = dequantize(raw, name)
    assert got.shape == (n_rows, n) and got.dtype == np.float32
    np.testing.assert_array_equal(got, reference(raw, name))


@pytest.mark.parametrize("name", ALL)
def test_arbitrary_bits_match_gguf_flat(name):
    q = quant_type(name)
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, 7 * q.block_bytes * max(1, 32 // q.block_size), dtype=np.uint8)
    got = dequantize(raw, int(T[name]))
    assert got.ndim == 1
    np.testing.assert_array_equal(got, reference(raw, name).reshape(-1))


@pytest.mark.parametrize("name", QUANTIZABLE)
def test_blocks_quantized_by_gguf_match(name):
    rng = np.random.default_rng(11)
    values = (rng.standard_normal((4, 96)) * 0.1).astype(np.float32)  # [4, 96] f32
    raw = np.ascontiguousarray(gguf_quants.quantize(values, T[name])).view(np.uint8)
    got = dequantize(raw, name)
    np.testing.assert_array_equal(got, reference(raw, name))
    # and the quantization is faithful to the values, so the blocks are not degenerate
    assert np.abs(got - values).max() < 0.5 * np.abs(values).max()


@pytest.mark.parametrize("name", ["F16", "BF16", "F32"])
def test_float_rows_of_any_length(name):
    rng = np.random.default_rng(3)
    values = rng.standard_normal((5, 7)).astype(np.float32)  # 7: not a whole 32-value group
    raw = np.ascontiguousarray(gguf_quants.quantize(values, T[name])).view(np.uint8)
    got = dequantize(raw.reshape(-1), name, n_values_per_row=7)
    assert got.shape == (5, 7)
    np.testing.assert_array_equal(got, reference(raw, name))


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K", "F16"])
def test_large_input_split_over_threads_matches_gguf(name, monkeypatch):
    monkeypatch.setattr(dequant, "_CHUNK_VALUES", 1024)  # many chunks from a small input
    q = quant_type(name)
    n_values = 64 * 256 + (5 if name == "F16" else 0)  # F16: a tail short of a group too
    raw = random_blocks(name, n_values // q.block_size, np.random.default_rng(2)).reshape(-1)
    np.testing.assert_array_equal(dequantize(raw, name), reference(raw, name).reshape(-1))


def test_flat_input_with_row_length_and_read_only_input():
    raw = random_blocks("Q4_K", 6, np.random.default_rng(4)).reshape(-1)
    raw.setflags(write=False)  # like a view of a mapped file
    got = dequantize(raw, "Q4_K", n_values_per_row=512)
    assert got.shape == (3, 512)
    np.testing.assert_array_equal(got, reference(raw.reshape(3, -1), "Q4_K"))
    assert dequantize(raw[:0], "Q4_K").shape == (0,)


def test_non_contiguous_rows():
    raw = random_blocks("Q8_0", 8, np.random.default_rng(6)).reshape(4, 68)
    cols = raw[:, :34]  # every row's first block: a strided view
    np.testing.assert_array_equal(dequantize(cols, "Q8_0"), reference(np.ascontiguousarray(cols),
                                                                       "Q8_0"))


def test_bad_input_is_refused_with_the_type_and_sizes():
    ok = np.zeros(68, np.uint8)
    with pytest.raises(ValueError, match="unknown GGML tensor type 1234"):
        dequantize(ok, 1234)
    with pytest.raises(ValueError, match="Q8_K.*no Strata decoder"):
        dequantize(ok, "Q8_K")
    with pytest.raises(ValueError, match=r"Q8_0: 67 bytes are not a whole number of 34-byte"):
        dequantize(ok[:67], "Q8_0")
    with pytest.raises(ValueError, match=r"Q4_K: a row of 100 bytes is not a whole number of "
                                         r"144-byte blocks"):
        dequantize(np.zeros((2, 100), np.uint8), "Q4_K")
    with pytest.raises(ValueError, match=r"Q8_0: rows of 68 bytes hold 64 values, not "
                                         r"n_values_per_row=32"):
        dequantize(ok.reshape(1, 68), "Q8_0", n_values_per_row=32)
    with pytest.raises(ValueError, match=r"Q8_0: a row of 48 values is not a whole number"):
        dequantize(ok, "Q8_0", n_values_per_row=48)
    with pytest.raises(ValueError, match=r"Q8_0: 68 bytes are not a whole number of rows of 96"):
        dequantize(ok, "Q8_0", n_values_per_row=96)
    with pytest.raises(ValueError, match="raw must be a uint8 numpy array, got float32"):
        dequantize(np.zeros(17, np.float32), "Q8_0")
    with pytest.raises(ValueError, match=r"got shape \(1, 1, 68\)"):
        dequantize(ok.reshape(1, 1, 68), "Q8_0")


def test_dequantize_tensor_from_a_model_file(tmp_path):
    rng = np.random.default_rng(8)
    c = ggufmake.SMALL  # gate experts: numpy shape (n_expert, n_ff, n_embd) = (4, 32, 64)
    gate = random_blocks("Q8_0", 4 * 32 * 64 // 32, rng).reshape(4, 32, 2 * 34)
    down = random_blocks("IQ4_NL", 4 * 64 * 32 // 32, rng).reshape(4, 64, 18)
    path = ggufmake.write(tmp_path / "m.gguf", retype={
        "blk.0.ffn_gate_exps.weight": (T.Q8_0, gate),
        "blk.1.ffn_down_exps.weight": (T.IQ4_NL, down),
    })
    mf = open_model(path)
    got = dequantize_tensor(mf, "blk.0.ffn_gate_exps.weight")
    assert got.shape == (c["n_expert"], c["n_ff"], c["n_embd"])
    np.testing.assert_array_equal(got, reference(gate, "Q8_0"))
    got = dequantize_tensor(mf, "blk.1.ffn_down_exps.weight")
    np.testing.assert_array_equal(got, reference(down, "IQ4_NL"))
    norm = dequantize_tensor(mf, "output_norm.weight")
    np.testing.assert_array_equal(norm, mf.raw("output_norm.weight").view(np.float32))
    with pytest.raises(ModelFileError, match="no tensor named 'nope'"):
        dequantize_tensor(mf, "nope")
