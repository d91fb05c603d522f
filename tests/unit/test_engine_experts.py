"""The CPU expert pool (`CpuExperts`, what the GPU engine calls for missed experts) against a
float64 SwiGLU computed from gguf-py's dequantization of the same stacked tensors (activations
into K-quant products rounded to 8 bits, as the engine documents); and a model whose output head
is tied to the embedding."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf.quants import dequantize
from helpers import reference as ref
from helpers import ties
from helpers.engine_models import PROMPT, model_path

from strata.engine.cpu import CpuEngine, CpuExperts
from strata.gguf import open_model


def _expert_ref(path, layer, x, ids, weights):
    t = {r.name: r for r in GGUFReader(str(path)).tensors
         if r.name.startswith(f"blk.{layer}.ffn_") and r.name.endswith("_exps.weight")}

    def mm(name, e, v):
        """Expert e's matrix times v, v rounded to 8 bits for K-quants as the engine does."""
        r = t[f"blk.{layer}.{name}.weight"]
        full = np.asarray(dequantize(r.data, r.tensor_type), np.float64)
        w = full.reshape(tuple(int(d) for d in reversed(r.shape)))[e]
        return w @ (ref.round_x8(v) if r.tensor_type in ref.X8_TYPES else v)

    out = np.zeros(x.shape)
    for i in range(x.shape[0]):
        for e, w in zip(ids[i], weights[i], strict=True):
            g = mm("ffn_gate_exps", e, x[i])
            u = mm("ffn_up_exps", e, x[i])
            out[i] += w * mm("ffn_down_exps", e, g / (1 + np.exp(-g)) * u)
    return out


@pytest.mark.parametrize("mix", ["Q4_K_M", "IQ_MIX"])
def test_pool_matches_float64_experts_for_one_and_many_tokens(tmp_models, mix):
    path = model_path(tmp_models, mix)
    pool = CpuExperts(open_model(path))
    rng = np.random.default_rng(2)
    n_embd = pool.shape.n_embd
    x = rng.standard_normal((4, n_embd)).astype(np.float32)
    # tokens share experts (7 and 2), so groups of several tokens take the decode-once path
    ids = np.array([[7, 2, 0], [2, 7, 9], [7, 3, 2], [5, 1, 4]])
    w = rng.dirichlet(np.ones(3), size=4).astype(np.float32)
    for layer in (0, 1):
        want = _expert_ref(path, layer, x.astype(np.float64), ids, w)
        many = pool(x, layer, ids, w)
        assert np.linalg.norm(many - want) / np.linalg.norm(want) < 1e-5
        one = pool(x[1], layer, ids[1], w[1])
        assert one.shape == (n_embd,)
        assert np.linalg.norm(one - want[1]) / np.linalg.norm(want[1]) < 1e-5


def test_pool_checks_its_arguments(tmp_models):
    pool = CpuExperts(open_model(model_path(tmp_models, "Q8_0")))
    x = np.zeros(pool.shape.n_embd, np.float32)
    w = np.ones(3, np.float32) / 3
    with pytest.raises(ValueError, match="layer 2 out of range 0..1"):
        pool(x, 2, [0, 1, 2], w)
    with pytest.raises(ValueError, match=r"expert ids must be in 0..9, got 0..10"):
        pool(x, 0, [0, 1, 10], w)
    with pytest.raises(ValueError, match="x has width 5, the model's is 768"):
        pool(np.zeros(5, np.float32), 0, [0, 1, 2], w)
    assert pool.bytes_read(0, [[1, 2, 3], [3, 2, 5]]) == 4 * pool.layers[0].expert_bytes


def _untie(src, dst):
    """A copy of `src` without output.weight: the head is then the embedding."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), "qwen3moe")
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture":
            continue
        w.add_key_value(f.name, f.contents(), f.types[0],
                        f.types[-1] if len(f.types) > 1 else None)
    for t in r.tensors:
        if t.name != "output.weight":
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_a_tied_head_reads_the_embedding(tmp_models, tmp_path):
    path = _untie(model_path(tmp_models, "Q4_K_M"), tmp_path / "tied.gguf")
    model = open_model(path)
    assert "output.weight" not in model.tensors
    seen = {}
    engine = CpuEngine(model, max_context=16)
    engine.cb = lambda name, layer, t: seen.__setitem__(name, np.array(t, np.float64))
    logits = engine.prefill(PROMPT)
    m = ref.RefModel.load(path, x8=True)
    rel = lambda a, b: np.linalg.norm(a - b) / np.linalg.norm(b)  # noqa: E731
    # The head alone, on the engine's own last hidden state: the embedding's rows times the
    # 8-bit activations, to f32 rounding.
    head = m.mm("token_embd", seen["result_norm"])[-1]
    assert rel(logits, head) < 1e-5, f"the tied head: {rel(logits, head):.2e}"
    # The whole model, near-ties of the rounding resolved either way (helpers.ties: CI met one
    # in blk.0 that alone moves these logits 1.75e-3)
    dist, _ = ties.x8_distance(logits, m, PROMPT)
    assert dist < 1e-5, f"the whole model: {dist:.2e}"
