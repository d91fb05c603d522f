"""Hit and miss accounting: decode hits/misses per layer (counted on the device by the MoE
kernel, read here), and what the prompt path streamed (counted by the host, which plans it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class DecodeHits:
    """Per-layer decode hits and misses: `counts` [n_layer, 2] int64 (hits, misses), a copy of
    the device counters."""

    counts: np.ndarray

    @classmethod
    def zeros(cls, n_layer: int) -> "DecodeHits":
        return cls(np.zeros((n_layer, 2), np.int64))

    def since(self, earlier: "DecodeHits") -> "DecodeHits":
        """The counts accumulated after `earlier` was read."""
        return DecodeHits(self.counts - earlier.counts)

    @property
    def hits(self) -> int:
        return int(self.counts[:, 0].sum())

    @property
    def misses(self) -> int:
        return int(self.counts[:, 1].sum())

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups, or None before any lookup."""
        n = self.hits + self.misses
        return self.hits / n if n else None

    def layer_rates(self) -> np.ndarray:
        """float64 [n_layer]: each layer's hit rate (NaN for a layer never looked up)."""
        n = self.counts.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, self.counts[:, 0] / np.maximum(n, 1), np.nan)


@dataclass(slots=True)
class PrefillTraffic:
    """What the prompt path did with the experts, summed over chunks and layers."""

    n_resident: int = 0  # (chunk, layer, expert) groups computed in place from the cache
    n_streamed: int = 0  # groups streamed through the ring
    bytes_streamed: int = 0
    n_chunks: int = 0
    per_layer_streamed: dict[int, int] = field(default_factory=dict)
    kv_staged_bytes: int = 0  # streamed KV: rows copied into the prompt path's layer copy

    def add_layer(self, layer: int, *, resident: int, streamed: int, n_bytes: int) -> None:
        self.n_resident += resident
        self.n_streamed += streamed
        self.bytes_streamed += n_bytes
        self.per_layer_streamed[layer] = self.per_layer_streamed.get(layer, 0) + streamed

    @property
    def resident_share(self) -> float | None:
        n = self.n_resident + self.n_streamed
        return self.n_resident / n if n else None
