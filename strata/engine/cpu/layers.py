"""`CpuModel` (the weights, shared read-only by every CPU engine of one file) and `CpuLayers`
(the forward's building blocks on numpy arrays, over one sequence's KV cache)."""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from strata.engine.cpu import attention as attn
from strata.engine.cpu import matmul, moe
from strata.engine.cpu.experts import CpuExperts
from strata.engine.cpu.idot import x8_arrays
from strata.engine.cpu.weights import QMatrix, qmatrix
from strata.gguf import ModelFile
from strata.kv import HostKVCache
from strata.quant.dequant import dequantize

# The per-block dense tensors (qwen3moe.DENSE_NAMES), split into vectors and matrices.
_NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")
_MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp")


class CpuModel:
    """A qwen3moe file mapped for the CPU: matrices stay quantized in the mapping, norm weights
    are decoded to float32 once, the experts are a `CpuExperts` (the CPU pool)."""

    def __init__(self, model: ModelFile):
        if model.arch != "qwen3moe":
            raise ValueError(f"{model.path}: the CPU engine runs qwen3moe, not {model.arch}")
        model.check_weights()  # a header-only file: refused before anything is mapped
        self.file = model
        self.shape = s = model.shape
        names = ["token_embd"] + [f"blk.{il}.{n}" for il in range(s.n_layer) for n in _MATRICES]
        self.matrices: dict[str, QMatrix] = {n: qmatrix(model, n + ".weight") for n in names}
        head = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"
        self.matrices["output"] = qmatrix(model, head)  # absent: tied to the embedding
        norms = ["output_norm"] + [f"blk.{il}.{n}" for il in range(s.n_layer) for n in _NORMS]
        self.norms: dict[str, np.ndarray] = {n: self._vector(n + ".weight") for n in norms}
        self.experts = CpuExperts(model)

    def _vector(self, name: str) -> np.ndarray:
        t = self.file.tensors[name]
        return np.ascontiguousarray(dequantize(self.file.raw(name), t.ggml_type).reshape(-1),
                                    dtype=np.float32)

    @property
    def dense_bytes_per_token(self) -> int:
        """Bytes of the matrices one decode step reads besides the experts (the head included,
        one embedding row)."""
        s = self.shape
        rows = self.matrices["token_embd"].rows
        per_layer = sum(self.matrices[f"blk.{il}.{n}"].n_bytes
                        for il in range(s.n_layer) for n in _MATRICES)
        return per_layer + self.matrices["output"].n_bytes + rows.shape[1]


class CpuLayers:
    """The forward's operations on the CPU (see `strata.engine.layers.Layers`). With
    `profile=True`, seconds per operation kind accumulate in `self.seconds`."""

    def __init__(self, model: CpuModel, kv: HostKVCache, *, profile: bool = False):
        self.model = model
        self.shape = model.shape
        self.kv = kv
        self.profile = profile
        self.seconds: dict[str, float] = defaultdict(float)
        self.expert_bytes = 0  # quantized expert bytes read (counted when profiling)

    def _timed(self, kind: str, t0: float) -> None:
        self.seconds[kind] += time.perf_counter() - t0

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        m = self.model.matrices["token_embd"]
        out = np.empty((tokens.size, m.n_in), np.float32)  # [n_tok, n_embd]
        matmul.gather_rows(m.rows, m.fmt, m.block_size, tokens, out)
        return out

    def rms_norm(self, x: np.ndarray, weight: str) -> np.ndarray:
        out = np.empty_like(x)
        attn.rms_norm(x, self.model.norms[weight], self.shape.rms_norm_eps, out)
        return out

    def linear(self, x: np.ndarray, weight: str) -> np.ndarray:
        t0 = time.perf_counter() if self.profile else 0.0
        m = self.model.matrices[weight]
        out = np.empty((x.shape[0], m.n_out), np.float32)  # [n_tok, n_out]
        matmul.linear(m.rows, m.fmt, m.block_size, x, x8_arrays(x), out,
                      matmul.n_chunks_for(m.n_out))
        if self.profile:
            self._timed("head" if weight == "output" else "dense", t0)
        return out

    def qk_norm_rope(self, q, k, layer, positions):
        s = self.shape
        b = f"blk.{layer}."
        cos, sin = attn.rope_tables(positions, s.head_dim, s.rope_freq_base)
        q3 = q.reshape(q.shape[0], s.n_head, s.head_dim)
        k3 = k.reshape(k.shape[0], s.n_head_kv, s.head_dim)
        attn.head_norm_rope(q3, self.model.norms[b + "attn_q_norm"], s.rms_norm_eps, cos, sin)
        attn.head_norm_rope(k3, self.model.norms[b + "attn_k_norm"], s.rms_norm_eps, cos, sin)
        return q3, k3

    def attention(self, q, k, v, layer, start):
        t0 = time.perf_counter() if self.profile else 0.0
        s = self.shape
        self.kv.store(layer, start, k, v.reshape(v.shape[0], s.n_head_kv, s.head_dim))
        out = np.empty_like(q)  # [n_tok, n_head, head_dim]
        attn.attention(q, self.kv.k[layer], self.kv.v[layer], start, out)
        if self.profile:
            self._timed("attention", t0)
        return out.reshape(q.shape[0], -1)

    def route(self, x, layer):
        logits = self.linear(x, f"blk.{layer}.ffn_gate_inp")  # [n_tok, n_expert]
        k = self.shape.n_expert_used
        ids = np.empty((x.shape[0], k), np.int64)
        weights = np.empty((x.shape[0], k), np.float32)
        moe.softmax_topk(logits, k, ids, weights)
        return logits, ids, weights

    def experts(self, x, layer, ids, weights):
        t0 = time.perf_counter() if self.profile else 0.0
        out = self.model.experts.forward(x, layer, ids, weights)
        if self.profile:
            self._timed("experts", t0)
            self.expert_bytes += self.model.experts.bytes_read(layer, ids)
        return out

    def add(self, a, b):
        a += b
        return a

    def last_row(self, x):
        return np.ascontiguousarray(x[-1:])

    def to_host(self, x):
        return x
