"""The "hybrid" decode miss path: a layer's missed experts shared between the GPU, which reads
its part zero-copy from mapped host memory, and the CPU pool, which computes the rest at the
same time.

Per layer, after the router's choice reaches the host (the CPU pool's fetch), `MissShare.pick`
splits the layer's misses: the CPU takes round(share x misses) of them (the rounding error is
carried to the next layer, so over many layers the CPU's part of the misses is `share`), the GPU
the others. The GPU's part runs as a second MoE launch behind the hits: its slot table is one
row whose entries name the GPU's experts (entry e = e, every other entry a miss), its "cache"
the mapped host store and its slot offsets the layer's row of the store's offsets, and misses
left to the CPU (so hits and the CPU's experts are skipped). Nothing is allocated on the device
for it (the plan's contract): the one-row table lives in the router's logits (free once the
top-k is taken, until the next layer's router), its throw-away counters and miss list in the
attention's split-K partials (free from the output projection to the next layer's attention).

The share is fixed (`--miss-share`) or chosen from measured rates: the CPU's bytes per second
(the pool's own timing of its experts) and the GPU's (CUDA events around its part), both as
decayed sums, give share = cpu_rate / (cpu_rate + gpu_rate) — the split where both finish a
layer's misses at the same time.
"""

from __future__ import annotations

import numpy as np

SHARE_START = 0.25  # the CPU's share before both rates are measured
SHARE_MIN, SHARE_MAX = 0.02, 0.98  # a measured share keeps both paths measured
DECAY = 0.97  # per layer sample: the rates follow about the last 30 layers


class MissShare:
    """Which of a layer's misses the CPU computes. `share`: the CPU's fraction, fixed; None:
    from the measured rates (`record_cpu`, `record_gpu`)."""

    def __init__(self, share: float | None = None):
        if share is not None and not 0.0 <= share <= 1.0:
            raise ValueError(f"miss share {share}: expected a fraction in [0, 1]")
        self.fixed = share
        self.carry = 0.0
        self._cpu = [0.0, 0.0]  # decayed (bytes, seconds)
        self._gpu = [0.0, 0.0]
        self.n_cpu = 0  # misses given to each side, in total
        self.n_gpu = 0

    @staticmethod
    def _rate(acc: list[float]) -> float | None:
        return acc[0] / acc[1] if acc[1] > 0 else None

    @property
    def cpu_bytes_per_s(self) -> float | None:
        return self._rate(self._cpu)

    @property
    def gpu_bytes_per_s(self) -> float | None:
        return self._rate(self._gpu)

    @property
    def share(self) -> float:
        """The CPU's fraction of the misses now."""
        if self.fixed is not None:
            return self.fixed
        c, g = self.cpu_bytes_per_s, self.gpu_bytes_per_s
        if c is None or g is None:
            return SHARE_START
        return min(SHARE_MAX, max(SHARE_MIN, c / (c + g)))

    def pick(self, missed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cpu, gpu): positions in `missed` (a layer's missed expert ids, in router order) that
        each side computes; the CPU takes the first ones."""
        n = len(missed)
        want = self.share * n + self.carry
        n_cpu = min(n, max(0, int(np.floor(want + 0.5))))
        self.carry = want - n_cpu if n else self.carry
        self.n_cpu += n_cpu
        self.n_gpu += n - n_cpu
        idx = np.arange(n)
        return idx[:n_cpu], idx[n_cpu:]

    def record_cpu(self, n_bytes: float, seconds: float) -> None:
        _decayed_add(self._cpu, n_bytes, seconds)

    def record_gpu(self, n_bytes: float, seconds: float) -> None:
        _decayed_add(self._gpu, n_bytes, seconds)

    def summary(self) -> dict:
        """What the split did (the bench's JSON)."""
        n = self.n_cpu + self.n_gpu
        return {"share_setting": "measured" if self.fixed is None else self.fixed,
                "share_now": self.share, "cpu_fraction_of_misses": self.n_cpu / n if n else None,
                "cpu_gb_per_s": _gb(self.cpu_bytes_per_s),
                "gpu_gb_per_s": _gb(self.gpu_bytes_per_s),
                "n_cpu": self.n_cpu, "n_gpu": self.n_gpu}


def _decayed_add(acc: list[float], n_bytes: float, seconds: float) -> None:
    if seconds <= 0 or n_bytes <= 0:
        return
    acc[0] = acc[0] * DECAY + n_bytes
    acc[1] = acc[1] * DECAY + seconds


def _gb(rate: float | None) -> float | None:
    return None if rate is None else rate / 1e9


class MappedShare:
    """The GPU's part of a hybrid layer: the one-row table staged on the host and copied into
    the router logits' bytes, the launch, and its timing (see the module doc)."""

    def __init__(self, m, split: MissShare):
        from numba import cuda

        s, a = m.shape, m.acts
        self.m = m
        self.split = split
        self.n_expert = s.n_expert
        self.table_host = cuda.pinned_array((1, s.n_expert), np.int32)  # [1, n_expert] i32
        # [1, n_expert] i32 over the router's logits (free after the top-k, until the next router)
        self.table = a["router_logits"][0:1].view(np.int32)
        k = s.n_expert_used
        part = a["attn_part_o"].reshape(a["attn_part_o"].size).view(np.uint8)
        if part.size < 16 + 4 * k:
            raise ValueError(f"the attention partials ({part.size} bytes) cannot hold the hybrid "
                             f"miss path's scratch ({16 + 4 * k} bytes)")
        self.counters = part[:16].view(np.int64).reshape(1, 2)  # [1, 2] i64, never read
        self.miss_list = part[16:16 + 4 * k].view(np.int32)  # [k] i32, never read
        self.t0, self.t1 = cuda.event(), cuda.event()  # timing events
        self._pending = 0  # bytes of the part last timed, not yet read

    def send(self, layer: int, experts: np.ndarray, stream) -> None:
        """Stage layer `layer`'s table naming `experts` (the GPU's misses) and copy it."""
        self.collect()
        self.table_host[0, :] = -1
        self.table_host[0, experts] = experts
        self.t0.record(stream)
        self.table.copy_to_device(self.table_host, stream=stream)

    def launched(self, n_bytes: int, stream) -> None:
        """After the launch of `n_bytes` of experts: time it (read at the next `send` or
        `collect`)."""
        self.t1.record(stream)
        self._pending = n_bytes

    def launch(self, layer: int, stream) -> None:
        """The GPU's part of `layer` added into the residual (what a graph piece captures)."""
        from strata.cuda_kernels.moe import moe_decode
        from strata.engine.cuda.mixed import MixedLayout, moe_decode_mixed

        m, a, n = self.m, self.m.acts, self.m.shape.n_embd
        x, ids, w = a["normed"].reshape(n), a["topk_ids"][0], a["topk_weights"][0]
        layout = m.layouts[layer]
        if isinstance(layout, MixedLayout):
            moe_decode_mixed(x, ids, w, layer=0, layout=layout, **self._where(layer, stream))
        else:
            moe_decode(x, ids, w, layer=0, layout=layout, accumulate=True,
                       **self._where(layer, stream))

    def collect(self) -> None:
        """Fold the last part's time into the GPU's rate (its events are done by then: the
        host waited for a later fetch on the same stream, or waits here)."""
        if self._pending > 0:
            self.t1.synchronize()
            ms = self.t0.elapsed_time(self.t1)
            self.split.record_gpu(self._pending, ms / 1e3)
        self._pending = 0

    def _where(self, layer: int, stream) -> dict:
        m, a = self.m, self.m.acts
        return dict(out=a["hidden"].reshape(m.shape.n_embd), slot_table=self.table,
                    cache=m.host.device, slot_off=a["host_off"][layer],
                    host=m.host.device, host_off=a["host_off"][layer:layer + 1],
                    h=a["moe_h"][0], miss_list=self.miss_list, counters=self.counters,
                    cpu_misses=True, stream=stream)
