"""What a model file must be to run: not a directory, not header-only (`strata synth
--header-only`: no weights, planning only), no blocks past block_count; an unknown (zero)
training context defaults as `strata plan` reads it; a KV cache the machine cannot hold is
refused by its size; a synthetic expert ranking with ids out of range is refused by name."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from helpers import ggufmake
from helpers.engine_models import model_path
from strata.cli.main import main
from strata.gguf import ModelFileError, TensorError, open_model
from strata.gguf.header import Header
from strata.kv import HostKVCache, KVCacheError
from strata.kv import cache as kv_cache
from strata.synth import PRESETS, write_model


def _set_u32(path, key: str, value: int) -> None:
    """Overwrite one uint32 metadata value (or one array element, `key` = (name, index))."""
    name, index = key if isinstance(key, tuple) else (key, 0)
    at = Header(str(path)).fields[name].offset + 4 * index
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<I", value))


def test_a_directory_is_said_to_be_one(tmp_path):
    with pytest.raises(ModelFileError, match="is a directory, not a GGUF file"):
        open_model(tmp_path)
    with pytest.raises(ModelFileError, match="no such file"):
        open_model(tmp_path / "missing.gguf")


def test_tensors_past_block_count_are_refused(tmp_path):
    path = ggufmake.write(tmp_path / "m.gguf", n_layer=4)
    assert open_model(path).shape.n_layer == 4
    _set_u32(path, "qwen3moe.block_count", 2)
    with pytest.raises(TensorError, match=r"tensor 'blk\.2\.attn_norm\.weight' is in block 2, "
                                          r"but qwen3moe\.block_count is 2") as e:
        open_model(path)
    assert str(path) in str(e.value)


def test_header_only_files_are_for_planning_only(tmp_path):
    path = tmp_path / "hdr.gguf"
    write_model(path, PRESETS["tiny"], header_only=True, progress=False)
    mf = open_model(path)  # the header opens: `strata plan` prices it
    assert mf.header_only and mf.shape.n_layer == 4
    says = f"{path}: header-only: it has no weights; it is for `strata plan`"
    with pytest.raises(ModelFileError) as e:
        mf.check_weights()
    assert str(e.value) == says
    # the CPU engine's loader refuses it (generate, profile, bench and serve on the CPU)
    from strata.engine.cpu import CpuModel, engine_factory
    for load in (lambda: CpuModel(mf), lambda: engine_factory(mf)):
        with pytest.raises(ModelFileError) as e:
            load()
        assert str(e.value) == says
    # `strata serve` refuses it before any engine is built, whichever the backend
    from strata.serve.config import ServeConfig
    from strata.serve.server import load as serve_load
    for backend in ("cpu", "cuda"):
        with pytest.raises(ModelFileError) as e:
            serve_load(ServeConfig(model=str(path), backend=backend))
        assert str(e.value) == says
    # its bytes stay readable: the CUDA fit benchmarks run such files on purpose
    assert not mf.raw("blk.0.attn_q.weight").any()
    from strata.gguf.model_file import HEADER_ONLY_KEY
    from strata.synth.metadata import KEY_HEADER_ONLY
    assert HEADER_ONLY_KEY == KEY_HEADER_ONLY  # the key the synthesizer writes


def test_a_full_file_is_not_header_only(tmp_models):
    mf = open_model(model_path(tmp_models, "Q8_0"))
    assert not mf.header_only and mf.raw("output_norm.weight").size > 0


def test_an_unknown_training_context_defaults_as_plan_reads_it(tmp_path, tmp_models, capsys):
    """context_length 0: the CPU engine's default is the plan's unknown-context default, capped
    at the CPU's 4096, instead of a context of 0 refused by the engine."""
    from strata.engine.cpu import CpuEngine, CpuModel
    from strata.engine.cpu.engine import default_max_context

    path = tmp_path / "ctx0.gguf"
    path.write_bytes(model_path(tmp_models, "Q8_0").read_bytes())
    _set_u32(path, "qwen3moe.context_length", 0)
    mf = open_model(path)
    assert mf.shape.n_ctx_train == 0
    assert default_max_context(mf.shape) == 4096
    assert CpuEngine(CpuModel(mf)).max_context == 4096
    code = main(["generate", "-m", str(path), "--backend", "cpu", "--prompt-tokens", "1,2",
                 "-n", "1", "--json", "--temperature", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["stats"]["max_context"] == 4096
    from strata.engine import ContextFullError
    with pytest.raises(ContextFullError) as e:  # the file does not say what it was trained for
        CpuEngine(CpuModel(mf), max_context=2).prefill([1, 2, 3])
    assert str(e.value).endswith("but the context holds 2 (raise --max-context)"), str(e.value)


def test_the_kv_cache_is_refused_by_its_size(monkeypatch):
    monkeypatch.setattr(kv_cache, "host_memory_bytes", lambda: 1 << 30)
    with pytest.raises(KVCacheError) as e:
        HostKVCache(4, 1 << 20, 2, 128)  # 8 GiB of K and V
    assert str(e.value) == ("a KV cache of 1,048,576 positions needs 8.00 GiB of host memory; "
                            "this machine has 1.00 GiB (lower --max-context)")
    assert HostKVCache(4, 1024, 2, 128).n_bytes == 8 << 20  # what fits is allocated
    # where the machine's memory is not known, numpy's refusal is the same error
    monkeypatch.setattr(kv_cache, "host_memory_bytes", lambda: None)
    for n_ctx in (10 ** 12, 10 ** 17):  # past the address space; past numpy's largest array
        with pytest.raises(KVCacheError, match=f"a KV cache of {n_ctx:,} positions needs "):
            HostKVCache(4, n_ctx, 2, 128)


def test_host_memory_is_read_where_posix_says():
    have = kv_cache.host_memory_bytes()
    assert have is None or have > 1 << 20


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    path = tmp_path_factory.mktemp("rank") / "tiny.gguf"
    write_model(path, PRESETS["tiny"], skew=4.0, header_only=True, progress=False)
    return path


@pytest.mark.parametrize("value, says", [
    (99, "value 99 (layer 0, rank 3) is not an expert id 0..7"),
    (2 ** 32 - 1, "value 4294967295 (layer 0, rank 3) is not an expert id 0..7"),
])
def test_plan_refuses_expert_ranks_out_of_range(tmp_path, synthetic, capsys, value, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(synthetic.read_bytes())
    _set_u32(path, ("strata.synth.expert_rank", 3), value)
    code = main(["plan", "-m", str(path), "--gpu-mem", "8GiB"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert err.startswith("error: ") and f"strata.synth.expert_rank: {says}" in err, err


def test_expert_ranks_are_checked_before_use():
    from strata.plan.profile import RoutingProfile

    share = np.array([0.5, 0.3, 0.2])
    with pytest.raises(ValueError, match=r"^m\.gguf: strata\.synth\.expert_rank: value 3 "
                                         r"\(layer 1, rank 0\) is not an expert id 0\.\.2$"):
        RoutingProfile.from_rank(np.array([0, 1, 2, 3, 1, 0]), 2, 3, share, source="m.gguf")
    with pytest.raises(ValueError, match="layer 1 is not a permutation of 0..2"):
        RoutingProfile.from_rank(np.array([0, 1, 2, 1, 1, 0]), 2, 3, share)
    with pytest.raises(ValueError, match="expert ids must be integers"):
        RoutingProfile.from_rank(np.array([0.0, 1, 2, 2, 1, 0]), 2, 3)
    with pytest.raises(ValueError, match="5 values, expected"):
        RoutingProfile.from_rank(np.arange(5), 2, 3)
