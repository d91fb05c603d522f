"""The bytes of each tensor of a synthetic model, made piece by piece (a few MB at a time).

Kinds (see `layout`): the token embedding is designed floats encoded to its type (it carries the
routing direction), routers are fitted F32 matrices, norms are F32 gains, the head is random rows
for real tokens and one designed row repeated for the unused fillers, everything else is random
blocks cut from pools, with the rows of routing dimensions zeroed where asked.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import gguf
import numpy as np

from strata.synth import layout, routing
from strata.synth.blocks import BlockPool, pool_blocks_for
from strata.synth.config import SynthConfig
from strata.synth.encode import encode_rows

PIECE_BYTES = 8 << 20
EMBD_CHUNK_ROWS = 4096  # embedding rows made per piece; chunk 0 also calibrates the routers


def norm_values(seed: int, name: str, n: int) -> np.ndarray:
    """The F32 weights of norm tensor `name`: [n] float32, uniform in NORM_GAIN_RANGE."""
    lo, hi = layout.NORM_GAIN_RANGE
    return routing.rng_for(seed, "norm", name).uniform(lo, hi, n).astype(np.float32)


def _workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


class TensorData:
    """Makes every tensor's bytes for one model; `pieces(spec)` yields them in order."""

    def __init__(self, cfg: SynthConfig, specs: list[layout.TensorSpec], seed: int,
                 rd: routing.RoutingDesign, n_real: int):
        self.cfg, self.seed, self.rd, self.n_real = cfg, seed, rd, n_real
        self.pools: dict[tuple[str, float], BlockPool] = {}
        self.largest: dict[tuple[str, float], int] = {}
        for s in specs:
            if s.kind in (layout.RANDOM, layout.HEAD):
                key = (s.type_name, s.std)
                self.largest[key] = max(self.largest.get(key, 0), s.n_bytes)
        self.embd = next(s for s in specs if s.kind == layout.EMBED)
        self.routing_mask = np.zeros(cfg.n_embd, bool)
        self.routing_mask[rd.dims] = True
        self._chunk0: np.ndarray | None = None
        self._sample: np.ndarray | None = None
        self._basis: np.ndarray | None = None
        self._bias: np.ndarray | None = None

    def pieces(self, spec: layout.TensorSpec) -> Iterator[np.ndarray]:
        """The tensor's bytes in file order, a few MB per piece (uint8 or float32 arrays)."""
        if spec.kind == layout.EMBED:
            yield from self._embedding()
        elif spec.kind == layout.ROUTER:
            yield self._router(spec.layer)
        elif spec.kind == layout.NORM:
            yield norm_values(self.seed, spec.name, spec.shape[0])
        elif spec.kind == layout.HEAD:
            yield from self._random(spec, stop=self.n_real)
            yield from self._filler_rows(spec)
        else:
            yield from self._random(spec)

    # -- token embedding -------------------------------------------------------------------

    def _embd_chunk(self, c: int) -> np.ndarray:
        """Rows [c*EMBD_CHUNK_ROWS, ...) of the embedding, encoded: [rows, row_bytes] uint8."""
        if c == 0 and self._chunk0 is not None:
            return self._chunk0
        lo = c * EMBD_CHUNK_ROWS
        rows = np.arange(lo, min(lo + EMBD_CHUNK_ROWS, self.cfg.n_vocab))
        x = routing.embedding_rows(self.rd, self.cfg, rows, routing.rng_for(self.seed, "embd", c))
        data = encode_rows(x, self.embd.type_name)
        if c == 0:
            self._chunk0 = data
        return data

    def _embedding(self) -> Iterator[np.ndarray]:
        """Chunks made on worker threads (numpy releases the GIL), yielded in order, with at
        most twice the workers in flight so memory stays bounded."""
        n_chunks = -(-self.cfg.n_vocab // EMBD_CHUNK_ROWS)
        with ThreadPoolExecutor(_workers()) as ex:
            todo, running = iter(range(n_chunks)), deque()
            for c in todo:
                running.append(ex.submit(self._embd_chunk, c))
                if len(running) >= 2 * _workers():
                    break
            while running:
                yield running.popleft().result()
                c = next(todo, None)
                if c is not None:
                    running.append(ex.submit(self._embd_chunk, c))

    def calibration_sample(self) -> np.ndarray:
        """Routing dims of the first embedding rows as stored: [n, n_dims] float64."""
        if self._sample is None:
            raw = self._embd_chunk(0)
            vals = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[self.embd.type_name])
            vals = np.asarray(vals, np.float64).reshape(len(raw), -1)
            self._sample = vals[:, self.rd.dims]
        return self._sample

    # -- routers, random weights -------------------------------------------------------------

    def _router(self, layer: int) -> np.ndarray:
        if self._basis is None:
            self._basis = routing.noise_basis(self.rd.direction,
                                              routing.rng_for(self.seed, "noise-basis"))
        w = routing.noise_directions(self._basis, self.cfg.n_expert,
                                     routing.rng_for(self.seed, "router", layer))
        self._bias = routing.fit_layer(self.rd, self.calibration_sample(), w,
                                       self.cfg.n_expert_used, start=self._bias)
        gain = norm_values(self.seed, f"blk.{layer}.ffn_norm.weight", self.cfg.n_embd)
        return routing.router_matrix(self.rd, self.cfg, layer, w, self._bias, gain)

    def _pool(self, spec: layout.TensorSpec) -> BlockPool:
        key = (spec.type_name, spec.std)
        if key not in self.pools:
            n = pool_blocks_for(spec.type_name, self.largest[key])
            rng = routing.rng_for(self.seed, "pool", spec.type_name, f"{spec.std:.9g}")
            self.pools[key] = BlockPool(spec.type_name, spec.std, n, rng)
        return self.pools[key]

    def _random(self, spec: layout.TensorSpec, stop: int | None = None) -> Iterator[np.ndarray]:
        """Rows [0, stop) of `spec` (all by default) as windows of its pool."""
        stop = spec.n_rows if stop is None else stop
        pool = self._pool(spec)
        blocks_per_row = spec.row_bytes // pool.blocks.shape[1]
        rows_per_piece = max(1, min(PIECE_BYTES // spec.row_bytes,
                                    pool.n_blocks // blocks_per_row))
        for r0 in range(0, stop, rows_per_piece):
            n = min(rows_per_piece, stop - r0)
            piece = pool.window(n * blocks_per_row).reshape(n, spec.row_bytes)
            if spec.zero_routing_rows:
                out_dim = (r0 + np.arange(n)) % self.cfg.n_embd
                piece = piece.copy()
                piece[self.routing_mask[out_dim]] = 0
            yield piece

    def _filler_rows(self, spec: layout.TensorSpec) -> Iterator[np.ndarray]:
        """Head rows of the unused filler tokens: all one row, minus the routing direction (which
        every hidden state carries, see `routing`), so their logits sit near FILLER_LOGIT."""
        n_fill = spec.n_rows - self.n_real
        n_dims = len(self.rd.dims)
        along = routing.AMPLITUDE * np.sqrt(n_dims)  # a hidden state's share of the direction
        push = layout.FILLER_LOGIT * layout.final_rms(self.cfg, n_dims, routing.AMPLITUDE) / along
        gain = norm_values(self.seed, "output_norm.weight", self.cfg.n_embd)[self.rd.dims]
        row = np.zeros((1, self.cfg.n_embd), np.float32)
        row[0, self.rd.dims] = push * self.rd.direction / gain
        one = encode_rows(row, spec.type_name)  # [1, row_bytes]
        per_piece = max(1, min(n_fill, PIECE_BYTES // spec.row_bytes))
        piece = np.repeat(one, per_piece, axis=0)
        for r0 in range(0, n_fill, per_piece):
            yield piece[:min(per_piece, n_fill - r0)]
