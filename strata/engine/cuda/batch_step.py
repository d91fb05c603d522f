"""One decode step of n sequences (rows 0..n-1 of the session buffers) sharing one pass over the
dense weights, as a fixed list of launches whose changing inputs live in device memory — each
row's input token (step_tokens[r]), position (seq_len[r]) and routing — so the list for a row
count n is captured once as a CUDA graph and replayed.

Per step: the rows' input tokens into their histories (history[r, seq_len[r]] = step_tokens[r],
one launch, so the host makes one copy of all n tokens); per row, the embedding of that token;
per layer: RMSNorm of all rows, the q/k/v matvecs over all rows (one read of each weight for the
batch: `batch_tc` on the tensor cores for Q4_K/Q6_K, else `lanes_batch`), per-head norm and
RoPE of all rows at their own positions; the KV write and split-K attention of all rows, each over its own KV region, in one launch each
(`batch_attention`: f16 KV; other KV formats row by row); the output projection, RMSNorm and
router over all rows; the MoE of all rows (`batch_moe`'s lane kernels: two launches, gate_up
grouped by expert, down per token; row by row where gate and up differ in format; its
tensor-core kernels, `batch_moe_tc`, measured slower at 8 rows and are not launched here); final norm and head over all rows; per row,
seq_len[r] += 1.

One row, by default, runs the single engine's step (`one`: a `DecodeStep` over row 0, its fused
launches — the norm inside the q/k/v matvec, RoPE with the KV write, the router with its norm,
the MoE in one launch — dotting 8-bit x where the format can, `lanes_x8`): a sequence decoded
alone is as fast as `strata generate`, and its bits differ from those it gets in a batch by that
rounding. Batch-invariant engines (`one` None) run one row through the single-token kernels with
float32 x, as the batched kernels, so a row gets the same bits alone and in a batch.

The token's choice is the caller's: the step leaves rows 0..n-1 of the logits buffer, or, with
`pick`, it also picks every row's next token on the device (one `sampling.sample` launch over
the rows, each by its own settings in sample_fparams / sample_iparams[r]: temperature 0 is
greedy), appended at history[r, seq_len[r]] (where the next step's own token goes) and gathered
into step_tokens[:n] for one copy back.
"""

from __future__ import annotations

from typing import Any, Sequence

from strata.cuda_kernels import batch_attention
from strata.cuda_kernels.attention import decode_attention, n_splits
from strata.cuda_kernels.batch_attention import attention_rows, kv_write_rows
from strata.cuda_kernels.batch_moe import batch_moe_decode, batch_moe_fits
from strata.cuda_kernels.batch_tc import matvec_tc, tc_fits
from strata.cuda_kernels.elementwise import add, embed, last_tokens, scatter_tokens
from strata.cuda_kernels.intrinsics import SIMULATED
from strata.cuda_kernels.kvcache import KvSide, advance_seq_len, kv_write
from strata.cuda_kernels.lanes_batch import matvec_batch
from strata.cuda_kernels.matvec import matvec
from strata.cuda_kernels.moe import moe_decode
from strata.cuda_kernels.norm_rope import qk_norm_rope, rms_norm
from strata.cuda_kernels.router import route
from strata.cuda_kernels.sampling import sample
from strata.engine.cuda.mixed import MixedLayout, moe_decode_mixed
from strata.engine.cuda.model import CudaModel, Matrix
from strata.plan.attn_split import split_target
from strata.plan.layout import SPLIT_K_TOKENS

RowSides = Sequence[Sequence[tuple[KvSide, KvSide]]]  # [row][layer] -> (K side, V side)


class BatchStep:
    """The launches of a step of n rows over one `CudaModel`'s buffers, plain or as graphs (one
    per row count). `sides[r][il]` is row r's KV region of layer il."""

    def __init__(self, m: CudaModel, sides: RowSides, *, use_graph: bool):
        self.m = m
        self.sides = sides
        self.n_rows = len(sides)
        self.use_graph = use_graph and not SIMULATED  # the simulator has no graphs
        self.graphs: dict[Any, Any] = {}  # n rows: logits; ("pick", n): tokens picked too
        self._warm: set[Any] = set()
        a = m.acts
        n_ctx = sides[0][0][0].layout.n_ctx
        ns = n_splits(n_ctx, split_target(m.shape.n_head_kv), SPLIT_K_TOKENS)
        # [n_rows, n_split(plan context), n_head, head_dim] f32: a row decoded alone
        # (`decode_attention`) uses its first splits, as many as its live length calls for
        self.partials = [(a["attn_part_o"][r][:ns], a["attn_part_ml"][r][:ns])
                         for r in range(self.n_rows)]
        self.row_ctx = n_ctx
        self.regions = self._regions() if batch_attention.supports(
            m.kv_layout.fmt, m.shape.head_dim, m.shape.n_head // m.shape.n_head_kv) else None
        # the single engine's step over row 0, for steps of one row (None: the batch-invariant
        # one-row launches); set by the engine, which makes the row's view of the model
        self.one: Any = None

    def _regions(self) -> list[tuple[Any, Any]]:
        """Per layer, the K and V bytes of all rows ([n_rows * row_ctx, H, row] flat): the
        batched kernels address row r's region at r * row_ctx."""
        kv, n_tok = self.m.arena.views("kv"), self.n_rows * self.row_ctx
        return [(kv["k"][il][:n_tok].reshape(-1), kv["v"][il][:n_tok].reshape(-1))
                for il in range(self.m.shape.n_layer)]

    # -- the launches ------------------------------------------------------------------------

    def _mv(self, w: Matrix, x, y, n: int, stream) -> None:
        """y[:n] = W x[:n]: one row through the lane kernels (1-D); more through the tensor-core
        kernels where the format has them (`batch_tc`: each weight dequantized once for all
        rows), else the small-batch lane kernels (`lanes_batch`: each weight block read once)."""
        if n == 1:  # float32 x, as the batched kernels: a row's bits alone and in a batch
            matvec(w.data, w.ggml_type, x[0], y[0], x8=False, stream=stream)
        elif tc_fits(w.ggml_type, int(x.shape[1])):
            matvec_tc(w.data, w.ggml_type, x[:n], y[:n], stream=stream)
        else:
            matvec_batch(w.data, w.ggml_type, x[:n], y[:n], stream=stream)

    def record(self, stream, n: int, pick: bool = False) -> None:
        """Enqueue one step of rows 0..n-1 on `stream` (also what a graph captures); with
        `pick`, each row's next token chosen on the device too (see the module doc)."""
        if not 1 <= n <= self.n_rows:
            raise ValueError(f"a step takes 1..{self.n_rows} rows, got {n}")
        m, s, a = self.m, self.m.shape, self.m.acts
        scatter_tokens(a["step_tokens"][:n], a["seq_len"][:n], a["history"][:n], stream=stream)
        if n == 1 and self.one is not None:  # embedding to seq_len += 1, fused as `generate`'s
            self.one.record(stream, "logits")
            if pick:
                self._pick(n, stream)
            return
        for r in range(n):
            embed(m.embd_table, m.embd_type, a["history"][r], a["seq_len"][r:r + 1],
                  a["hidden"][r:r + 1], stream=stream)
        for il in range(s.n_layer):
            self._attention(il, n, stream)
            self._moe(il, n, stream)
        x, xn = a["hidden"][:n], a["normed"][:n]
        rms_norm(x, m.norms["output_norm"], xn, eps=s.rms_norm_eps, stream=stream)
        self._mv(m.matrices["output"], a["normed"], a["logits"], n, stream)
        for r in range(n):
            advance_seq_len(a["seq_len"][r:r + 1], 1, stream=stream)
        if pick:
            self._pick(n, stream)

    def _pick(self, n: int, stream) -> None:
        """Rows 0..n-1's next tokens, each at its history's position seq_len[r] (the history's
        count n_tokens[r] set to it first), gathered into step_tokens[:n]."""
        a = self.m.acts
        count = a["n_tokens"][:n]
        count.copy_to_device(a["seq_len"][:n], stream=stream)
        sample(a["logits"][:n], a["history"][:n], count, a["sample_fparams"][:n],
               a["sample_iparams"][:n], a["pick_state"][:n], a["pick_cand_v"][:n],
               a["pick_cand_i"][:n], a["sample_bias_ids"][:n], a["sample_bias_vals"][:n],
               stream=stream)
        last_tokens(a["history"][:n], count, a["step_tokens"][:n], stream=stream)

    def _attention(self, il: int, n: int, stream) -> None:
        m, s, a = self.m, self.m.shape, self.m.acts
        b, eps = f"blk.{il}.", s.rms_norm_eps
        x, xn = a["hidden"][:n], a["normed"][:n]
        rms_norm(x, m.norms[b + "attn_norm"], xn, eps=eps, stream=stream)
        for name in ("q", "k", "v"):
            self._mv(m.matrices[b + "attn_" + name], a["normed"], a[name], n, stream)
        qk_norm_rope(a["q"][:n], a["k"][:n], a["seq_len"][:n], n_head=s.n_head,
                     n_head_kv=s.n_head_kv, head_dim=s.head_dim, theta=s.rope_freq_base,
                     q_norm_w=m.norms[b + "attn_q_norm"], k_norm_w=m.norms[b + "attn_k_norm"],
                     eps=eps, stream=stream)
        if n > 1 and self.regions is not None:
            self._attend_rows(il, n, stream)
        else:
            self._attend_each(il, n, stream)
        self._mv(m.matrices[b + "attn_output"], a["attn_out"], a["residual"], n, stream)
        add(x.reshape(x.size), a["residual"][:n].reshape(x.size), x.reshape(x.size),
            stream=stream)
        rms_norm(x, m.norms[b + "ffn_norm"], xn, eps=eps, stream=stream)
        self._mv(m.matrices[b + "ffn_gate_inp"], a["normed"], a["router_logits"], n, stream)
        route(a["router_logits"][:n], a["topk_ids"][:n], a["topk_weights"][:n], norm_topk=True,
              stream=stream)

    def _attend_rows(self, il: int, n: int, stream) -> None:
        """KV write and attention of rows 0..n-1 in one launch each (`batch_attention`: splits of
        a fixed SPLIT_K_TOKENS keys, the rows already multiplying the blocks)."""
        s, a = self.m.shape, self.m.acts
        kd, vd = self.regions[il]
        geo = dict(row_ctx=self.row_ctx, n_kv=s.n_head_kv, head_dim=s.head_dim, stream=stream)
        kv_write_rows(a["k"][:n], a["v"][:n], a["seq_len"][:n], kd, vd, **geo)
        attention_rows(a["q"][:n], kd, vd, a["seq_len"][:n], a["attn_out"][:n],
                       (a["attn_part_o"][:n], a["attn_part_ml"][:n]), split_len=SPLIT_K_TOKENS,
                       **geo)

    def _attend_each(self, il: int, n: int, stream) -> None:
        """KV write and attention row by row (the one-sequence kernels)."""
        s, a = self.m.shape, self.m.acts
        for r in range(n):
            k_side, v_side = self.sides[r][il]
            pos = a["seq_len"][r:r + 1]
            kv_write(a["k"][r:r + 1].reshape(1, s.n_head_kv, s.head_dim), k_side, pos,
                     stream=stream)
            kv_write(a["v"][r:r + 1].reshape(1, s.n_head_kv, s.head_dim), v_side, pos,
                     stream=stream)
            decode_attention(a["q"][r].reshape(s.n_head, s.head_dim), k_side, v_side, pos,
                             a["attn_out"][r].reshape(s.n_head, s.head_dim), self.partials[r],
                             n_new=1, stream=stream)

    def _moe(self, il: int, n: int, stream) -> None:
        """Layer il's experts of every row added into its residual: one row, or gate and up in
        different formats (`MixedLayout`), through the single-token kernels row by row; else
        all rows in the batched kernels' two launches (row by row where a row's k h vectors
        do not fit those kernels' shared memory)."""
        m, a = self.m, self.m.acts
        layout = m.layouts[il]
        store = dict(slot_table=a["slot_table"], cache=m.cache_bytes, slot_off=a["slot_off"],
                     host=m.host.device, host_off=a["host_off"], counters=a["hit_counts"],
                     stream=stream)
        k = a["topk_ids"].shape[1]
        if n > 1 and not isinstance(layout, MixedLayout) and batch_moe_fits(layout, k, n):
            batch_moe_decode(a["normed"][:n], a["topk_ids"][:n], a["topk_weights"][:n],
                             layer=il, layout=layout, h=a["moe_h"][:n], out=a["hidden"][:n],
                             accumulate=True, **store)
            return
        for r in range(n):
            row = dict(h=a["moe_h"][r], out=a["hidden"][r], miss_list=a["miss_list"][r],
                       cpu_misses=False, **store)
            args = (a["normed"][r], a["topk_ids"][r], a["topk_weights"][r])
            if isinstance(layout, MixedLayout):
                moe_decode_mixed(*args, layer=il, layout=layout, **row)
            else:  # float32 x, as the batched kernels: a row's bits alone and in a batch
                moe_decode(*args, layer=il, layout=layout, accumulate=True, x8=False,
                           sync=a["moe_sync"][r], **row)

    # -- running -------------------------------------------------------------------------------

    def run(self, n: int, pick: bool = False) -> None:
        """Enqueue one step of n rows (`pick`: and their tokens' choice) on the model's stream:
        a graph replay once that row count's kernels have run plainly (compiled) once, else
        plain launches."""
        stream = self.m.stream
        if not self.use_graph:
            self.record(stream, n, pick)
            return
        key = ("pick", n) if pick else n
        g = self.graphs.get(key)
        if g is None and key in self._warm:
            from strata.cuda_kernels.graph import capture
            g = self.graphs[key] = capture(lambda st: self.record(st, n, pick), stream)
        if g is None:
            self.record(stream, n, pick)
            self._warm.add(key)
        else:
            g.replay(stream)

    @property
    def n_graph_nodes(self) -> dict[Any, int]:
        return {n: g.n_nodes for n, g in self.graphs.items()}
