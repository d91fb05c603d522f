"""The knobs a refused stage offers: each a concrete flag, with the bytes it frees on that card
computed by the same stage pricing the refusal's 'needed' comes from (`decide_stage`, with the
stage's pinned cache where caches are pinned), largest effect first. Besides the single-GPU knobs
(lighter KV, a shorter context, a smaller reserve, no draft head, the carve back on), a split can
move a layer off the short card (the `--layer-split` that gives one of its edge layers to its
neighbour) and, where the caches are pinned, shrink them (the largest pinned caches that fit).

The context is every stage's, so its knob is bisected (`Pricer.on_grid`, as the one-GPU knob)
against every stage of the refused placement, not the short card alone: the largest context on
the grid at which the whole placement is planned. A `--layer-split` knob moves bytes to another
card, so it is enough alone only where every stage of the placement it makes fits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from strata.gguf.shape import ModelShape
from strata.plan.devices import DeviceInfo
from strata.plan.options import PlanOptions
from strata.plan.profile import RoutingProfile
from strata.plan.refusal import NOT_ENOUGH, Pricer, kv_type_knobs, largest, reserve_knob
from strata.plan.result import Knob
from strata.plan.split.stage import decide_stage


def stage_knobs(shape: ModelShape, profile: RoutingProfile, devices: Sequence[DeviceInfo],
                options: PlanOptions, cuts: tuple[int, ...], stage: int, *, carve: bool,
                needed: int, max_context: int, reserve_bytes: int,
                pinned: tuple[int, ...] | None = None, cache_flag: str = "--expert-cache",
                searched: tuple[int, ...] | None = None) -> tuple[Knob, ...]:
    """Every change that frees bytes on the refused stage's card, largest effect first.
    `pinned`: each stage's pinned cache slots (`cache_flag` names the flag they came from:
    `--stage-cache`, or `--expert-cache` pinning every stage alike), the same slots `needed` was
    priced with; `searched`: the placement search's cuts when they differ from the refused ones."""
    edges = (0, *cuts, shape.n_layer)
    lo, hi = edges[stage], edges[stage + 1]
    dev = devices[stage]
    # every knob is priced with the stage's pinned cache, as `needed` was: priced without it, a
    # knob 'frees' the pinned cache's bytes as well (a lighter KV freeing more than the KV)
    mine = options if pinned is None else replace(options, expert_cache=pinned[stage])

    def need(opts: PlanOptions = mine, a: int = lo, b: int = hi, c: bool = carve) -> int:
        return decide_stage(shape, profile, dev, opts, a, b, first=a == 0, carve=c).needed_bytes

    def fits_all(**change) -> bool:
        # a pinned cache knob prices its own stages (`_cache_knob`): its note stands
        return "expert_cache" in change or _every_stage_fits(
            shape, profile, devices, replace(options, **change), edges, stage, carve=carve,
            pinned=pinned)

    p = Pricer(mine, dev.free_bytes, needed, need, fits_all)

    def knob(flag: str, n: int, moved: tuple[int, ...] | None = None) -> Knob | None:
        """`moved`: the edges a --layer-split knob makes; it is enough alone only where every
        stage of them fits (a layer given to a neighbour can leave that card short instead)."""
        freed = needed - n
        if freed <= 0:
            return None
        alone = n <= dev.free_bytes and (moved is None or _every_stage_fits(
            shape, profile, devices, options, moved, stage, carve=carve, pinned=pinned))
        return Knob(flag, freed, "" if alone else NOT_ENOUGH)

    found = [*kv_type_knobs(p, shape, mine),
             reserve_knob(p, reserve_bytes, wddm=dev.is_wddm),
             _cache_knob(p, shape, profile, devices, mine, edges, carve=carve, stage=stage,
                         pinned=pinned, flag=cache_flag)]
    found.append(p.on_grid("--max-context", "max_context", max_context,
                           fits=lambda ctx: _every_stage_fits(
                               shape, profile, devices, replace(options, max_context=ctx),
                               edges, stage, carve=carve, pinned=pinned)))
    if options.spec and lo == 0:
        found.append(p.knob("--spec 0 (no draft head)", spec=0))
    if not carve:
        found.append(knob("the carve on (drop --no-carve)", need(c=True)))
    for a, b, g in ((lo + 1, hi, stage - 1), (lo, hi - 1, stage + 1)):
        if a < b and 0 <= g < len(cuts) + 1:
            moved = list(cuts)
            moved[min(stage, g)] += 1 if g < stage else -1
            found.append(knob(f"--layer-split {','.join(map(str, moved))} (one layer to GPU "
                              f"stage {g})", need(a=a, b=b), (0, *moved, shape.n_layer)))
    if searched is not None and searched != cuts:
        e = (0, *searched, shape.n_layer)
        found.append(knob(f"--layer-split {','.join(map(str, searched))} (the placement "
                          f"search's choice)", need(a=e[stage], b=e[stage + 1]), e))
    return tuple(sorted((k for k in found if k is not None), key=lambda k: -k.frees_bytes))


def _every_stage_fits(shape: ModelShape, profile: RoutingProfile, devices: Sequence[DeviceInfo],
                      options: PlanOptions, edges: tuple[int, ...], short: int, *, carve: bool,
                      pinned: tuple[int, ...] | None) -> bool:
    """Whether every stage of this placement is planned with `options` (each with its pinned
    cache), as the split decides them; the short stage first, the one likeliest to fail."""
    for g in (short, *(g for g in range(len(devices)) if g != short)):
        opts = options if pinned is None else replace(options, expert_cache=pinned[g])
        d = decide_stage(shape, profile, devices[g], opts, edges[g], edges[g + 1],
                         first=g == 0, carve=carve)
        if d.reason is not None:
            return False
    return True


def _cache_knob(p: Pricer, shape: ModelShape, profile: RoutingProfile,
                devices: Sequence[DeviceInfo], options: PlanOptions, edges: tuple[int, ...], *,
                carve: bool, stage: int, pinned: tuple[int, ...] | None,
                flag: str) -> Knob | None:
    """Pinned caches: the largest each stage fits at this placement (`--stage-cache A,B,...`),
    or, pinned alike by `--expert-cache`, the largest every stage fits. It frees what the
    refused stage's cache gives up; it is not enough alone where a stage does not fit even with
    no cache at all."""
    if pinned is None:
        return None
    fit = [_largest_fitting(shape, profile, dev, options, edges[g], edges[g + 1], pinned[g],
                            carve=carve) for g, dev in enumerate(devices)]
    slots = [0 if k is None else k for k in fit]
    if flag == "--stage-cache":
        value, mine = ",".join(map(str, slots)), slots[stage]
    else:
        value = mine = min(slots)
    note = NOT_ENOUGH if None in fit else ""
    return p.knob(f"{flag} {value}", note, expert_cache=mine)


def _largest_fitting(shape: ModelShape, profile: RoutingProfile, dev: DeviceInfo,
                     options: PlanOptions, lo: int, hi: int, pin: int, *,
                     carve: bool) -> int | None:
    """The largest cache (at most `pin`, clamped to the range's pairs as the planner clamps it)
    with which the stage over [lo, hi) is planned on `dev`; None if not even an empty one is."""
    def fits(k: int) -> bool:
        d = decide_stage(shape, profile, dev, replace(options, expert_cache=k), lo, hi,
                         first=lo == 0, carve=carve)
        return d.reason is None

    cap = min(pin, (hi - lo) * shape.n_expert)
    return cap if fits(cap) else largest(0, cap - 1, fits)
