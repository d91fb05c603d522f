"""`CudaModel`: a model loaded by its plan, once — the arena (one device allocation), the dense
weights copied into it, every expert in a registered host store, the expert cache filled in rank
order, and typed views of every buffer the decode and prompt paths use.

Nothing here allocates device memory outside the arena: KV sides, split-K partials, routing
arrays and the slot table are all views of the plan's regions.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from numba import cuda

from strata.cuda_kernels.kvcache import KvLayout, KvSide
from strata.cuda_kernels.moe import ExpertLayout
from strata.cuda_kernels.ring import CudaRingOps
from strata.cuda_kernels.tables import install as install_tables
from strata.cuda_kernels.tables import uninstall as uninstall_tables
from strata.engine.cuda.mixed import MixedLayout, check_prefill_room
from strata.engine.cuda.file_slots import FileSlots
from strata.engine.cuda.hostmem import MappedHost, device_address, map_host, progress_bar, upload
from strata.engine.cuda.options import CudaEngineError, CudaOptions
from strata.experts import ExpertCache, build_store, profile_source
from strata.experts.adaptive import AdaptiveRanks
from strata.gguf import ModelFile
from strata.memory import open_arena
from strata.memory.arena import Arena, live_device_info
from strata.memory.kv_map import KvMap
from strata.plan import plan as make_plan
from strata.plan.devices import DeviceInfo, fmt_bytes
from strata.plan.host import probe_host_memory, store_bytes, store_shortfall
from strata.plan.knobs import load_profile
from strata.quant.planar import planar_tensor, vram_type

F32_TYPE = 0
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp")
NORMS = ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm")

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Matrix:
    """A quantized matrix in VRAM: raw bytes (uint8 view), GGML type, [n_rows, n_cols]."""

    data: Any
    ggml_type: int
    n_rows: int
    n_cols: int


class SlotWriter:
    """The expert cache's device side (`strata.experts.CacheDevice`): the slot table and the
    slots' bytes, written on the compute stream so kernels see changes in order."""

    def __init__(self, table, cache, slot_offset: np.ndarray, store, stream):
        self.table, self.cache, self.slot_offset = table, cache, slot_offset
        self.store, self.stream = store, stream

    def write_table(self, table: np.ndarray) -> None:
        self.table.copy_to_device(np.ascontiguousarray(table, np.int32), stream=self.stream)

    def load(self, slot: int, layer: int, expert: int) -> None:
        blob = self.store.blob(layer, expert)
        off = int(self.slot_offset[slot])
        self.cache[off:off + blob.size].copy_to_device(blob, stream=self.stream)


def _stored(model: ModelFile, name: str) -> np.ndarray:
    """A dense tensor's bytes as the arena holds them: GGUF's, or its planar layout's
    (`strata.quant.planar`; `Matrix.ggml_type` then names the planar type)."""
    raw = model.raw(name)
    p = planar_tensor(name, model.tensors[name].ggml_type)
    return raw if p is None else p.pack(raw)


def check_kernel_shape(shape, kv_type: str) -> None:
    """Refuse head sizes the attention kernels cannot read: a lane reads head_dim / 32 values of a
    cache row, a count that must divide 32, be even for f16 rows and a multiple of 4 for int8 and
    q4_0 rows (whole 32-bit words)."""
    d, rem = divmod(shape.head_dim, 32)
    step = 2 if kv_type == "f16" else 4
    if rem or d == 0 or 32 % d or d % step:
        ok = "64, 128, 256" if kv_type == "f16" else "128, 256"
        raise CudaEngineError(f"head_dim {shape.head_dim} with --kv {kv_type}: the CUDA attention "
                              f"kernels take head_dim {ok} (the CPU backend runs any)")


def _kernel_layout(shape, lay):
    """The MoE kernels' view of a layer's blob: the fused kernels' `ExpertLayout`, or the
    engine's `MixedLayout` where gate and up differ in format."""
    if not lay.mixed:
        return ExpertLayout(shape.n_embd, shape.n_ff_expert, lay.gate_type, lay.down_type)
    try:
        check_prefill_room(shape.n_embd, shape.n_ff_expert)
    except ValueError as e:
        raise CudaEngineError(str(e)) from None
    return MixedLayout(shape.n_embd, shape.n_ff_expert, lay.gate_type, lay.up_type,
                       lay.down_type, lay.up_off, lay.down_off)


def capped_device(backend, gpu_mem: int | None) -> DeviceInfo:
    """The live device, its free memory capped at `gpu_mem` (a smaller card's budget)."""
    name = "GPU"
    try:
        name = cuda.get_current_device().name
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # the simulator's device has no usable name
        pass
    live = live_device_info(backend, name=name)
    if gpu_mem is None:
        return live
    free = min(live.free_bytes, gpu_mem)
    return dataclasses.replace(live, name=f"{live.name} (capped at {fmt_bytes(gpu_mem)})",
                               free_bytes=free, total_bytes=max(free, min(live.total_bytes,
                                                                            gpu_mem)))


class CudaModel:
    """Everything the CUDA engine loads once (see the module doc). `report` holds what loading
    measured (bytes, seconds, GB/s, where misses are served)."""

    def __init__(self, model: ModelFile, options: CudaOptions | None = None, *,
                 backend=None, log: Log | None = None, host_store=None, plan=None,
                 layers: tuple[int, int] | None = None):
        """`host_store`: a (HostStore, MappedHost) pair of this model from an earlier load,
        reused instead of filling and registering a new one (the bench's many plans of one
        file; see `share_store`). `plan` and `layers`: one stage of a layer split — its
        accepted single-device plan (used as is, never re-planned) and the layers [lo, hi) it
        runs; it loads only what its plan's regions name (its layers' dense weights and KV)."""
        if model.arch != "qwen3moe":
            raise CudaEngineError(f"{model.path}: the CUDA engine runs qwen3moe, not {model.arch}")
        self.file = model
        self.options = options = options or CudaOptions()
        check_kernel_shape(model.shape, options.plan.kv_type)
        self.log = log or (lambda text: None)
        self.shape = s = model.shape
        self.report: dict[str, Any] = {}
        self._shared_store = host_store
        self._given_plan = plan
        self.layers = (0, s.n_layer) if layers is None else (int(layers[0]), int(layers[1]))
        if not 0 <= self.layers[0] < self.layers[1] <= s.n_layer or (plan is None) != (
                layers is None):
            raise CudaEngineError(f"a stage needs its plan and a layer range inside "
                                  f"[0, {s.n_layer}), got layers {layers}")
        if backend is None:
            from strata.memory.numba_backend import NumbaBackend
            backend = NumbaBackend(options.device)
        self._plan_and_open(model, backend)
        self.stream = cuda.stream()
        self.copy_stream = cuda.stream()
        self.ring_ops = CudaRingOps()  # the prompt ring's events, made once for every prompt
        self._prompt_rows = None  # pinned host rows of the prompt path (prompt_host_rows)
        self.acts = self.arena.views("activations")
        install_tables(self.acts["format_tables"], stream=self.stream)  # before any launch
        # block counters of fused kernels and the token choice's state: from zero
        for name in ("router_done", "moe_sync", "pick_state"):
            counter = self.acts[name]
            counter.copy_to_device(np.zeros(counter.shape, counter.dtype), stream=self.stream)
        self._carve_kv()
        self._load_weights(model)
        self._load_experts(model)
        self.layouts = tuple(_kernel_layout(s, lay) for lay in self.store.layouts)
        self.stream.synchronize()

    # -- plan and arena ----------------------------------------------------------------------

    def _plan_and_open(self, model: ModelFile, backend) -> None:
        s, o = self.shape, self.options
        profile = load_profile(model.metadata, s.n_layer, s.n_expert, o.profile_path, model.path)
        self.profile = profile
        self.report["profile"] = profile_source(model.metadata, o.profile_path)
        if self._given_plan is not None:
            planned = self._given_plan
        else:
            planned = make_plan(s, [capped_device(backend, o.gpu_mem)], o.plan, profile=profile)
        if not planned.accepted:
            raise CudaEngineError(planned.refusal.message())
        self._store_checked = 0  # bytes of host store checked against the machine's memory
        if self._shared_store is None:  # before any allocation: the store is the big one
            self._check_store(planned.host_store_bytes)
        if planned.kv.host_bytes > 0 and self._given_plan is not None:
            raise CudaEngineError("KV streamed from host memory (--kv-resident below the "
                                  "context) runs on one GPU, not on a stage of a layer split")
        t0 = time.perf_counter()
        # a stage's plan covers its layers only: a post-touch shortfall is refused, not re-planned
        shrinks = {} if self._given_plan is None else {"max_shrinks": 0}
        self.arena: Arena = open_arena(planned, backend, **shrinks)
        self.plan = self.arena.plan  # after any post-touch shrink
        self.report["arena_bytes"] = self.arena.device_plan.arena_bytes
        self.report["arena_seconds"] = time.perf_counter() - t0
        for note in self.arena.notes:
            self.log(note)

    def region_offset(self, family: str, name: str | None = None) -> int:
        """Byte offset of a region (or of one of its sub-regions) inside the arena."""
        top = self.arena.device_plan.arena.region(family)
        return top.offset + (top.sub.region(name).offset if name else 0)

    def arena_offset(self, view) -> int:
        """Byte offset of a view of the arena from the arena's start."""
        return device_address(view) - device_address(self.arena.buffer)

    def _raw(self, offset: int, dtype: str, shape: tuple[int, ...]):
        return self.arena.backend.view(self.arena.buffer, offset, dtype, shape)

    # -- KV ------------------------------------------------------------------------------------

    def _carve_kv(self) -> None:
        s, p = self.shape, self.plan
        kv = self.arena.views("kv")
        lo, hi = self.layers
        streamed = p.kv.host_bytes > 0
        # [L, n_seq * T, H, row]: a batch engine cuts it into n_seq regions of T tokens; streamed
        # KV (one sequence): each layer side one mapped range of the whole context
        n_ctx = p.kv.max_context if streamed else p.kv.resident_tokens * p.kv.n_seq
        lay = KvLayout(p.options.kv_type, n_ctx, s.n_head_kv, s.head_dim)
        # f16 and q4_0 sides have no scales; the kernels take a float16 placeholder never read
        spare = self._raw(self.region_offset("activations", "hidden"), "float16", (1,))
        self.kv_layout = lay
        self.kv_map = None
        if streamed:
            self.kv_map = KvMap(2 * (hi - lo), n_ctx * lay.token_rows_bytes,
                                p.kv.resident_tokens * lay.token_rows_bytes,
                                device=self.options.device)
            self._check_reserve_after_map()
            self.log(f"KV: {p.kv.resident_tokens} of {n_ctx} tokens in VRAM, the rest in "
                     f"{self.kv_map.host_bytes / 2**30:.2f} GiB of host memory "
                     f"({self.kv_map.how})")
        self.kv_sides: list[Any] = [None] * s.n_layer  # a stage's KV holds layers [lo, hi)
        for il in range(lo, hi):
            sides = []
            for j, side in enumerate(("k", "v")):
                scale = kv[side + "_scale"][il - lo].reshape(-1) if lay.fmt == "int8" else spare
                data = (self.kv_map.views[2 * (il - lo) + j] if streamed
                        else kv[side][il - lo].reshape(-1))
                sides.append(KvSide(lay, data, scale))
            self.kv_sides[il] = tuple(sides)

    def _check_reserve_after_map(self) -> None:
        """The mapped KV's VRAM rows are allocated after the arena was validated: the card must
        still hold the plan's reserve (another process may have taken memory since)."""
        free, _ = self.arena.backend.memory_info()
        reserve = self.arena.device_plan.reserve_bytes
        if free < reserve:
            self.kv_map.close()
            raise CudaEngineError(f"after mapping the streamed KV's VRAM rows the GPU has "
                                  f"{free / 2**20:.0f} MiB free, under the plan's reserve of "
                                  f"{reserve / 2**20:.0f} MiB: free VRAM, or lower "
                                  f"--kv-resident")

    # -- dense weights -------------------------------------------------------------------------

    def _load_weights(self, model: ModelFile) -> None:
        s = self.shape
        layout = self.arena.device_plan.arena.region("weights").sub
        for r in layout.regions:  # the OS reads them ahead while the first are copied
            model.prefetch(r.name)
        pieces = [(self.arena.view("weights", r.name), _stored(model, r.name))
                  for r in layout.regions]
        n, secs = upload(pieces, self.stream, progress=self.options.progress)
        self.report.update(weights_bytes=n, weights_seconds=secs,
                           weights_gb_per_s=n / max(secs, 1e-9) / 1e9)
        self.log(f"dense weights: {n / 1e9:.2f} GB copied in {secs:.2f} s "
                 f"({n / max(secs, 1e-9) / 1e9:.1f} GB/s, pinned staging)")
        lo, hi = self.layers
        last = hi == s.n_layer
        self.norms: dict[str, Any] = {}
        for name in ["output_norm"] * last + [f"blk.{il}.{n}" for il in range(lo, hi)
                                              for n in NORMS]:
            t = model.tensors[name + ".weight"]
            if t.ggml_type != F32_TYPE:
                raise CudaEngineError(f"{name}.weight is {t.qtype.name}; the CUDA engine reads "
                                      f"norm weights as F32")
            self.norms[name] = self.arena.view("weights", name + ".weight").view(np.float32)
        self.matrices: dict[str, Matrix] = {}
        for il in range(lo, hi):
            for n in MATRICES:
                self.matrices[f"blk.{il}.{n}"] = self._matrix(model, f"blk.{il}.{n}.weight")
        head = "output.weight" if "output.weight" in model.tensors else "token_embd.weight"
        if last:
            self.matrices["output"] = self._matrix(model, head)

    def _matrix(self, model: ModelFile, name: str) -> Matrix:
        t = model.tensors[name]
        return Matrix(self.arena.view("weights", name), vram_type(name, t.ggml_type), t.ne[1],
                      t.ne[0])

    # -- experts -------------------------------------------------------------------------------

    def _check_store(self, n_bytes: int) -> None:
        """Refuse a host store of n_bytes this machine cannot give (once per size)."""
        if n_bytes > self._store_checked:
            why = store_shortfall(n_bytes, probe_host_memory())
            if why is not None:
                raise CudaEngineError(why)
            self._store_checked = n_bytes

    def _load_experts(self, model: ModelFile) -> None:
        s, p, o = self.shape, self.plan, self.options
        on_host = p.token_embd == "host"
        # the plan after the arena opened (a post-touch shrink leaves misses), and the cache's
        # swaps (--adaptive-cache) read experts from host memory too
        experts = p.keeps_experts or o.adaptive_cache
        if self._shared_store is not None:
            self.store, self.host = self._shared_store
            if on_host and self.store.embd_off < 0:
                raise CudaEngineError("the shared host store has no token embedding; the plan "
                                      "looks it up in host memory")
            if experts and not self.store.has_experts:
                raise CudaEngineError("the shared host store keeps no experts; this plan reads "
                                      "experts from host memory")
        else:
            self._check_store(store_bytes(s, on_host, experts))  # larger than planned?
            with progress_bar("expert store", 1, o.progress) as update:
                self.store = build_store(model, with_embd=on_host, experts=experts,
                                         progress=lambda d, t: update(d / max(t, 1)))
            self.host: MappedHost = map_host(self.store.buffer)
        self.report.update(store_bytes=self.store.n_bytes, store_fill_seconds=self.store.fill_seconds,
                           store_register_seconds=self.host.seconds, store_memory=self.host.how,
                           store_experts=self.store.has_experts)
        if self.store.has_experts:
            self.log(f"expert store: {self.store.n_bytes / 1e9:.2f} GB of host memory, filled in "
                     f"{self.store.fill_seconds:.2f} s, {self.host.how} in "
                     f"{self.host.seconds:.2f} s; decode misses read it zero-copy (mapped), the "
                     f"prompt path copies through the ring")
        else:
            self.log(f"expert store: none (the VRAM cache holds every expert and the prompt path "
                     f"never borrows it: the cache is filled from the file); "
                     f"{self.store.n_bytes / 1e9:.2f} GB of host memory for token_embd's rows")
        embd = model.tensors["token_embd.weight"]
        if on_host:
            n = embd.n_rows * embd.row_bytes
            off = self.store.embd_off
            self.embd_table = self.host.device[off:off + n].reshape(embd.n_rows, embd.row_bytes)
        elif self.layers[0] == 0:
            self.embd_table = self.arena.view("weights", "token_embd.weight").reshape(
                embd.n_rows, embd.row_bytes)
        else:  # a later stage of a split starts from the previous stage's hidden state
            self.embd_table = None
        self.embd_type = embd.ggml_type
        self.acts["host_off"].copy_to_device(self.store.host_off, stream=self.stream)
        cache_layout = self.arena.device_plan.cache
        self.cache_base = self.region_offset("expert_cache")
        if cache_layout.total_bytes:
            self.cache_bytes = self.arena.cache_bytes()
        else:  # no slot: the kernels take a stand-in that the all-miss table never lets them read
            self.cache_bytes = self._raw(self.region_offset("activations", "hidden"), "uint8",
                                         (256,))
        slot_off = np.zeros(s.n_layer * s.n_expert, np.int64)  # [n_layer * n_expert] int64
        slot_off[:cache_layout.n_slots] = cache_layout.slot_offset
        self.acts["slot_off"].copy_to_device(slot_off, stream=self.stream)
        if self.store.has_experts:
            writer = SlotWriter(self.acts["slot_table"], self.cache_bytes,
                                cache_layout.slot_offset, self.store, self.stream)
        else:
            writer = FileSlots(model, self.store.layouts, self.acts["slot_table"],
                               self.cache_bytes, cache_layout.slot_offset, self.stream,
                               self.layers)
        self.cache = ExpertCache(cache_layout, s.n_layer, s.n_expert, writer)
        # --adaptive-cache: prompts' routing counts re-rank the cache after each prompt
        self.adaptive = AdaptiveRanks(s.n_layer, s.n_expert) if o.adaptive_cache else None
        # Where the MoE kernels read resident experts: the arena (offsets from its first byte).
        # A layer split's stage with helper tiers widens it to a window over the tiers it
        # reaches (strata.engine.multi.tiers): the arena then starts `window_shift` bytes in,
        # and `tier_off` [n_layer, n_expert] int64 holds a tier-held pair's window offset.
        self.expert_window = self.arena.buffer
        self.window_shift = 0
        self.tier_off: np.ndarray | None = None
        t0 = time.perf_counter()
        n = self.cache.fill()
        self.stream.synchronize()
        if isinstance(writer, FileSlots):
            writer.release()
        secs = time.perf_counter() - t0
        n_bytes = int(cache_layout.slot_bytes.sum())
        self.report.update(cache_slots=cache_layout.n_slots, cache_fill_seconds=secs,
                           cache_bytes=n_bytes, predicted_hit_rate=p.predicted_hit_rate)
        hit = "n/a" if p.predicted_hit_rate is None else f"{p.predicted_hit_rate:.1%}"
        self.log(f"expert cache: {n} of {s.n_layer * s.n_expert} experts in {cache_layout.n_slots}"
                 f" slots ({n_bytes / 1e9:.2f} GB, {n_bytes / max(secs, 1e-9) / 1e9:.1f} GB/s), "
                 f"ranked by {self.report['profile']}; predicted decode hit rate {hit}")

    def prompt_host_rows(self) -> tuple[Any, Any]:
        """Pinned host rows the prompt path uses for a layer that runs without the count sync,
        allocated at the first prompt that needs them and kept (one pinned allocation, not one
        per prompt; prompts run one at a time, each chunk syncing before the next):
          counts [layers of this stage, n_expert + 1] i32: its expert counts, read back without a
            sync (a copy to pageable memory waits for the stream);
          offsets [layers of this stage, 3, n_expert] i64: its experts' weight offsets, sent from
            here because a copy from pageable memory waits for the stream to drain before it
            starts (that would put the sync back); a row per layer, so none is rewritten before
            its copy lands.
        Host memory: not in the plan's VRAM."""
        if self._prompt_rows is None:
            n, e = self.layers[1] - self.layers[0], self.shape.n_expert
            self._prompt_rows = (cuda.pinned_array((n, e + 1), np.int32),
                                 cuda.pinned_array((n, 3, e), np.int64))
        return self._prompt_rows

    def held(self, layer: int) -> np.ndarray:
        """[n_expert] bool: experts of `layer` in VRAM (the cache's slots or a helper tier)."""
        mask = self.cache.resident(layer)
        return mask if self.tier_off is None else mask | (self.tier_off[layer] >= 0)

    def held_offsets(self, layer: int, experts: np.ndarray) -> np.ndarray:
        """[len(experts)] int64 offsets in `expert_window` of held experts of `layer`."""
        experts = np.asarray(experts, np.int64)
        slots = self.cache.table[layer, experts]
        own = np.zeros(len(experts), np.int64)
        if self.cache.layout.n_slots:
            own = self.window_shift + self.cache_base + self.cache.layout.slot_offset[
                np.maximum(slots, 0)]
        if self.tier_off is None:
            return own.astype(np.int64)
        return np.where(slots >= 0, own, self.tier_off[layer, experts]).astype(np.int64)

    def share_store(self) -> tuple[Any, MappedHost]:
        """This model's (HostStore, MappedHost), for `CudaModel(..., host_store=...)`."""
        return self.store, self.host

    def close(self) -> None:
        """Give the arena and the streamed KV's mapping back (a shared host store stays
        registered)."""
        acts = getattr(self, "acts", None)
        if acts is not None:  # tables live in the arena: forget them before it goes
            uninstall_tables(acts["format_tables"])
        if getattr(self, "kv_map", None) is not None:
            self.kv_sides = []
            self.kv_map.close()
        self.arena.close()
