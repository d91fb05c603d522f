"""The prompt path: chunks of the plan's size through every layer on the GPU.

Per chunk and layer: dense projections and causal attention (tensor-core GEMMs over f16
activations, KV written at the device sequence length); the router's top-k grouped by expert on
the device; the grouping's counts read back (a host sync), which splits the layer's used experts
into resident ones (computed in place from their cache slots) and the rest, streamed through the
ring: host->VRAM copies on the copy stream, ordered by events, while the compute stream works on
what is already there. For a chunk large enough that a layer uses most of its experts, the next
layer's non-resident experts are staged before this layer's MoE runs, so their copies overlap its
compute. A layer with more streamed experts than ring slots runs in waves (each wave's entries
selected by `mask_ids`, half the ring loading while half computes).

The counts decide nothing when every expert of the layer is already in VRAM: all held (cache
slots, a split stage's helper tiers) or the rest all staged by that prefetch (`counts_can_wait`).
Such a layer points every expert (the device's grouping gives the unused ones no tiles) and runs
without the sync; its counts go to pinned host memory asynchronously, and its bookkeeping (the
prompt's traffic, the adaptive cache's counts) is done in layer order at the next sync — a later
layer's, or the one at the chunk's end. `sync_every_layer` (CudaOptions.prefill_sync_every_layer)
keeps the sync on every layer, for A/B runs.

Borrowed prompt paths: the plan's loan is taken from the expert cache first (its experts become
misses on the device table before any prompt buffer is written), the buffers and the ring are
carved in the lent slots, and the cache is refilled when the prompt is done. Every prompt use
passes the plan's runtime contract first.

Scratch: the engine keeps its few prompt-time arrays (positions, the wave's ids, the experts'
weight offsets, a zero offset) in the prompt layout's `gathered` region, which the grouped GEMMs
do not use (they gather the activation rows themselves).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from strata.cuda_kernels.attention_prefill import prefill_attention
from strata.cuda_kernels.elementwise import add, embed
from strata.cuda_kernels.kvcache import KvSide, advance_seq_len, kv_write
from strata.cuda_kernels.matmul import QuantWeights, dense_matmul, moe_down, moe_gate_up
from strata.cuda_kernels.matmul_tiles import SMALL_TC_TILE, TC_TILE, takes_small_tile
from strata.cuda_kernels.matvec import matvec
from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm
from strata.cuda_kernels.ring import ExpertRing
from strata.cuda_kernels.route import Routing, combine, max_tiles, route_tokens
from strata.cuda_kernels.router import route
from strata.engine.cuda.kernels import fill_positions, mask_ids, rms_norm_f16
from strata.engine.cuda.mixed import gate_up_unfused
from strata.engine.cuda.model import CudaModel
from strata.experts import PrefillTraffic
from strata.plan.layout import ROUTE_TILE_ROWS, ring_slot_bytes

PREFETCH_ENTRIES_PER_EXPERT = 2  # chunk * k >= this * n_expert: stage the next layer ahead
# Layers without the sync let the host run ahead of the GPU; it waits (on an event) for the layer
# this many back before it queues the next, so the driver's launch queue never fills: a launch
# that finds it full blocks until the GPU has drained a good part of it, and the GPU can sit idle
# before the host's next launch arrives. Four layers (about 80 launches) keep the GPU fed.
LAYERS_AHEAD = 4


def counts_can_wait(held: np.ndarray, staged: Collection[int]) -> bool:
    """Whether a layer's MoE can run before its grouping's counts reach the host: every expert
    outside `held` ([n_expert] bool) is in `staged` (experts whose ring copies are enqueued), and
    nothing else is."""
    outside = np.flatnonzero(~np.asarray(held, bool))
    return len(outside) == len(staged) and all(int(e) in staged for e in outside)


@dataclass(slots=True)
class Scratch:
    """The engine's prompt-time arrays, carved from `gathered`."""

    pos: Any  # [chunk] i32
    ids: Any  # [chunk * k] i32, one wave's entries
    wave_of: Any  # [n_expert] i32
    base: Any  # [3, n_expert] i64: gate, up, down byte offsets in the arena
    zero: Any  # [1] i64


class PromptRun:
    """One prompt's buffers, ring and per-layer MoE placement."""

    def __init__(self, m: CudaModel, P: dict[str, Any], R: dict[str, Any], chunk: int,
                 traffic: PrefillTraffic, *, sync_every_layer: bool | None = None):
        """`sync_every_layer`: read every layer's counts back before its MoE (the path before
        `counts_can_wait`); None takes the model options' `prefill_sync_every_layer`."""
        self.m, self.P, self.chunk, self.traffic = m, P, chunk, traffic
        self.sync_every_layer = (m.options.prefill_sync_every_layer if sync_every_layer is None
                                 else bool(sync_every_layer))
        s = m.shape
        self.k, self.n_expert = s.n_expert_used, s.n_expert
        if TC_TILE.bm < ROUTE_TILE_ROWS:  # the plan sized the tile schedule for its row tiles
            raise RuntimeError(f"the grouped GEMM's {TC_TILE.bm}-row tiles need a longer tile "
                               f"schedule than the plan's {ROUTE_TILE_ROWS}-row bound")
        self.scr = self._carve_scratch()
        self.ring = None
        if "slots" in R:
            slot_bytes = ring_slot_bytes(s)
            flat = R["slots"].reshape(-1)
            self.ring = ExpertRing(flat, slot_bytes, m.copy_stream, ops=m.ring_ops)
            self.ring_base = m.arena_offset(flat) + m.window_shift
            ev = cuda.event()  # the ring's first copies must follow whatever read those bytes
            ev.record(m.stream)
            ev.wait(m.copy_stream)
        self.arena_u8 = m.expert_window  # the arena, or a split stage's window over its tiers
        self.host_counts = np.zeros(self.n_expert + 1, np.int32)
        # the model's pinned rows for layers that run without the sync (`prompt_host_rows`)
        self.late_counts, self.late_base = (None, None) if self.sync_every_layer else \
            m.prompt_host_rows()
        self.pending: list[tuple[int, np.ndarray]] = []  # (layer, held) awaiting their counts
        self.host_base = np.zeros((3, self.n_expert), np.int64)  # [3, n_expert] i64
        self.staged: dict[int, Any] = {}  # expert -> ring slot, for the layer being prepared
        self.staged_layer = -1
        self.dense = self._dense_weights()
        self.layer_done = [cuda.event() for _ in range(LAYERS_AHEAD)]
        self._views: dict[tuple, Any] = {}  # (what, n) -> the device view `_view` made

    def _view(self, key: tuple, make):
        """A device-array view made once a prompt: every layer of a chunk takes the same views,
        and each numba slice or reshape costs ~10-30 us of host time (its context checks and
        layout arithmetic), ~1,100 of them a chunk before (2026-12-03 host profile)."""
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = make()
        return v

    def _rows(self, name: str, n: int):
        """P[name][:n], made once a prompt."""
        return self._view(("rows", name, n), lambda: self.P[name][:n])

    def _carve_scratch(self) -> Scratch:
        m, c, n_e = self.m, self.chunk, self.n_expert
        off = m.arena_offset(self.P["gathered"])
        fields = (("pos", "int32", (c,)), ("ids", "int32", (c * self.k,)),
                  ("wave_of", "int32", (n_e,)), ("base", "int64", (3, n_e)),
                  ("zero", "int64", (1,)))
        out, pos = {}, 0
        for name, dt, shape in fields:
            out[name] = m._raw(off + pos, dt, shape)
            pos += -(-int(np.prod(shape)) * np.dtype(dt).itemsize // 256) * 256
        if pos > self.P["gathered"].size * 2:
            raise RuntimeError("the prompt scratch does not fit in the gathered region")
        out["zero"].copy_to_device(np.zeros(1, np.int64), stream=m.stream)
        return Scratch(**out)

    def _dense_weights(self) -> dict[str, QuantWeights]:
        out = {}
        for name, w in self.m.matrices.items():
            if name == "output":
                continue
            out[name] = QuantWeights(w.data, self.scr.zero, w.ggml_type, w.n_rows, w.n_cols)
        return out

    # -- a chunk ---------------------------------------------------------------------------------

    def chunk_step(self, ids: np.ndarray, start: int) -> None:
        """Run tokens `ids` at positions start.. ; the last token's logits land in the session's
        logits buffer and seq_len advances by len(ids)."""
        m, s, P, st = self.m, self.m.shape, self.P, self.m.stream
        a = m.acts
        n = int(ids.size)
        history = a["history"][0]
        history[start:start + n].copy_to_device(ids.astype(np.int32), stream=st)
        x = P["hidden"][:n]
        lo, hi = m.layers  # a split's later stage finds the previous stage's hidden state in x
        if lo == 0:
            embed(m.embd_table, m.embd_type, history, a["seq_len"], x, stream=st)
        for il in range(lo, hi):
            done = self.layer_done[(il - lo) % LAYERS_AHEAD]
            if il - lo >= LAYERS_AHEAD:
                done.synchronize()  # layer il - LAYERS_AHEAD has run: the queue holds the rest
            self._attention(il, n, x, start)
            self._moe(il, n, x)
            done.record(st)
        if hi == s.n_layer:
            rms_norm(P["hidden"][n - 1:n], m.norms["output_norm"], a["normed"],
                     eps=s.rms_norm_eps, stream=st)
            head = m.matrices["output"]
            matvec(head.data, head.ggml_type, a["normed"].reshape(s.n_embd), a["logits"][0],
                   stream=st)
        advance_seq_len(a["seq_len"], n, stream=st)
        if self.pending:  # the bookkeeping of layers that ran without a sync
            st.synchronize()
            self._settle()
        self.traffic.n_chunks += 1

    def _attention(self, il: int, n: int, x, start: int) -> None:
        m, s, st = self.m, self.m.shape, self.m.stream
        a, b, eps = m.acts, f"blk.{il}.", s.rms_norm_eps
        rows = self._rows
        x16 = rows("normed", n)
        rms_norm_f16(x, m.norms[b + "attn_norm"], x16, eps=eps, stream=st)
        q, k, v = rows("q", n), rows("k", n), rows("v", n)
        for name, out in (("attn_q", q), ("attn_k", k), ("attn_v", v)):
            dense_matmul(x16, self.dense[b + name], out, stream=st)
        pos = self._view(("pos", n), lambda: self.scr.pos[:n])
        fill_positions(pos, a["seq_len"], stream=st)
        qk_norm_rope(q, k, pos, n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim,
                     theta=s.rope_freq_base, q_norm_w=m.norms[b + "attn_q_norm"],
                     k_norm_w=m.norms[b + "attn_k_norm"], eps=eps, stream=st)
        k_side, v_side = m.kv_sides[il]
        staged = m.kv_map is not None and start + n > m.plan.kv.resident_tokens
        if staged:  # keys in host memory: attend over a VRAM copy of the layer
            stage = self._stage_layer(il, start)
            k_side, v_side = stage
        heads = self._view(("heads", n), lambda: (
            k.reshape(n, s.n_head_kv, s.head_dim), v.reshape(n, s.n_head_kv, s.head_dim),
            q.reshape(n, s.n_head, s.head_dim)))
        kv_write(heads[0], k_side, a["seq_len"], stream=st)
        kv_write(heads[1], v_side, a["seq_len"], stream=st)
        att, att_heads = self._view(("att", n), lambda: self._attention_out(n))
        prefill_attention(heads[2], k_side, v_side, a["seq_len"], att_heads,
                          variant=m.options.prefill_attention, stream=st)
        if staged:  # the chunk's new rows back to where the layer keeps them
            self._unstage_layer(il, stage, start, n)
        tmp = rows("expert_out", n)  # [n, n_embd] f32: free until the MoE's down projection
        dense_matmul(att, self.dense[b + "attn_output"], tmp, stream=st)
        add(x, tmp, x, stream=st)
        rms_norm_f16(x, m.norms[b + "ffn_norm"], x16, eps=eps, stream=st)
        logits = rows("router_logits", n)
        dense_matmul(x16, self.dense[b + "ffn_gate_inp"], logits, stream=st)
        route(logits, rows("topk_ids", n), rows("topk_weights", n), norm_topk=True, stream=st)

    def _stage_sides(self, il: int):
        """The prompt path's VRAM copy of layer il's K and V (`kv_stage`, [2, ctx, H * row]
        uint8), as cache sides with the layer's own int8 scales (those stay in VRAM)."""
        data = self._view(("kv_stage",), lambda: [self.P["kv_stage"][j].reshape(-1)
                                                  for j in range(2)])  # once a prompt
        return tuple(KvSide(side.layout, data[j], side.scale)
                     for j, side in enumerate(self.m.kv_sides[il]))

    def _stage_layer(self, il: int, start: int):
        """Streamed KV: rows 0 .. start of layer il (VRAM rows, then host rows over PCIe) copied
        into the stage, on the compute stream (the previous layer's attention is done with
        it). Returns the stage's sides, where the chunk's rows are written next."""
        st, stage = self.m.stream, self._stage_sides(il)
        n_bytes = start * self.m.kv_layout.token_rows_bytes
        if n_bytes:
            for src, dst in zip(self.m.kv_sides[il], stage):
                dst.data[:n_bytes].copy_to_device(src.data[:n_bytes], stream=st)
        self.traffic.kv_staged_bytes += 2 * n_bytes
        return stage

    def _unstage_layer(self, il: int, stage, start: int, n: int) -> None:
        """The chunk's rows start .. start + n of layer il from its stage sides to the mapped
        sides."""
        st, row = self.m.stream, self.m.kv_layout.token_rows_bytes
        a, b = start * row, (start + n) * row
        for dst, src in zip(self.m.kv_sides[il], stage):
            dst.data[a:b].copy_to_device(src.data[a:b], stream=st)

    def _attention_out(self, n: int):
        """The attention's output twice: as the output projection reads it, and as the
        attention kernel writes it ([n, n_head, head_dim], the same memory). The GQA kernel
        writes it as f16 into the front of the f32 `attn_out` region ([n, n_head * head_dim]
        f16), so the projection takes the f16-input GEMM (cp.async-pipelined activations; the
        f32-input one rounds to the same f16 values, but stages them by hand: 0.90 against 0.51
        ms a layer at 4,096 tokens); the base kernel writes f32."""
        s, region = self.m.shape, self.P["attn_out"]
        cols = s.n_head * s.head_dim
        if self.m.options.prefill_attention != "gqa":
            out = region[:n]
        else:
            flat = region.reshape(region.shape[0] * cols).view(np.float16)  # twice the values
            out = flat[:n * cols].reshape(n, cols)
        return out, out.reshape(n, s.n_head, s.head_dim)

    # -- the MoE of one layer ----------------------------------------------------------------------

    def _grouped_tile(self, n: int):
        """The grouped GEMMs' tile for an n-token chunk: SMALL_TC_TILE where the options ask for
        it, the experts get a few rows each and its longer tile schedule fits the plan's
        buffers; else None (each format's default)."""
        ne = n * self.k
        if (self.m.options.prefill_small_tiles and takes_small_tile(ne, self.n_expert)
                and max_tiles(ne, self.n_expert, SMALL_TC_TILE.bm) <= self.P["tile_group"].size):
            return SMALL_TC_TILE
        return None

    def _routing(self, n: int, ids) -> Routing:
        P, ne = self.P, n * self.k
        r = self._view(("routing", n), lambda: Routing(
            n, self.k, self.n_expert, (self._grouped_tile(n) or TC_TILE).bm,
            counts=P["expert_counts"],
            offsets=P["expert_offsets"], cursor=P["expert_cursor"], perm=P["perm_ids"][:ne],
            inv=P["inv_ids"][:ne], tile_group=P["tile_group"], tile_m0=P["tile_m0"],
            n_tiles=P["n_tiles"]))
        return route_tokens(ids, r, stream=self.m.stream)

    def _moe(self, il: int, n: int, x) -> None:
        routing = self._routing(n, self._rows("topk_ids", n))
        held = self.m.held(il)  # cache slots and (a split stage's) helper tiers
        staged = self.staged if self.staged_layer == il else {}
        if not self.sync_every_layer and counts_can_wait(held, staged):
            self._moe_in_vram(il, n, x, routing, held)
        else:
            self._moe_synced(il, n, x, routing, held)
        self._prefetch(il + 1, n)

    def _moe_in_vram(self, il: int, n: int, x, routing: Routing, held: np.ndarray) -> None:
        """Every expert of the layer held or staged: all pointed, the counts read back later."""
        m = self.m
        routing.counts.copy_to_host(self.late_counts[il - m.layers[0]], stream=m.stream)
        self.pending.append((il, held))
        in_vram = np.flatnonzero(held)
        self._point(il, in_vram, m.held_offsets(il, in_vram))
        slots = self._stage(il, np.flatnonzero(~held))  # all prefetched: each one acquired
        self._compute(il, n, x, routing, slots, base_row=self.late_base[il - m.layers[0]])

    def _moe_synced(self, il: int, n: int, x, routing: Routing, held: np.ndarray) -> None:
        m, st = self.m, self.m.stream
        routing.counts.copy_to_host(self.host_counts, stream=st)
        st.synchronize()
        self._settle()  # earlier layers' counts have landed too
        streamed, in_place = self._account(il, self.host_counts, held)
        self._point(il, in_place, m.held_offsets(il, in_place))
        if len(streamed) and self.ring is None:
            raise RuntimeError(f"layer {il}: {len(streamed)} experts are not resident and the "
                               f"plan has no ring")
        if self.ring is None or len(streamed) <= self.ring.n_slots:
            slots = self._stage(il, streamed)
            self._compute(il, n, x, routing, slots)
        else:
            self._waves(il, n, x, streamed, in_place)

    def _account(self, il: int, counts: np.ndarray, held: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Book layer il's routing (`counts` [n_expert + 1]: tokens per expert, then the total)
        in the traffic and the adaptive cache; returns its used (streamed, in-place) experts."""
        m, counts = self.m, counts[:self.n_expert]
        if m.adaptive is not None:  # the routing-adaptive cache's live counts
            m.adaptive.observe(il, counts)
        used = counts > 0
        streamed = np.flatnonzero(used & ~held)
        in_place = np.flatnonzero(used & held)
        self.traffic.add_layer(il, resident=len(in_place), streamed=len(streamed),
                               n_bytes=len(streamed) * m.store.layouts[il].n_bytes)
        return streamed, in_place

    def _settle(self) -> None:
        """Book the layers that ran without a sync (their counts copied; the stream synced)."""
        lo = self.m.layers[0]
        for il, held in self.pending:
            self._account(il, self.late_counts[il - lo], held)
        self.pending = []

    def _point(self, il: int, experts: np.ndarray, offsets: np.ndarray) -> None:
        lay = self.m.store.layouts[il]
        self.host_base[0, experts] = offsets
        self.host_base[1, experts] = offsets + lay.up_off
        self.host_base[2, experts] = offsets + lay.down_off

    def _stage(self, il: int, experts: np.ndarray) -> list:
        """Ring slots holding `experts` of layer il (staging those not prefetched)."""
        if self.staged_layer != il:
            self.staged, self.staged_layer = {}, il
        slots = []
        for e in experts:
            e = int(e)
            sl = self.staged.pop(e, None)
            if sl is None:
                sl = self.ring.stage(self.m.store.blob(il, e))
            slots.append(sl)
            self._point(il, np.array([e]), np.array([self.ring_base + sl.offset]))
        for sl in self.staged.values():  # prefetched but unused: give the slot back
            self.ring.acquire(sl, self.m.stream)
            self.ring.release(sl, self.m.stream)
        self.staged = {}
        return slots

    def _prefetch(self, il: int, n: int) -> None:
        """Stage layer il's non-resident experts now when the chunk is large enough that most
        will be used, so their copies overlap this layer's compute."""
        m = self.m
        if self.ring is None or il >= m.layers[1] \
                or n * self.k < PREFETCH_ENTRIES_PER_EXPERT * self.n_expert:
            return
        todo = np.flatnonzero(~m.held(il))
        if not len(todo) or len(todo) > self.ring.n_slots:
            return
        self.staged = {int(e): self.ring.stage(m.store.blob(il, int(e))) for e in todo}
        self.staged_layer = il

    def _weights(self, il: int) -> tuple[QuantWeights, QuantWeights, QuantWeights]:
        s, lay, base = self.m.shape, self.m.store.layouts[il], self.scr.base
        gate = QuantWeights(self.arena_u8, base[0], lay.gate_type, s.n_ff_expert, s.n_embd)
        up = QuantWeights(self.arena_u8, base[1], lay.up_type, s.n_ff_expert, s.n_embd)
        down = QuantWeights(self.arena_u8, base[2], lay.down_type, s.n_embd, s.n_ff_expert)
        return gate, up, down

    def _compute(self, il: int, n: int, x, routing: Routing, slots: list, *,
                 base_row=None) -> None:
        """The layer's grouped GEMMs over its pointed experts; `base_row`: a pinned [3, n_expert]
        row the offsets go through (a layer without the sync), else the pageable host_base (its
        copy waits for the stream: harmless where the layer synced already)."""
        st = self.m.stream
        src = self.host_base
        if base_row is not None:
            base_row[...] = self.host_base
            src = base_row
        self.scr.base.copy_to_device(src, stream=st)
        for sl in slots:
            self.ring.acquire(sl, st)
        gate, up, down = self._weights(il)
        ne, rows = n * self.k, self._rows
        h, y = rows("expert_mid", ne), rows("expert_out", ne)
        tile = SMALL_TC_TILE if routing.tile_rows == SMALL_TC_TILE.bm else None
        if gate.ggml_type == up.ggml_type:
            moe_gate_up(rows("normed", n), gate, up, routing, h, tile=tile, stream=st)
        else:  # IQ_MIX / LEGACY_MIX: two plain grouped GEMMs, scratch in y (strata...mixed)
            gate_up_unfused(rows("normed", n), gate, up, routing, h, y, tile=tile, stream=st)
        moe_down(h, down, routing, y, tile=tile, stream=st)
        combine(y, routing, rows("topk_weights", n), x, accumulate=True, stream=st)
        for sl in slots:
            self.ring.release(sl, st)

    def _waves(self, il: int, n: int, x, streamed: np.ndarray, in_place: np.ndarray) -> None:
        """More streamed experts than ring slots: waves of half the ring, the next wave's copies
        running while this wave computes."""
        m, st = self.m, self.m.stream
        if self.staged_layer == il:
            self._stage(il, np.zeros(0, np.int64))  # drop a prefetch that cannot be used whole
        width = max(1, self.ring.n_slots // 2)
        waves = [streamed[i:i + width] for i in range(0, len(streamed), width)]
        wave_of = np.full(self.n_expert, -1, np.int32)
        wave_of[in_place] = 0
        for w, group in enumerate(waves):
            wave_of[group] = w
        self.scr.wave_of.copy_to_device(wave_of, stream=st)
        ids = self.P["topk_ids"][:n]
        masked = self.scr.ids[:n * self.k].reshape(n, self.k)
        pending = [self.ring.stage(m.store.blob(il, int(e))) for e in waves[0]]
        for w, group in enumerate(waves):
            slots = pending
            if w + 1 < len(waves):
                pending = [self.ring.stage(m.store.blob(il, int(e))) for e in waves[w + 1]]
            for e, sl in zip(group, slots):
                self._point(il, np.array([e]), np.array([self.ring_base + sl.offset]))
            mask_ids(ids, self.scr.wave_of, w, masked, stream=st)
            routing = self._routing(n, masked)
            self._compute(il, n, x, routing, slots)
