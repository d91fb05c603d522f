"""The prompt path's chunk/loan policy, written once and called by the startup plan, the arena's
post-touch repricing and the runtime alike.

The prompt path is a chunk's buffers (`prompt_layout`) plus the ring that streams experts from
host memory (`ring_layout`). Both are either OWNED (their own regions; the elastic expert cache
gives way for them) or BORROWED (carved into the cache's coldest tail slots for the prompt's
duration, then refilled). Rules:

* chunks are multiples of 256 tokens; the largest that fits is found by bisection (every price is
  a sum of chunk-times-constant terms, so "fits" is monotone in the chunk);
* a ring slot is worth far more than chunk tokens (the earlier engine measured ~0.5 tok/s per
  ring slot against ~0.05 per chunk token near its optimum), so `auto` takes the largest chunk
  that still leaves the ring at its full byte budget, and only where none does, the largest
  chunk with a smaller ring of at least two slots;
* the ring's budget is bytes; its slots are that budget over the largest expert blob;
* a loan is at most `lend_pct`% of the cache's slots and always leaves `lend_floor_slots`
  unlent; its bytes are the exact suffix of the sized cache;
* `auto` borrows when it can, else owns a 1024-token chunk (reduced on the grid if needed);
* a fixed `N` is served exactly (borrowed, else owned) or reduced on the grid, with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from strata.gguf.shape import ModelShape
from strata.plan.cache import CacheLayout
from strata.plan.layout import prompt_layout, ring_layout, ring_slot_bytes, ring_slots_for
from strata.plan.options import CHUNK_GRID, PrefillRequest

RING_MIN_SLOTS = 2
OWNED_AUTO_CHUNK = 1024


@dataclass(frozen=True, slots=True)
class PromptPath:
    """The decision: the chunk, where its buffers live, the ring, and the loan."""

    chunk: int
    mode: str  # "owned" | "borrowed"
    ring_slots: int
    prompt_bytes: int  # prompt_layout(chunk).total_bytes
    ring_bytes: int  # ring_layout(ring_slots).total_bytes
    lend_slots: int = 0
    lend_bytes: int = 0  # the loan's exact bytes (borrowed), >= prompt_bytes + ring_bytes

    @property
    def owned_bytes(self) -> int:
        """Bytes outside the expert cache (0 when borrowed)."""
        return self.prompt_bytes + self.ring_bytes if self.mode == "owned" else 0


@dataclass(slots=True)
class PromptPricing:
    """Prices of the prompt path's two parts for one model and KV setting (memoised)."""

    shape: ModelShape
    kv_type: str
    kv_stage_tokens: int
    ring_budget_bytes: int
    _prompt: dict[int, int] = field(default_factory=dict)

    def prompt_bytes(self, chunk: int) -> int:
        if chunk not in self._prompt:
            self._prompt[chunk] = prompt_layout(self.shape, chunk, kv_type=self.kv_type,
                                                kv_stage_tokens=self.kv_stage_tokens).total_bytes
        return self._prompt[chunk]

    @property
    def ring_full_slots(self) -> int:
        return ring_slots_for(self.shape, self.ring_budget_bytes)

    def ring_bytes(self, slots: int) -> int:
        if slots <= 0:
            return 0
        return ring_layout(self.shape, ring_bytes=slots * ring_slot_bytes(self.shape)).total_bytes

    def ring_slots_within(self, n_bytes: int) -> int:
        """The most ring slots (up to the full budget) whose ring fits in `n_bytes`."""
        r = min(self.ring_full_slots, max(0, n_bytes) // ring_slot_bytes(self.shape))
        while r > 0 and self.ring_bytes(r) > n_bytes:
            r -= 1
        return r


@dataclass(frozen=True, slots=True)
class Loan:
    """What a cache may lend: at most `max_slots` tail slots."""

    cache: CacheLayout
    max_slots: int

    @property
    def max_bytes(self) -> int:
        return self.cache.suffix_bytes(self.max_slots)


def loan_limit(cache: CacheLayout, *, lend_pct: int, floor_slots: int) -> Loan | None:
    """The most a cache may lend, or None when it has nothing to lend."""
    k = min(cache.n_slots * lend_pct // 100, cache.n_slots - floor_slots)
    return Loan(cache, k) if k > 0 else None


def _largest_chunk(c_max: int, fits) -> int:
    """The largest multiple of 256 in [256, c_max] with fits(c), or 0 (bisection)."""
    lo, hi = 0, c_max // CHUNK_GRID  # fits(lo*grid) assumed true, answer in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * CHUNK_GRID):
            lo = mid
        else:
            hi = mid - 1
    return lo * CHUNK_GRID


def _fit(pricing: PromptPricing, c_max: int, room: int, *, ring: bool,
         full_first: bool = True) -> tuple[int, int]:
    """(chunk, ring slots) of the largest chunk <= c_max fitting `room` bytes, or (0, 0).

    With `full_first`, first the largest chunk that leaves the ring at its full budget; else
    (or where none does) the largest chunk with a ring of at least RING_MIN_SLOTS, the ring
    taking what the chunk leaves. Without a ring only the chunk counts."""
    if not ring:
        return _largest_chunk(c_max, lambda x: pricing.prompt_bytes(x) <= room), 0
    if full_first:
        need_full = pricing.ring_bytes(pricing.ring_full_slots)
        c = _largest_chunk(c_max, lambda x: pricing.prompt_bytes(x) + need_full <= room)
        if c:
            return c, pricing.ring_full_slots
    need_min = pricing.ring_bytes(RING_MIN_SLOTS)
    c = _largest_chunk(c_max, lambda x: pricing.prompt_bytes(x) + need_min <= room)
    if not c:
        return 0, 0
    return c, pricing.ring_slots_within(room - pricing.prompt_bytes(c))


def _borrowed(pricing: PromptPricing, loan: Loan, chunk: int, ring_slots: int) -> PromptPath:
    p, r = pricing.prompt_bytes(chunk), pricing.ring_bytes(ring_slots)
    k = loan.cache.slots_to_cover(p + r)
    return PromptPath(chunk, "borrowed", ring_slots, p, r, k, loan.cache.suffix_bytes(k))


def _owned(pricing: PromptPricing, chunk: int, ring_slots: int) -> PromptPath:
    return PromptPath(chunk, "owned", ring_slots, pricing.prompt_bytes(chunk),
                      pricing.ring_bytes(ring_slots))


def _candidates(pricing: PromptPricing, c_max: int, *, loan: Loan | None, owned_room: int,
                ring: bool, owned_max: int, full_first: bool) -> list[PromptPath]:
    """The best borrowed and the best owned path up to c_max (each where one exists)."""
    out = []
    if loan is not None:
        c, r = _fit(pricing, c_max, loan.max_bytes, ring=True, full_first=full_first)
        if c:
            out.append(_borrowed(pricing, loan, c, r))
    c, r = _fit(pricing, min(c_max, owned_max), owned_room, ring=ring, full_first=full_first)
    if c:
        out.append(_owned(pricing, c, r))
    return out


def choose_prompt_path(request: PrefillRequest, pricing: PromptPricing, *, max_chunk: int,
                       loan: Loan | None, owned_room: int, ring: bool = True,
                       notes: list[str] | None = None) -> PromptPath | None:
    """THE policy. `max_chunk` caps the chunk (the context); `loan` is what the cache may lend
    (None: no borrowing); `owned_room` the bytes an owned path may take; `ring` whether an owned
    path needs a ring (not when every expert is resident). None: nothing fits, not even 256."""
    notes = [] if notes is None else notes
    cap = max(CHUNK_GRID, max_chunk // CHUNK_GRID * CHUNK_GRID)
    if request.auto:
        cands = _candidates(pricing, min(request.ceiling, cap), loan=loan, owned_room=owned_room,
                            ring=ring, owned_max=cap if not ring else OWNED_AUTO_CHUNK,
                            full_first=True)
        if not cands:
            return None
        path = cands[0]  # borrowed when there is a loan that fits
        if path.mode == "owned" and ring:
            why = "borrowing is off" if loan is None else "the cache cannot lend even 256 tokens"
            notes.append(f"--prefill {request}: {why}; the prompt path owns a "
                         f"{path.chunk}-token chunk")
        return path
    n = min(request.tokens, cap)
    if n < request.tokens:
        notes.append(f"--prefill {request.tokens}: capped at the context, {n} tokens")
    # a fixed chunk is served exactly if it can be (the ring takes what it leaves), else the
    # largest smaller chunk either way; borrowed wins a tie
    cands = _candidates(pricing, n, loan=loan, owned_room=owned_room, ring=ring, owned_max=n,
                        full_first=False)
    if not cands:
        return None
    best = max(cands, key=lambda p: (p.chunk, p.mode == "borrowed"))
    if best.chunk < n:
        notes.append(f"--prefill {request.tokens} cannot be served in this VRAM: reduced to "
                     f"{best.chunk} tokens ({best.mode})")
    return best
