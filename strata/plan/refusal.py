"""The knobs a refusal offers: each one a concrete flag, with the bytes it frees computed by the
same `minimum_bytes` the refusal's 'needed' comes from, largest effect first.

Where one knob alone can make room, its value is the gentlest that does (the largest context,
the most resident KV, the largest cache); where it cannot, the knob says so and offers a value
that frees a lot. `--prefill` never appears: an explicit chunk is reduced automatically, so the
refusals left are those where even a 256-token chunk does not fit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from strata.gguf.shape import ModelShape
from strata.plan.budget import fixed_layouts, minimum_bytes, resolve
from strata.plan.capability import KV_STREAM_NOTE
from strata.plan.devices import MiB, DeviceInfo
from strata.plan.layout import KV_TYPES, Q4_0_BLOCK
from strata.plan.options import PlanOptions
from strata.plan.profile import RoutingProfile
from strata.plan.result import Knob

RESERVE_MIN_MIB = 256  # the smallest reserve a knob suggests
KNOB_GRID = 1024  # tokens: suggested contexts and resident windows are multiples of this
NOT_ENOUGH = "not enough alone"


def largest(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The largest integer in [lo, hi] with ok (monotone: true below some point), or None."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class Pricer:
    """Prices a knob as the least VRAM the configuration needs with that one change (`price`:
    options -> bytes, the same function the refusal's 'needed' came from) against the short
    device's `free` bytes. The one-GPU refusal prices by `minimum_bytes`; a refused stage of a
    layer split by its stage's pricing, so both say what a knob really frees."""

    def __init__(self, options: PlanOptions, free: int, needed: int,
                 price: Callable[[PlanOptions], int],
                 fits_all: Callable[..., bool] | None = None):
        """fits_all(**change): where the short device is one of several (a layer split's
        stages), whether every one fits with the change; a knob that fits the short device
        alone but not another is 'not enough alone'."""
        self.options, self.free, self.needed, self.price = options, free, needed, price
        self.fits_all = fits_all

    def need(self, **change) -> int:
        return self.price(replace(self.options, **change))

    def fits(self, **change) -> bool:
        return self.need(**change) <= self.free

    def knob(self, flag: str, note: str = "", *, caveat: str = "", **change) -> Knob | None:
        """caveat: said after the note (or after NOT_ENOUGH where the knob alone falls short)."""
        freed = self.needed - self.need(**change)
        if freed <= 0:
            return None
        if not note and (self.needed - freed > self.free or (
                self.fits_all is not None and not self.fits_all(**change))):
            note = NOT_ENOUGH
        return Knob(flag, freed, "; ".join(n for n in (note, caveat) if n))

    def on_grid(self, flag: str, field: str, current: int, caveat: str = "",
                fits: Callable[[int], bool] | None = None) -> Knob | None:
        """The largest multiple of KNOB_GRID below `current` that fits (bisected: `fits` is
        monotone), else a quarter of it, not enough alone. `fits(value)`: by default this
        device's price; a layer split passes one that checks every stage, since a context is
        every stage's and a value only the short card fits would be refused on another."""
        ok = fits or (lambda v: self.fits(**{field: v}))
        top = (current - 1) // KNOB_GRID
        m = largest(1, top, lambda m: ok(m * KNOB_GRID))
        value = m * KNOB_GRID if m else max(KNOB_GRID, current // 4 // KNOB_GRID * KNOB_GRID)
        if value >= current:
            return None
        return self.knob(f"{flag} {value}", NOT_ENOUGH if m is None else "", caveat=caveat,
                         **{field: value})


def suggest_knobs(shape: ModelShape, dev: DeviceInfo, options: PlanOptions,
                  profile: RoutingProfile, needed: int) -> tuple[Knob, ...]:
    """Every knob that frees bytes, largest effect first; a second GPU (a layer split) last."""
    p = Pricer(options, dev.free_bytes, needed,
               lambda o: minimum_bytes(shape, dev, o, profile))
    s, _, _ = resolve(shape, dev, options)
    found = [
        p.on_grid("--max-context", "max_context", s.max_context),
        *kv_type_knobs(p, shape, options),
        # streamed KV serves one sequence on one GPU (`budget.resolve`)
        p.on_grid("--kv-resident", "kv_resident", s.resident_tokens, KV_STREAM_NOTE)
        if options.batch == 1 else None,
        reserve_knob(p, s.reserve_bytes, wddm=dev.is_wddm),
        p.knob("--spec 0 (no draft head)", spec=0) if options.spec else None,
        p.knob("--batch 1", batch=1) if options.batch > 1 else None,
        p.knob("drop --embd-on-gpu", embd_on_host=True) if not options.embd_on_host else None,
        _cache_knob(p, options),
    ]
    knobs = sorted((k for k in found if k is not None), key=lambda k: -k.frees_bytes)
    gpus = _more_gpus_knob(shape, dev, options)
    return tuple(knobs + ([gpus] if gpus else []))


def kv_type_knobs(p: Pricer, shape: ModelShape, options: PlanOptions) -> list[Knob | None]:
    lighter = KV_TYPES[KV_TYPES.index(options.kv_type) + 1:]
    if shape.head_dim % Q4_0_BLOCK:
        lighter = tuple(t for t in lighter if t != "q4_0")
    return [p.knob(f"--kv {t}", kv_type=t) for t in lighter]


def reserve_knob(p: Pricer, reserve: int, *, wddm: bool = False) -> Knob | None:
    """The largest whole-MiB reserve below `reserve` that fits alone, found by pricing each
    candidate (a value worked out from the shortfall in MiB is off by the shortfall's fraction
    of a MiB, and rounding it up leaves the plan a few hundred KiB short); the smallest reserve
    a knob suggests where none does."""
    if reserve <= RESERVE_MIN_MIB * MiB:
        return None
    top = -(-reserve // MiB) - 1  # whole MiB strictly below the current reserve
    mib = largest(RESERVE_MIN_MIB, top, lambda m: p.fits(vram_reserve_mib=m))
    mib = RESERVE_MIN_MIB if mib is None else mib
    # a caveat, not the note: a WDDM reserve that falls short still says 'not enough alone'
    wddm_caveat = "thin headroom under WDDM: see 'Prefer No Sysmem Fallback'" if wddm else ""
    return p.knob(f"--vram-reserve-mib {mib}", caveat=wddm_caveat, vram_reserve_mib=mib)


def _cache_knob(p: Pricer, options: PlanOptions) -> Knob | None:
    n = options.expert_cache
    if n is None or n == 0:
        return None
    k = largest(0, n - 1, lambda k: p.fits(expert_cache=k))
    if k is None:
        return p.knob("--expert-cache 0", expert_cache=0)
    return p.knob(f"--expert-cache {k}", expert_cache=k)


def _more_gpus_knob(shape: ModelShape, dev: DeviceInfo, options: PlanOptions) -> Knob | None:
    """A second GPU running half the layers: what this card would no longer hold (weights and
    KV of the other half). Layer split is a later feature, so the knob says so."""
    if shape.n_layer < 2:
        return None
    s, _, _ = resolve(shape, dev, options)
    half = shape.n_layer // 2

    def held(lo: int, hi: int) -> int:
        f = fixed_layouts(shape, s, options, lo=lo, hi=hi)
        return f["weights"].total_bytes + f["kv"].total_bytes

    whole = held(0, shape.n_layer)
    freed = whole - max(held(0, half), held(half, shape.n_layer))
    return (Knob("a second GPU", freed, "split the layers: --gpu-mem A,B (strata.plan.split)")
            if freed > 0 else None)


def knobs_for_shortfall(shape: ModelShape, dev: DeviceInfo, options: PlanOptions,
                        profile: RoutingProfile, short_bytes: int) -> tuple[Knob, ...]:
    """The knobs that free at least `short_bytes` more than this configuration's minimum (an
    arena that kept losing VRAM after it was planned); those that free less say so."""
    m = minimum_bytes(shape, dev, options, profile)
    tight = replace(dev, free_bytes=max(0, min(dev.total_bytes, m - short_bytes)))
    return suggest_knobs(shape, tight, options, profile, m)
