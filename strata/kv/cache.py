"""`HostKVCache`: the keys and values of one sequence in host memory, preallocated for the
whole context so a long generation never reallocates (and never runs out half-way)."""

from __future__ import annotations

import numpy as np

from strata.errors import StrataError


class KVCacheError(StrataError):
    """The KV cache asked for cannot fit this machine's memory; the message gives the bytes."""


def host_memory_bytes() -> int | None:
    """This machine's physical memory, where the OS says (`strata.plan.host`); else None."""
    from strata.plan.host import probe_host_memory

    mem = probe_host_memory()
    return mem.total_bytes if mem is not None and mem.total_bytes > 0 else None


def _too_big(n_ctx: int, need: int, have: int | None) -> KVCacheError:
    from strata.plan.devices import fmt_bytes

    where = f"; this machine has {fmt_bytes(have)}" if have else ""
    return KVCacheError(f"a KV cache of {n_ctx:,} positions needs {fmt_bytes(need)} of host "
                        f"memory{where} (lower --max-context)")


class HostKVCache:
    """K and V of every layer for positions 0..n_ctx-1: `k[layer]` is [n_ctx, n_head_kv,
    head_dim] f32. The pages are reserved up front and touched as positions fill, so a large
    `n_ctx` costs address space, not resident memory, until it is used."""

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int):
        for name, v in (("n_layer", n_layer), ("n_ctx", n_ctx), ("n_head_kv", n_head_kv),
                        ("head_dim", head_dim)):
            if v < 1:
                raise ValueError(f"{name} must be at least 1, got {v}")
        self.n_layer, self.n_ctx = n_layer, n_ctx
        self.n_head_kv, self.head_dim = n_head_kv, head_dim
        need = 2 * n_layer * n_ctx * n_head_kv * head_dim * np.dtype(np.float32).itemsize
        have = host_memory_bytes()
        # The pages are only reserved here, but a cache larger than the machine's memory can
        # never be filled: refused now, by its size, rather than by numpy or the OOM killer.
        if have is not None and need > have:
            raise _too_big(n_ctx, need, have)
        shape = (n_layer, n_ctx, n_head_kv, head_dim)
        try:
            self.k = np.zeros(shape, np.float32)
            self.v = np.zeros(shape, np.float32)
        except (MemoryError, ValueError):  # ValueError: past numpy's largest array
            raise _too_big(n_ctx, need, have) from None

    @property
    def n_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * self.k.itemsize

    def store(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """Write k, v ([n_tokens, n_head_kv, head_dim]) at positions start..start+n_tokens-1."""
        n = k.shape[0]
        if start < 0 or start + n > self.n_ctx:
            raise ValueError(f"positions {start}..{start + n - 1} fall outside the cache's "
                             f"{self.n_ctx} positions")
        self.k[layer, start:start + n] = k
        self.v[layer, start:start + n] = v

    def copy_prefix(self, other: "HostKVCache", n: int) -> None:
        """Positions 0..n-1 of every layer from `other` (a cache of the same shape): the K/V of
        a prompt prefix another sequence computed."""
        if (other.n_layer, other.n_head_kv, other.head_dim) != (
                self.n_layer, self.n_head_kv, self.head_dim):
            raise ValueError("the caches hold different models' K/V")
        if not 0 <= n <= min(self.n_ctx, other.n_ctx):
            raise ValueError(f"cannot copy {n} positions between caches of {other.n_ctx} and "
                             f"{self.n_ctx}")
        self.k[:, :n] = other.k[:, :n]
        self.v[:, :n] = other.v[:, :n]
