"""`SplitModel`: a model loaded over several GPUs by its split plan — one stage per GPU, each a
`CudaModel` of its own layers in its own arena (its layers' dense weights and KV, its own expert
cache over its own layers' pairs), one host expert store mapped into every GPU, and the links
that hand the hidden state from stage to stage.

The plan is made first (`strata.plan.split.plan_split`, against each card's free VRAM capped at
its `--gpu-mem`), then every stage is opened on its GPU from its part of the plan: nothing is
re-derived at load.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any, Self

from numba import cuda

from strata.engine.cuda.hostmem import progress_bar
from strata.engine.cuda.model import CudaModel, capped_device, check_kernel_shape
from strata.engine.cuda.options import CudaEngineError, CudaOptions
from strata.engine.multi.handoff import Link
from strata.engine.multi.hostmap import PortableHost
from strata.experts import build_store, profile_source
from strata.gguf import ModelFile
from strata.plan.host import probe_host_memory, store_shortfall
from strata.plan.knobs import load_profile
from strata.plan.result import Plan
from strata.plan.split import SplitOptions, SplitPlan, Stage, plan_split

Log = Callable[[str], None]


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def stage_plan(sp: SplitPlan, st: Stage, device: int) -> Plan:
    """A stage's part of the split plan as the single-device plan its arena is opened from
    (`device`: the CUDA device id it runs on)."""
    dp = st.device_plan
    dp = dataclasses.replace(dp, device=dataclasses.replace(dp.device, index=device))
    kv = dataclasses.replace(sp.kv, vram_bytes=dp.regions["kv"])
    return Plan(True, (dp,), sp.request, st.prefill, kv, st.predicted_hit_rate,
                sp.hit_rate_model, None, sp.options, sp.token_embd, sp.notes, sp.warnings,
                sp.shape, sp.profile)


class SplitModel:
    """The stages of a layer split (see the module doc). `report` holds what loading measured."""

    def __init__(self, model: ModelFile, options: CudaOptions, split: SplitOptions, *,
                 devices: Sequence[int], gpu_mem: Sequence[int | None] | None = None,
                 backends: Sequence[Any] | None = None, log: Log | None = _log,
                 store: tuple[Any, PortableHost] | None = None):
        """`store`: a (HostStore, PortableHost) of this model from an earlier load, reused."""
        if model.arch != "qwen3moe":
            raise CudaEngineError(f"{model.path}: the CUDA engine runs qwen3moe, not {model.arch}")
        check_kernel_shape(model.shape, options.plan.kv_type)
        self.file, self.options, self.log = model, options, log or (lambda text: None)
        self.shape = s = model.shape
        self.devices = [int(d) for d in devices]
        self.report: dict[str, Any] = {}
        self._shared = False
        self._closed = False
        backends = list(backends) if backends is not None else [None] * len(self.devices)
        caps = list(gpu_mem) if gpu_mem is not None else [None] * len(self.devices)
        if not len(self.devices) == len(backends) == len(caps):
            raise CudaEngineError(f"{len(self.devices)} GPUs, {len(caps)} --gpu-mem sizes")
        self.profile = load_profile(model.metadata, s.n_layer, s.n_expert, options.profile_path,
                                    model.path)
        self.report["profile"] = profile_source(model.metadata, options.profile_path)
        self.backends, infos = [], []
        for i, (b, d, c) in enumerate(zip(backends, self.devices, caps)):
            with cuda.gpus[d] if not _sim() else _null():  # each card read in its own context
                b = b if b is not None else self._backend(d)
                infos.append(dataclasses.replace(capped_device(b, c), index=i))
            self.backends.append(b)
        self.plan = plan_split(s, infos, options.plan, split, profile=self.profile)
        if not self.plan.accepted:
            raise CudaEngineError(self.plan.refusal.message())
        if store is None:
            why = store_shortfall(self.plan.host_store_bytes, probe_host_memory())
            if why is not None:  # before the store, the one large host allocation
                raise CudaEngineError(why)
            self._load_store(model)
        else:
            self.store, self.portable = store
            self._shared = True
        self.stages: list[CudaModel] = []
        self.links: list[Link] = []
        self.back: Link | None = None
        self.tiers: list = [None] * len(self.devices)
        self._open_all(model, options)
        self._describe()

    def _open_all(self, model: ModelFile, options: CudaOptions) -> None:
        try:
            self._open_stages(model, options)
        except BaseException:
            self.close()  # what opened so far, the store's registration last
            raise

    def _open_stages(self, model: ModelFile, options: CudaOptions) -> None:
        for st, dev, b in zip(self.plan.stages, self.devices, self.backends):
            with _on(dev):
                m = CudaModel(model, dataclasses.replace(options, device=dev), backend=b,
                              log=self.log, host_store=(self.store, self.portable.mapped()),
                              plan=stage_plan(self.plan, st, dev), layers=st.layers)
            self.stages.append(m)
        handoff = self.plan.split.handoff
        self.links = [self._link(g, handoff) for g in range(len(self.stages) - 1)]
        self.back = Link(self.devices[-1], self.devices[0], self.stages[-1].stream,
                         self.stages[0].stream, max_bytes=4,
                         handoff=handoff) if len(self.stages) > 1 else None
        if any(st.tier is not None for st in self.plan.stages):
            from strata.engine.multi.tiers import attach_tiers, fill_tiers
            self.report["tier_pairs_filled"] = fill_tiers(self)
            self.tiers = attach_tiers(self)

    def _link(self, g: int, handoff: str) -> Link:
        """Stage g's hidden state into stage g+1's: big enough for a prompt chunk's and for
        the logits buffer `measure_links` times."""
        n = max(self._hidden_bytes(), int(self.stages[g].acts["logits"].nbytes))
        return Link(self.devices[g], self.devices[g + 1], self.stages[g].stream,
                    self.stages[g + 1].stream, max_bytes=n, handoff=handoff)

    @staticmethod
    def _backend(device: int):
        from strata.memory.numba_backend import NumbaBackend
        return NumbaBackend(device)

    def _hidden_bytes(self) -> int:
        return int(self.stages[0].arena.device_plan.prompt.region("hidden").n_bytes) \
            if self.stages[0].arena.device_plan.prompt is not None else self.shape.n_embd * 4

    def _load_store(self, model: ModelFile) -> None:
        on_host = self.plan.token_embd == "host"
        with progress_bar("expert store", 1, self.options.progress) as update:
            self.store = build_store(model, with_embd=on_host,
                                     progress=lambda d, t: update(d / max(t, 1)))
        with cuda.gpus[self.devices[0]] if not _sim() else _null():
            self.portable = PortableHost(self.store.buffer)
        self.report.update(store_bytes=self.store.n_bytes,
                           store_fill_seconds=self.store.fill_seconds,
                           store_register_seconds=self.portable.seconds)

    def _describe(self) -> None:
        pl = self.plan.placement
        self.log(f"layer split {','.join(map(str, pl.cuts))} ({pl.how}): "
                 + "; ".join(f"GPU {d} layers {lo}-{hi - 1}" for d, (lo, hi)
                             in zip(self.devices, pl.ranges)))
        for g, (m, st) in enumerate(zip(self.stages, self.plan.stages)):
            dp = m.arena.device_plan
            self.log(f"GPU {self.devices[g]}: arena {dp.arena_bytes / 2**20:.0f} MiB, dense "
                     f"weights {dp.regions['weights'] / 2**20:.0f} MiB (the carve frees "
                     f"{(st.weight_bytes_whole - dp.regions['weights']) / 2**20:.0f} MiB), "
                     f"stage cache {dp.cache.n_slots} slots")
        for g, link in enumerate(self.links):
            a, b = self.stages[g].acts["hidden"], self.stages[g + 1].acts["hidden"]
            t = link.measure(b, a, n_bytes=int(a.nbytes), repeats=10)
            forced = " (--handoff host)" if self.plan.split.handoff == "host" else ""
            self.log(f"hidden state GPU {link.src} -> GPU {link.dst}: {link.how}{forced}, "
                     f"{t['bytes']:,} B per token in {t['seconds'] * 1e6:.0f} us")
        for g, st in enumerate(self.plan.stages):
            if st.tier is not None:
                users = [self.devices[h] for h, t in enumerate(self.tiers)
                         if t is not None and g in t.reached]
                self.log(f"GPU {self.devices[g]}: helper tier {st.tier.n_slots} pairs, read by "
                         f"the stages on GPU {', '.join(map(str, users)) or 'none'}")

    def measure_links(self) -> list[dict]:
        """Each link's measured copy time for one decode token's hidden state and for a larger
        block (the last stage's logits buffer, before anything has been computed), on the path
        it uses (`how`, `token`, `block`) and on every path the two GPUs offer (`paths`:
        "peer-to-peer" where they reach each other, "pinned host" always; a temporary link for
        the one not in use): what `report["links"]` records. Run between steps, not during."""
        out = []
        for g, link in enumerate(self.links):
            paths = {link.how: self._time_link(g, link)}
            for handoff in ("auto", "host"):
                alt = self._link(g, handoff)
                try:
                    if alt.how not in paths:
                        paths[alt.how] = self._time_link(g, alt)
                finally:
                    alt.close()
            out.append({"src": link.src, "dst": link.dst, "how": link.how, **paths[link.how],
                        "paths": paths})
        self.report["links"] = out
        return out

    def _time_link(self, g: int, link: Link) -> dict:
        a, b = self.stages[g].acts, self.stages[g + 1].acts
        return {"token": link.measure(b["hidden"], a["hidden"], n_bytes=int(a["hidden"].nbytes)),
                "block": link.measure(b["logits"], a["logits"], n_bytes=int(a["logits"].nbytes))}

    def close(self) -> None:
        """Give everything back, once (idempotent), in an order that frees nothing still read:
        every stage's streams drained; the links' pinned staging freed; each stage's arena
        released on its own GPU; then the store's registration ended, only by the model that
        made it (a store passed in is its owner's to close, after every model using it)."""
        if self._closed:
            return
        self._closed = True
        stages = getattr(self, "stages", [])
        for m, dev in zip(stages, self.devices):
            with _on(dev):
                m.stream.synchronize()
                m.copy_stream.synchronize()
        for link in [*getattr(self, "links", []), getattr(self, "back", None)]:
            if link is not None:
                link.close()
        for m, dev in zip(stages, self.devices):
            with _on(dev):
                m.close()
        portable = getattr(self, "portable", None)
        if not self._shared and portable is not None:
            with _on(self.devices[0]):
                portable.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _on(device: int):
    """The device's context (a no-op under the simulator)."""
    return _null() if _sim() else cuda.gpus[device]


def _sim() -> bool:
    from strata.cuda_kernels.intrinsics import SIMULATED
    return SIMULATED


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

