"""The weight carve: a stage holds only its own layers' dense weights, plus the global tensors
its range uses.

One rule (`stage_weight_names`) says which tensors a stage holds, in arena order. The layout
(`stage_weights_layout`) is built from it, and the price the placement search reads for every
candidate range (`WeightCarve.bytes`, O(1) through per-layer prefix sums) is the sum of the
same tensors' aligned sizes, so a range can never be priced by one rule and laid out by another
(a test compares the two over every range). Globals: the first stage looks tokens up
(`token_embd` on the device unless it is read from host memory); the last stage owns
`output_norm` and the head, and a tied head (no `output.weight`) reads `token_embd`, so the last
stage keeps it whatever the lookup does.

With the carve off (`carve=False`, the A/B's kill switch) every stage holds the whole model's
dense weights and the globals, as a stage did before the carve existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from strata.gguf.shape import ModelShape
from strata.plan.layout import Layout, LayoutBuilder, align_up

EMBD, OUT_NORM, OUT = "token_embd.weight", "output_norm.weight", "output.weight"


def _check_range(shape: ModelShape, lo: int, hi: int) -> None:
    if not 0 <= lo < hi <= shape.n_layer:
        raise ValueError(f"layer range [{lo}, {hi}) is not inside [0, {shape.n_layer})")


def global_names(shape: ModelShape, lo: int, hi: int, *, embd_on_host: bool
                 ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(globals laid out before the layers, globals after them) that layers [lo, hi) use."""
    tied = OUT not in shape.tensors
    head = (lo == 0 and not embd_on_host) or (hi == shape.n_layer and tied)
    before = (EMBD,) if head else ()
    after = tuple(n for n in (OUT_NORM, OUT) if n in shape.tensors) if hi == shape.n_layer else ()
    return before, after


def stage_weight_names(shape: ModelShape, lo: int, hi: int, *, embd_on_host: bool,
                       carve: bool = True) -> tuple[str, ...]:
    """THE rule: the dense tensors a stage running layers [lo, hi) holds, in arena order."""
    _check_range(shape, lo, hi)
    if not carve:
        lo, hi = 0, shape.n_layer
    before, after = global_names(shape, lo, hi, embd_on_host=embd_on_host)
    layers = tuple(t.name for i in range(lo, hi) for t in shape.layers[i].dense)
    return before + layers + after


def stage_weights_layout(shape: ModelShape, lo: int, hi: int, *, embd_on_host: bool,
                         carve: bool = True) -> Layout:
    """The tensors `stage_weight_names` names as the engine stores them (`TensorInfo.vram_bytes`),
    one uint8 region each."""
    b = LayoutBuilder("weights")
    for name in stage_weight_names(shape, lo, hi, embd_on_host=embd_on_host, carve=carve):
        b.add(name, np.uint8, (shape.tensors[name].vram_bytes,))
    return b.build()


@dataclass(frozen=True, slots=True, eq=False)
class WeightCarve:
    """The carve's price of any range in O(1): the aligned bytes of the same tensors the layout
    holds, through prefix sums over the layers (built once per model)."""

    shape: ModelShape
    embd_on_host: bool
    carve: bool = True
    _prefix: np.ndarray = field(init=False, repr=False)  # [n_layer + 1] int64

    def __post_init__(self) -> None:
        per_layer = [sum(align_up(t.vram_bytes) for t in layer.dense) for layer in self.shape.layers]
        prefix = np.zeros(self.shape.n_layer + 1, np.int64)
        np.cumsum(per_layer, out=prefix[1:])
        object.__setattr__(self, "_prefix", prefix)

    def _globals(self, lo: int, hi: int) -> int:
        before, after = global_names(self.shape, lo, hi, embd_on_host=self.embd_on_host)
        return sum(align_up(self.shape.tensors[n].vram_bytes) for n in before + after)

    def bytes(self, lo: int, hi: int) -> int:
        """`stage_weights_layout(lo, hi).total_bytes`, without building it."""
        _check_range(self.shape, lo, hi)
        if not self.carve:
            lo, hi = 0, self.shape.n_layer
        return int(self._prefix[hi] - self._prefix[lo]) + self._globals(lo, hi)

    def table(self) -> np.ndarray:
        """[n_layer + 1, n_layer + 1] int64: bytes(lo, hi) at [lo, hi] for lo < hi, else 0."""
        n = self.shape.n_layer
        lo, hi = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
        valid = lo < hi
        if not self.carve:
            return np.where(valid, self.bytes(0, n), 0).astype(np.int64)
        out = self._prefix[hi] - self._prefix[lo]
        # the globals depend only on whether the range starts at 0 and whether it ends at n
        for first in (False, True):
            for last in (False, True):
                a, b = (0 if first else 1), (n if last else n - 1)
                if a < b:
                    sel = valid & ((lo == 0) == first) & ((hi == n) == last)
                    out[sel] += self._globals(a, b)
        return np.where(valid, out, 0).astype(np.int64)
