"""write_model and `strata synth`: the files open as models with the intended tensor types and
metadata, header-only files are sparse and full-size, writes are atomic and reproducible, and
the command reports bad input with exit code 1 without importing numba."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from strata.cli.main import main
from strata.gguf import open_model
from strata.synth import MIXES, PRESETS, SynthError, default_model_path, write_model
from strata.synth import data as synth_data
from strata.synth import writer as synth_writer
from strata.synth.layout import tensor_specs
from strata.synth.metadata import KEY_EXPERT_RANK, KEY_ROUTING_DIMS, KEY_SKEW

TINY = PRESETS["tiny"]


def _field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    if len(f.data) == 1 and f.types[-1].name != "STRING":
        return f.parts[f.data[0]][0].item()
    if f.types[-1].name == "STRING":
        vals = [bytes(f.parts[i]).decode() for i in f.data]
        return vals if f.types[0].name == "ARRAY" else vals[0]
    return np.array([f.parts[i][0] for i in f.data])


@pytest.mark.parametrize("mix", MIXES)
def test_every_mix_opens_with_the_planned_types(tmp_path, mix):
    path = tmp_path / "m.gguf"
    report = write_model(path, TINY, mix=mix, seed=1, progress=False)
    m = open_model(path)
    assert report.file_bytes == path.stat().st_size == m.file_bytes
    assert (m.shape.n_layer, m.shape.n_vocab, m.shape.n_expert) == (4, 1152, 8)
    for s in tensor_specs(TINY, mix):
        assert m.type_name(s.name) == s.type_name, s.name
        assert m.tensors[s.name].np_shape == s.shape
    vals = np.concatenate([np.asarray(dequantize(m.raw(s.name), GGMLQuantizationType[
        s.type_name]), np.float64).ravel() for s in tensor_specs(TINY, mix)[:14]])
    assert np.isfinite(vals).all()


def test_metadata(tmp_path):
    path = tmp_path / "m.gguf"
    write_model(path, TINY.with_layers(2), mix="Q4_K_M", seed=3, skew=2.5, progress=False)
    r = GGUFReader(str(path))
    assert _field(r, "tokenizer.ggml.model") == "gpt2"
    assert _field(r, "tokenizer.ggml.pre") == "qwen2"
    assert len(_field(r, "tokenizer.ggml.tokens")) == 1152
    assert _field(r, "tokenizer.ggml.add_bos_token") is False
    assert "<|im_start|>" in _field(r, "tokenizer.chat_template")
    assert _field(r, "qwen3moe.block_count") == 2 and _field(r, "general.file_type") == 15
    assert abs(_field(r, "qwen3moe.rope.freq_base") - 1e6) < 1
    assert _field(r, KEY_SKEW) == 2.5
    assert sorted(_field(r, KEY_EXPERT_RANK)[:8]) == list(range(8))
    assert len(_field(r, KEY_EXPERT_RANK)) == 2 * 8


def test_routing_dims_are_never_written_by_layers(tmp_path):
    path = tmp_path / "m.gguf"
    write_model(path, TINY, mix="Q4_K_M", seed=2, skew=3, progress=False)
    m, r = open_model(path), GGUFReader(str(path))
    dims = _field(r, KEY_ROUTING_DIMS).astype(int)
    for name in ("blk.1.attn_output.weight", "blk.3.ffn_down_exps.weight"):
        t = m.tensors[name]
        w = np.asarray(dequantize(m.raw(name), GGMLQuantizationType(t.ggml_type))).reshape(
            t.np_shape)
        rows = w[..., dims, :]
        assert np.all(rows == 0) and np.abs(np.delete(w, dims, axis=-2)).max() > 0
    router = np.asarray(dequantize(m.raw("blk.0.ffn_gate_inp.weight"),
                                   GGMLQuantizationType.F32)).reshape(8, -1)
    assert np.all(np.delete(router, dims, axis=1) == 0) and np.all(router[:, dims] != 0)


def test_same_seed_same_bytes(tmp_path):
    a, b, c = (tmp_path / f"{n}.gguf" for n in "abc")
    for p, seed in ((a, 9), (b, 9), (c, 10)):
        write_model(p, TINY.with_layers(1), mix="IQ_MIX", seed=seed, skew=3, progress=False)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_periodic_sync_writes_the_same_bytes(tmp_path, monkeypatch):
    plain, synced = tmp_path / "plain.gguf", tmp_path / "synced.gguf"
    write_model(plain, TINY, mix="Q4_K_M", seed=2, progress=False)
    monkeypatch.setattr(synth_writer, "SYNC_BYTES", 1 << 20)  # sync + drop cache every MiB
    calls = []
    real = synth_writer._Sink._sync_and_drop
    monkeypatch.setattr(synth_writer._Sink, "_sync_and_drop",
                        lambda self: (calls.append(self.unsynced), real(self)))
    write_model(synced, TINY, mix="Q4_K_M", seed=2, progress=False)
    assert len(calls) >= 4 and plain.read_bytes() == synced.read_bytes()


def test_header_only_235b_is_sparse_and_full_size(tmp_path):
    path = tmp_path / "big.gguf"
    report = write_model(path, PRESETS["qwen3-235b-a22b"], mix="Q4_K_M", header_only=True,
                         progress=False)
    st = path.stat()
    assert st.st_size == report.file_bytes > 130e9
    assert st.st_blocks * 512 < 64e6 and report.bytes_written < 16e6
    m = open_model(path)
    assert (m.shape.n_layer, m.shape.n_expert, m.shape.n_ff_expert) == (94, 128, 1536)
    assert m.type_name("blk.0.ffn_down_exps.weight") == "Q6_K"


def test_failed_write_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"

    def boom(self, spec):
        raise RuntimeError("disk vanished")
        yield  # a generator, like the real one

    monkeypatch.setattr(synth_data.TensorData, "pieces", boom)
    with pytest.raises(RuntimeError, match="disk vanished"):
        write_model(path, TINY, progress=False)
    assert list(tmp_path.iterdir()) == []


def test_bad_paths(tmp_path):
    with pytest.raises(SynthError, match="does not exist"):
        write_model(tmp_path / "no" / "m.gguf", TINY, progress=False)
    with pytest.raises(SynthError, match="is a directory"):
        write_model(tmp_path, TINY, progress=False)
    with pytest.raises(SynthError, match="unknown quantization mix"):
        write_model(tmp_path / "m.gguf", TINY, mix="Q2_K", progress=False)


def test_default_model_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "linux")
    p = default_model_path(progress=False)
    assert p.parent == tmp_path / "strata" and p.is_file()
    assert open_model(p).type_name("blk.0.attn_q.weight") == "Q8_0"
    mtime = p.stat().st_mtime_ns
    assert default_model_path(progress=False) == p and p.stat().st_mtime_ns == mtime
    assert [x.name for x in p.parent.iterdir()] == [p.name]


def test_windows_cache_location(tmp_path, monkeypatch):
    from strata.synth.cache import cache_dir
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setenv("LOCALAPPDATA", str(tmp_path))
    assert cache_dir() == tmp_path / "strata" / "cache"


@pytest.mark.parametrize("argv, words, status", [
    # a bad flag: status 2, as argparse's own
    (["synth", "tiny-ish", "-o", "{out}"], "unknown preset 'tiny-ish'", 2),
    (["synth", "tiny", "-o", "{out}", "--quant", "Q5_K_M"], "unknown quantization mix", 2),
    (["synth", "tiny", "-o", "{out}", "--layers", "0"], "--layers must be between 1 and 4", 2),
    (["synth", "tiny", "-o", "{out}", "--layers", "5"], "--layers must be between 1 and 4", 2),
    (["synth", "tiny", "-o", "{out}", "--skew", "0.3"], "--skew must be between 1", 2),
    # a file that cannot be written: a failed run, 1
    (["synth", "tiny", "-o", "{tmp}/missing/x.gguf"], "does not exist", 1),
])
def test_cli_errors(tmp_path, capsys, argv, words, status):
    argv = [a.format(out=tmp_path / "x.gguf", tmp=tmp_path) for a in argv]
    assert main(argv) == status
    assert words in capsys.readouterr().err
    assert not (tmp_path / "x.gguf").exists()


def test_cli_unwritable_folder(tmp_path, capsys):
    if os.geteuid() == 0:  # root writes anywhere: use a path under a regular file instead
        (tmp_path / "f").write_bytes(b"")
        out = tmp_path / "f" / "x.gguf"
    else:
        os.chmod(tmp_path, 0o500)
        out = tmp_path / "x.gguf"
    try:
        assert main(["synth", "tiny", "-o", str(out), "--quiet"]) == 1
    finally:
        os.chmod(tmp_path, 0o700)
    assert "error: cannot write" in capsys.readouterr().err


def test_cli_writes_without_importing_numba(tmp_path):
    out = tmp_path / "x.gguf"
    code = ("import sys; from strata.cli.main import main; "
            f"rc = main(['synth', 'tiny', '-o', {str(out)!r}, '--layers', '2', '--quant', "
            "'IQ_MIX', '--skew', '3', '--quiet']); "
            "print(rc, 'numba' in sys.modules, any(m.startswith('numba') for m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.stdout.split() == ["0", "False", "False"], res.stderr
    assert "wrote" in res.stderr and open_model(out).shape.n_layer == 2
