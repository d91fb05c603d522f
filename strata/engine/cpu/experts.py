"""`CpuExperts`: the routed experts of any layer, computed on the CPU straight from the mapped
GGUF file. The CPU engine's MoE block, and the GPU engine's pool for experts missed in VRAM."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.engine.cpu import moe
from strata.engine.cpu.idot import x8_arrays
from strata.engine.cpu.matmul import n_chunks_for
from strata.engine.cpu.weights import QMatrix, qmatrix
from strata.gguf import ModelFile
from strata.gguf.arch.qwen3moe import EXPERT_NAMES


@dataclass(frozen=True, slots=True)
class LayerExperts:
    """The three stacked expert tensors of one layer."""

    gate: QMatrix  # [n_expert * n_ff, n_embd values]
    up: QMatrix
    down: QMatrix  # [n_expert * n_embd, n_ff values]

    @property
    def expert_bytes(self) -> int:
        """Bytes one expert reads (gate + up + down)."""
        return self.gate.expert_bytes + self.up.expert_bytes + self.down.expert_bytes


def group_pairs(ids: np.ndarray, weights: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group the routed (token, expert) pairs by expert.

    ids: int[n_tok, k], weights: float[n_tok, k]. Returns groups int64[2, n_groups + 1] (row 0:
    each group's expert, row 1: its first pair; the last column closes the last group),
    pair_tok int64[n_pairs], pair_w float32[n_pairs]."""
    flat = ids.reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")
    experts = flat[order]
    k = ids.shape[1]
    starts = np.flatnonzero(np.r_[True, experts[1:] != experts[:-1]])
    groups = np.empty((2, starts.size + 1), np.int64)
    groups[0, :-1] = experts[starts]
    groups[0, -1] = -1
    groups[1, :-1] = starts
    groups[1, -1] = flat.size
    pair_tok = (order // k).astype(np.int64)
    pair_w = np.ascontiguousarray(weights.reshape(-1)[order], dtype=np.float32)
    return groups, pair_tok, pair_w


class CpuExperts:
    """`cpu_experts(x, layer, expert_ids, weights) -> out`, reading the experts' quantized
    blocks in place (no dequantized copies): out = sum_j weights[j] * expert_{ids[j]}(x)."""

    def __init__(self, model: ModelFile):
        self.shape = model.shape
        self.layers = tuple(
            LayerExperts(*(qmatrix(model, f"blk.{il}.{n}.weight") for n in EXPERT_NAMES))
            for il in range(model.shape.n_layer))

    def __call__(self, x: np.ndarray, layer: int, expert_ids: np.ndarray,
                 weights: np.ndarray) -> np.ndarray:
        """x: float32[n_embd] (one token) or [n_tok, n_embd]; expert_ids: int[k] or [n_tok, k];
        weights: float32, the same shape. Returns float32 shaped like x."""
        x = np.asarray(x, dtype=np.float32)
        one = x.ndim == 1
        x2 = np.ascontiguousarray(x.reshape(1, -1) if one else x)
        ids = np.asarray(expert_ids).reshape(x2.shape[0], -1)
        w = np.asarray(weights, dtype=np.float32).reshape(ids.shape)
        self._check(x2, layer, ids)
        out = self.forward(x2, layer, ids, w)
        return out[0] if one else out

    def _check(self, x: np.ndarray, layer: int, ids: np.ndarray) -> None:
        s = self.shape
        if not 0 <= layer < s.n_layer:
            raise ValueError(f"layer {layer} out of range 0..{s.n_layer - 1}")
        if x.shape[1] != s.n_embd:
            raise ValueError(f"x has width {x.shape[1]}, the model's is {s.n_embd}")
        if ids.size and (ids.min() < 0 or ids.max() >= s.n_expert):
            raise ValueError(f"expert ids must be in 0..{s.n_expert - 1}, got "
                             f"{ids.min()}..{ids.max()}")

    def forward(self, x: np.ndarray, layer: int, ids: np.ndarray,
                weights: np.ndarray) -> np.ndarray:
        """The unchecked path the engine uses: x float32[n_tok, n_embd] C-contiguous, ids
        int[n_tok, k], weights float32[n_tok, k] -> float32[n_tok, n_embd]."""
        le = self.layers[layer]
        groups, pair_tok, pair_w = group_pairs(ids, weights)
        h = np.empty((pair_tok.size, self.shape.n_ff_expert), np.float32)  # [n_pairs, n_ff]
        g, u, d = le.gate, le.up, le.down
        moe.gate_up(g.rows, g.fmt, g.block_size, u.rows, u.fmt, u.block_size, groups, pair_tok,
                    x, x8_arrays(x), h, n_chunks_for(h.shape[1]))
        out = np.zeros_like(x)  # [n_tok, n_embd]
        moe.down(d.rows, d.fmt, d.block_size, groups, pair_tok, pair_w, h, x8_arrays(h), out,
                 n_chunks_for(out.shape[1]))
        return out

    def bytes_read(self, layer: int, ids: np.ndarray) -> int:
        """Quantized bytes a call with these ids reads: each distinct expert once."""
        return int(np.unique(np.asarray(ids)).size) * self.layers[layer].expert_bytes
