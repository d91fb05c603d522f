"""One decode step as a fixed sequence of kernel launches whose every changing input lives in
device memory — the token (history[seq_len]), the position and length (seq_len), the routing,
the slot table — so the sequence is captured once as a CUDA graph and replayed per token.

Per step: embedding of history[seq_len]; per layer: the q, k and v matvecs with the RMSNorm fused
in (one launch for one weight format or a pair with a mixed kernel, Q4_K_M's q, k Q4_K | v Q6_K;
else one per format; RMSNorm and matvecs apart for formats without a lane kernel),
per-head norm, RoPE and the KV write at seq_len (one launch for an f16 cache), split-K attention
over seq_len + 1 keys (splits as long as that length calls for, derived on the device),
output projection added into the residual by its matvec, RMSNorm + router matvec + top-k (one
launch for F32/F16 router rows; where the MoE's gate/up is a lane kernel, the router writes its
logits only and every gate/up block ranks them itself), the MoE
(cache slot or mapped host memory per expert, added into the residual, hits/misses counted per
layer); final norm, head, seq_len += 1, then (by mode) nothing, argmax or the seeded sampler
appending to the history.

`--no-graph` runs the same `record` launch by launch: the same kernels, the same tokens.

With the CPU pool as the miss path (`miss_path="cpu"`) a step is pieces per layer: attention and
routing (a graph), the router's choice and the normed input copied to pinned host memory, the
GPU's hits (a graph, the misses skipped), then the pool computes the misses on the CPU while the
GPU runs the hits, and adds its sum into the residual. With `miss_path="hybrid"` the pool takes
only its share of a layer's misses and the GPU reads the others from mapped host memory in a
second MoE launch while the pool computes (`strata.engine.cuda.miss_split`).
"""

from __future__ import annotations

from strata.cuda_kernels.attention import decode_attention
from strata.cuda_kernels.elementwise import embed
from strata.cuda_kernels.intrinsics import SIMULATED
from strata.cuda_kernels.kvcache import advance_seq_len, kv_write
from strata.cuda_kernels.matvec import matvec, matvec_pair
from strata.cuda_kernels.matvec_normed import matvec_normed, normed_groups
from strata.cuda_kernels.moe import moe_decode, routes_itself
from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm
from strata.cuda_kernels.rope_kv import rope_kv, rope_kv_fits
from strata.cuda_kernels.router import route
from strata.cuda_kernels.router_normed import router_normed
from strata.cuda_kernels.router_normed import takes as router_takes
from strata.cuda_kernels.sampling import argmax, sample
from strata.engine.cuda.mixed import MixedLayout, moe_decode_mixed
from strata.engine.cuda.model import CudaModel
from strata.engine.cuda.miss_split import MissShare
from strata.engine.cuda.pool import CpuPool

MODES = ("logits", "greedy", "sample")  # what follows the head in a step


class DecodeStep:
    """The step's launches over one `CudaModel`'s buffers, plain or as graphs (one per mode)."""

    # whether a layer's MoE launch may route the router's logits itself (False where something
    # reads the top-k ids between the router and the MoE)
    route_in_moe = True

    def __init__(self, m: CudaModel, *, use_graph: bool, miss_path: str = "mapped",
                 miss_share: float | None = None):
        self.m = m
        self.use_graph = use_graph and not SIMULATED  # the simulator has no graphs
        self.graphs: dict[tuple, object] = {}
        self._warm: set[tuple] = set()
        if miss_path not in ("mapped", "cpu", "hybrid"):
            raise ValueError(f"miss_path must be mapped, cpu or hybrid, got {miss_path!r}")
        self.miss_path = miss_path
        self.pool = None
        if miss_path != "mapped":
            split = MissShare(miss_share) if miss_path == "hybrid" else None
            self.pool = CpuPool(m, split=split)
        a, s = m.acts, m.shape
        self.x = a["hidden"]  # [1, n_embd] f32, the residual stream
        self.x1 = a["hidden"].reshape(s.n_embd)
        self.xn = a["normed"]
        self.xn1 = a["normed"].reshape(s.n_embd)
        self.tmp1 = a["residual"].reshape(s.n_embd)  # the output projection, before the add
        self.q, self.k, self.v = a["q"], a["k"], a["v"]  # [1, heads * head_dim] f32
        self.q2 = a["q"].reshape(s.n_head, s.head_dim)
        self.attn2 = a["attn_out"].reshape(s.n_head, s.head_dim)
        self.attn1 = a["attn_out"].reshape(s.n_head * s.head_dim)
        self.k3 = a["k"].reshape(1, s.n_head_kv, s.head_dim)
        self.v3 = a["v"].reshape(1, s.n_head_kv, s.head_dim)
        self.partials = (a["attn_part_o"][0], a["attn_part_ml"][0])
        self.logits = a["logits"][0]  # [n_vocab] f32
        self.history = a["history"][0]  # [max_context] i32
        self.n_tokens = a["n_tokens"]  # [1] i32
        # the token choice's arguments as the one row of its launches (sliced once: a device
        # array's slice costs Python time on every plain step)
        self.pick_rows = tuple(a[k][0:1] for k in ("logits", "history", "pick_state",
                                                   "sample_fparams", "sample_iparams",
                                                   "pick_cand_v", "pick_cand_i",
                                                   "sample_bias_ids", "sample_bias_vals"))
        self.nan_flag = self.pick_rows[2][0][2:3]  # [1] u64: whether a pick met NaN logits
        self.seq_len = a["seq_len"]  # [1] i32: tokens in the KV cache = the next position
        self.moe_routes = [self._moe_routes(il) for il in range(s.n_layer)]

    def _moe_routes(self, il: int) -> bool:
        """Whether layer il's router writes only its logits and the MoE's gate/up launch routes
        them (`moe.routes_itself`): then no router block waits for all the others' logits to
        route them alone. Not with the CPU pool (it copies the ids out between the two)."""
        if not self.route_in_moe or self.pool is not None or not (
                self.m.layers[0] <= il < self.m.layers[1]):
            return False
        layout, w = self.m.layouts[il], self.m.matrices[f"blk.{il}.ffn_gate_inp"]
        return (not isinstance(layout, MixedLayout) and router_takes(w.ggml_type, self.x1.shape[0])
                and routes_itself(layout, self.m.shape.n_expert))

    # -- the launches ------------------------------------------------------------------------

    def record(self, stream, mode: str) -> None:
        """Enqueue one step on `stream` (also what a graph captures)."""
        lo, hi = self.m.layers
        if lo == 0:
            self._begin(stream)
        for il in range(lo, hi):
            self._attention(il, stream)
            self._moe(il, stream, cpu_misses=False)
        self._end(stream, mode)

    def _begin(self, stream) -> None:
        m = self.m
        embed(m.embd_table, m.embd_type, self.history, self.seq_len, self.x, stream=stream)

    def _end(self, stream, mode: str) -> None:
        m, s = self.m, self.m.shape
        last = m.layers[1] == s.n_layer  # a split's earlier stages hand their hidden state on
        if last:
            rms_norm(self.x, m.norms["output_norm"], self.xn, eps=s.rms_norm_eps, stream=stream)
            head = m.matrices["output"]
            matvec(head.data, head.ggml_type, self.xn1, self.logits, stream=stream)
        advance_seq_len(self.seq_len, 1, stream=stream)
        if last:
            self.pick(mode, stream)

    def pick(self, mode: str, stream) -> None:
        """Append the next token to the device history (mode greedy / sample), or nothing."""
        logits, history, state, fp, ip, cand_v, cand_i, bias_ids, bias_vals = self.pick_rows
        if mode == "greedy":
            argmax(logits, history, self.n_tokens, state, stream=stream)
        elif mode == "sample":
            sample(logits, history, self.n_tokens, fp, ip, state, cand_v, cand_i, bias_ids,
                   bias_vals, stream=stream)
        elif mode != "logits":
            raise ValueError(f"decode mode {mode!r} is not one of {MODES}")

    def _attention(self, il: int, stream) -> None:
        """Layer il up to its routing: attention, residual, FFN norm, router, top-k."""
        m, s = self.m, self.m.shape
        b = f"blk.{il}."
        eps = s.rms_norm_eps
        self._qkv(b, stream)
        k_side, v_side = m.kv_sides[il]
        norms = dict(q_norm_w=m.norms[b + "attn_q_norm"], k_norm_w=m.norms[b + "attn_k_norm"],
                     eps=eps, stream=stream)
        if rope_kv_fits(k_side, v_side):  # f16, int8 KV: norm, RoPE, both writes in one launch
            rope_kv(self.q.reshape(self.q.size), self.k.reshape(self.k.size),
                    self.v.reshape(self.v.size), self.seq_len, k_side, v_side,
                    n_head=s.n_head, theta=s.rope_freq_base, **norms)
        else:
            qk_norm_rope(self.q, self.k, self.seq_len, n_head=s.n_head, n_head_kv=s.n_head_kv,
                         head_dim=s.head_dim, theta=s.rope_freq_base, **norms)
            kv_write(self.k3, k_side, self.seq_len, stream=stream)
            kv_write(self.v3, v_side, self.seq_len, stream=stream)
        decode_attention(self.q2, k_side, v_side, self.seq_len, self.attn2, self.partials,
                         n_new=1, stream=stream)  # the kernel's longest split: partials fit
        w = m.matrices[b + "attn_output"]  # added into the residual by the matvec itself
        matvec(w.data, w.ggml_type, self.attn1, self.x1, accumulate=True, stream=stream)
        self._route(il, stream)

    def _route(self, il: int, stream) -> None:
        """Layer il's FFN norm into xn, router logits and top-k: one launch for F32/F16 router
        rows (`router_normed`), else RMSNorm, matvec and top-k."""
        m, a = self.m, self.m.acts
        norm_w, w = m.norms[f"blk.{il}.ffn_norm"], m.matrices[f"blk.{il}.ffn_gate_inp"]
        logits, eps = a["router_logits"], m.shape.rms_norm_eps
        if router_takes(w.ggml_type, self.x1.shape[0]):  # moe_routes: logits only
            router_normed(self.x1, norm_w, w.data, ggml_type=w.ggml_type, eps=eps,
                          normed_out=self.xn1, logits=logits[0], ids=a["topk_ids"][0],
                          weights=a["topk_weights"][0], done=a["router_done"],
                          route=not self.moe_routes[il], stream=stream)
            return
        rms_norm(self.x, norm_w, self.xn, eps=eps, stream=stream)
        matvec(w.data, w.ggml_type, self.xn1, logits.reshape(logits.size), stream=stream)
        route(logits, a["topk_ids"], a["topk_weights"], norm_topk=True, stream=stream)

    def _qkv(self, b: str, stream) -> None:
        """q, k and v of the attention-normed residual: the norm fused into one lane matvec
        launch (`normed_groups`: one for one format or a mixed pair such as Q4_K | Q6_K, else
        one per format); else RMSNorm into xn, q, and k+v (one launch if one format)."""
        m, eps = self.m, self.m.shape.rms_norm_eps
        wq, wk, wv = (m.matrices[b + n] for n in ("attn_q", "attn_k", "attn_v"))
        q, k, v = self.q.reshape(self.q.size), self.k.reshape(self.k.size), self.v.reshape(
            self.v.size)
        groups = normed_groups([(wq.data, wq.ggml_type, q), (wk.data, wk.ggml_type, k),
                                (wv.data, wv.ggml_type, v)], self.x1.shape[0])
        if groups is not None:
            for mats in groups:
                matvec_normed(self.x1, m.norms[b + "attn_norm"], eps, mats, stream=stream)
            return
        rms_norm(self.x, m.norms[b + "attn_norm"], self.xn, eps=eps, stream=stream)
        matvec(wq.data, wq.ggml_type, self.xn1, q, stream=stream)
        matvec_pair(wk.data, wk.ggml_type, wv.data, wv.ggml_type, self.xn1, k, v, stream=stream)

    def _moe(self, il: int, stream, *, cpu_misses: bool) -> None:
        """Layer il's experts added into the residual: cached ones from their slots, missed ones
        from mapped host memory, or (cpu_misses) left to the CPU pool."""
        m, a = self.m, self.m.acts
        where = dict(slot_table=a["slot_table"], cache=m.cache_bytes, slot_off=a["slot_off"],
                     host=m.host.device, host_off=a["host_off"], h=a["moe_h"][0], out=self.x1,
                     miss_list=a["miss_list"][0], counters=a["hit_counts"],
                     cpu_misses=cpu_misses, stream=stream)
        layout = m.layouts[il]
        if isinstance(layout, MixedLayout):
            moe_decode_mixed(self.xn1, a["topk_ids"][0], a["topk_weights"][0], layer=il,
                             layout=layout, **where)
        else:
            moe_decode(self.xn1, a["topk_ids"][0], a["topk_weights"][0], layer=il,
                       layout=layout, accumulate=True,
                       route_logits=a["router_logits"][0] if self.moe_routes[il] else None,
                       sync=a["moe_sync"][0], **where)

    # -- running -------------------------------------------------------------------------------

    def run(self, mode: str) -> None:
        """Enqueue one step on the model's stream: graph replays once each piece's kernels have
        run plainly (compiled) once, else plain launches. With the CPU pool the step is pieces
        per layer (attention+routing | the GPU's hits), the pool's work between them."""
        stream = self.m.stream
        if self.pool is None:
            self._piece(("step", mode), lambda st: self.record(st, mode), stream)
            return
        a, table = self.m.acts, self.m.cache.table
        for il in range(*self.m.layers):
            self._piece(("attn", il), lambda st, il=il: self._pool_attention(il, st), stream)
            self.pool.fetch(self.xn1, a["topk_ids"][0], a["topk_weights"][0], stream)
            self._piece(("moe", il), lambda st, il=il: self._moe(il, st, cpu_misses=True),
                        stream)
            gpu_bytes = self.pool.wait(il, table[il], stream)
            if gpu_bytes:  # hybrid: the GPU's part of the misses, read from mapped memory
                share = self.pool.mapped
                self._piece(("share", il), lambda st, il=il: share.launch(il, st), stream)
                share.launched(gpu_bytes, stream)
            if self.pool.compute(il):
                self.pool.add_into(self.x1, self.tmp1, stream)
        self._piece(("end", mode), lambda st: self._end(st, mode), stream)

    def _pool_attention(self, il: int, stream) -> None:
        if il == 0:
            self._begin(stream)
        self._attention(il, stream)

    def _piece(self, key, record, stream) -> None:
        if not self.use_graph:
            record(stream)
            return
        g = self.graphs.get(key)
        if g is None and key in self._warm:
            from strata.cuda_kernels.graph import capture
            g = self.graphs[key] = capture(record, stream)
        if g is None:
            record(stream)
            self._warm.add(key)
        else:
            g.replay(stream)

    @property
    def n_graph_nodes(self) -> dict[str, int]:
        """Kernel nodes per mode (pool: the pieces of one step summed)."""
        out: dict[str, int] = {}
        for key, g in self.graphs.items():
            name = key[1] if key[0] in ("step", "end") else "pool_layers"
            out[name] = out.get(name, 0) + g.n_nodes
        return out
