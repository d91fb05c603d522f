"""`ModelShape`: every count and dimension of a model, and the bytes and type of every tensor.

This is what the planner prices. It is built from the header alone; no tensor data is read.
Dense tensors are split into global ones (embedding, output norm, head) and per-layer ones;
experts are per layer, stacked: one expert's gate+up+down bytes is an "expert slot".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.gguf.tensors import TensorInfo


@dataclass(frozen=True, slots=True)
class LayerTensors:
    """The tensors of one transformer block."""

    dense: tuple[TensorInfo, ...]  # attention, norms, router: always in VRAM
    experts: tuple[TensorInfo, ...]  # stacked expert tensors (gate, up, down), [.., n_expert]

    @property
    def dense_bytes(self) -> int:
        """VRAM bytes of the dense tensors (a planar layout's where the engine keeps one)."""
        return sum(t.vram_bytes for t in self.dense)

    @property
    def expert_bytes(self) -> int:
        return sum(t.n_bytes for t in self.experts)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Counts, dimensions and the byte table of a MoE model."""

    arch: str
    n_layer: int
    n_embd: int  # model width
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_expert: int  # width of one expert's gate/up projections
    n_vocab: int
    n_ctx_train: int
    rope_freq_base: float
    rms_norm_eps: float
    global_tensors: tuple[TensorInfo, ...]  # token_embd, output_norm, output
    layers: tuple[LayerTensors, ...]
    file_bytes: int
    tensors: dict[str, TensorInfo] = field(repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.layers) != self.n_layer:
            raise ValueError(f"{len(self.layers)} layer tables for {self.n_layer} layers")

    # -- pricing helpers (bytes) ------------------------------------------------------------

    def expert_slot_bytes(self, layer: int) -> int:
        """One expert's gate+up+down bytes in `layer`: the size of its cache slot."""
        return sum(t.slice_bytes(self.n_expert) for t in self.layers[layer].experts)

    @property
    def expert_slot_bytes_max(self) -> int:
        return max(self.expert_slot_bytes(i) for i in range(self.n_layer))

    @property
    def expert_bytes_total(self) -> int:
        return sum(layer.expert_bytes for layer in self.layers)

    def layer_dense_bytes(self, layer: int) -> int:
        return self.layers[layer].dense_bytes

    def dense_bytes(self, lo: int = 0, hi: int | None = None) -> int:
        """Per-layer dense bytes of layers [lo, hi) (global tensors not included)."""
        hi = self.n_layer if hi is None else hi
        return sum(self.layers[i].dense_bytes for i in range(lo, hi))

    def global_bytes(self, name: str) -> int:
        return self.tensors[name].vram_bytes

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv

    def kv_bytes_per_token(self, bytes_per_value: float) -> int:
        """K and V for one token over all layers at `bytes_per_value` (2 for f16)."""
        return int(2 * self.n_layer * self.n_head_kv * self.head_dim * bytes_per_value)
