"""`RowModel`: a `CudaModel` seen through one row of a batched session (the prompt path and a
one-row step of `CudaBatchEngine` run on it)."""

from __future__ import annotations

from typing import Any

from strata.engine.cuda.model import CudaModel

ROW_ENTRIES = ("hidden", "residual", "normed", "q", "k", "v", "attn_out", "router_logits",
               "topk_ids", "topk_weights", "router_done", "moe_sync", "moe_h", "miss_list",
               "moe_out", "logits", "seq_len", "history", "step_tokens", "n_tokens",
               "sample_fparams", "sample_iparams", "sample_bias_ids", "sample_bias_vals")


class RowModel:
    """A `CudaModel` seen through one row: the session's per-sequence entries narrowed to that
    row ([1, ...]) and the KV sides to its region; everything else is the model's."""

    def __init__(self, m: CudaModel, row: int, sides, n_split: int):
        self._m = m
        acts = dict(m.acts)
        for name in ROW_ENTRIES:
            acts[name] = m.acts[name][row:row + 1]
        for name in ("attn_part_o", "attn_part_ml"):
            part = m.acts[name][row][:n_split]
            acts[name] = part.reshape((1,) + tuple(part.shape))
        self.acts = acts
        self.kv_sides = sides

    def __getattr__(self, name: str) -> Any:
        return getattr(self._m, name)
