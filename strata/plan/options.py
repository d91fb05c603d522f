"""The user's knobs, validated once; defaults live here."""

from __future__ import annotations

from dataclasses import dataclass

from strata.errors import UsageError
from strata.plan.layout import KV_TYPES

CHUNK_GRID = 256  # prompt chunks are multiples of this many tokens
DEFAULT_MAX_CONTEXT = 32768  # when --max-context is not given (capped by the model's training)
AUTO_CEILING_DEFAULT = 16384  # --prefill auto without :CEILING
LEND_PCT_DEFAULT = 90  # the prompt path may borrow up to this share of the cache's slots...
LEND_FLOOR_SLOTS = 128  # ...always leaving at least this many slots unlent
RING_BYTES_DEFAULT = 1 << 30  # the prefill ring's byte budget: see policy.py
# The least --max-context of every command: a prompt token and the token it generates. The CPU
# engine could hold a single position, but `strata serve` counts a reply inside the context (a
# request's max_tokens must leave it room), so one position serves no request; one minimum for
# every command keeps a command line that one accepts good for the others.
MIN_CONTEXT = 2
# ...except where a VRAM plan sizes the context (`strata plan`, every `--backend cuda`): the plan
# lays the prompt path out in whole CHUNK_GRID-token chunks and keeps the context on that grid
# (its default, its chunk cap, the contexts a refusal suggests), so it holds at least one chunk.
PLAN_MIN_CONTEXT = CHUNK_GRID


class OptionError(UsageError, ValueError):
    """A knob has a value the planner cannot use."""


def check_max_context(n: int | None, *, planned: bool = False) -> None:
    """Refuse a `--max-context` below the least a command takes (None: the default, fine);
    `planned`: sized by a VRAM plan. Every command says it in these words."""
    if n is None:
        return
    if planned and n < PLAN_MIN_CONTEXT:
        raise OptionError(f"--max-context must be at least {PLAN_MIN_CONTEXT} where a VRAM plan "
                          f"sizes it (the CUDA engine runs prompts in {CHUNK_GRID}-token "
                          f"chunks), got {n}")
    if n < MIN_CONTEXT:
        raise OptionError(f"--max-context must be at least {MIN_CONTEXT} (a prompt token and "
                          f"the token it generates), got {n}")


@dataclass(frozen=True, slots=True)
class PrefillRequest:
    """`--prefill auto`, `auto:CEILING` or a fixed chunk `N` (tokens, a multiple of 256)."""

    auto: bool = True
    tokens: int = 0  # auto: the ceiling (0: AUTO_CEILING_DEFAULT); fixed: the chunk

    def __post_init__(self) -> None:
        what = "auto's ceiling" if self.auto else "chunk"
        if self.tokens < 0 or (not self.auto and self.tokens == 0):
            raise OptionError(f"--prefill: {what} must be positive, got {self.tokens}")
        if self.tokens % CHUNK_GRID:
            lo = self.tokens // CHUNK_GRID * CHUNK_GRID
            near = [n for n in (lo, lo + CHUNK_GRID) if n >= CHUNK_GRID]  # never 0, never twice
            raise OptionError(f"--prefill: {what} {self.tokens} is not a multiple of "
                              f"{CHUNK_GRID} (try {' or '.join(map(str, near))})")

    @classmethod
    def parse(cls, text: str) -> "PrefillRequest":
        t = text.strip().lower()
        try:
            if t == "auto":
                return cls(True, 0)
            if t.startswith("auto:"):
                ceiling = int(t[5:])
                # tokens=0 stands for the default ceiling: a written auto:0 is no ceiling
                # the planner could run, so it is refused like auto:-256, not read as auto
                if ceiling == 0:
                    raise OptionError(f"--prefill {text!r}: auto's ceiling must be a positive "
                                      f"multiple of {CHUNK_GRID} (or plain auto: up to "
                                      f"{AUTO_CEILING_DEFAULT})")
                return cls(True, ceiling)
            return cls(False, int(t))
        except ValueError as e:
            if isinstance(e, OptionError):
                raise
            raise OptionError(f"--prefill {text!r}: expected auto, auto:CEILING or a number of "
                              f"tokens (a multiple of {CHUNK_GRID})") from None

    @property
    def ceiling(self) -> int:
        return (self.tokens or AUTO_CEILING_DEFAULT) if self.auto else self.tokens

    def __str__(self) -> str:
        if self.auto:
            return f"auto:{self.tokens}" if self.tokens else "auto"
        return str(self.tokens)


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Every knob the planner reads. None means 'the default for this model / device'."""

    max_context: int | None = None  # tokens; None: min(training context, 32768)
    kv_type: str = "f16"  # f16 | int8 | q4_0
    kv_resident: int | None = None  # tokens of KV kept in VRAM; None: all of max_context
    prefill: PrefillRequest = PrefillRequest()
    expert_cache: int | None = None  # slots; None: auto (the elastic remainder)
    vram_reserve_mib: int | None = None  # None: 512 MiB, or max(1 GiB, 5%) under WDDM
    ring_mib: int | None = None  # the prefill ring's budget; None: RING_BYTES_DEFAULT
    spec: int = 0  # draft tokens per step; 0: no draft head
    batch: int = 1  # decode sequences
    prefill_borrow: bool = True  # the prompt path may borrow expert-cache slots
    embd_on_host: bool = True  # token_embd lookup from host memory
    lend_pct: int = LEND_PCT_DEFAULT
    lend_floor_slots: int = LEND_FLOOR_SLOTS

    def __post_init__(self) -> None:
        def bad(flag: str, why: str) -> OptionError:
            return OptionError(f"{flag}: {why}")

        check_max_context(self.max_context, planned=True)
        if self.kv_type not in KV_TYPES:
            raise bad("--kv", f"{self.kv_type!r} is not one of {', '.join(KV_TYPES)}")
        if self.kv_resident is not None and self.kv_resident < CHUNK_GRID:
            raise bad("--kv-resident", f"must be at least {CHUNK_GRID} tokens, "
                                       f"got {self.kv_resident}")
        if self.expert_cache is not None and self.expert_cache < 0:
            raise bad("--expert-cache", f"must be auto or a slot count >= 0, "
                                        f"got {self.expert_cache}")
        if self.vram_reserve_mib is not None and self.vram_reserve_mib < 0:
            raise bad("--vram-reserve-mib", f"must be >= 0, got {self.vram_reserve_mib}")
        if self.ring_mib is not None and self.ring_mib < 1:
            raise bad("--ring-mib", f"must be >= 1, got {self.ring_mib}")
        if self.spec < 0:
            raise bad("--spec", f"must be >= 0, got {self.spec}")
        if self.batch < 1:
            raise bad("--batch", f"must be >= 1, got {self.batch}")
        if not 0 < self.lend_pct <= 100:
            raise bad("--lend-pct", f"must be in 1..100, got {self.lend_pct}")
        if self.lend_floor_slots < 0:
            raise bad("--lend-floor-slots", f"must be >= 0, got {self.lend_floor_slots}")

    @property
    def ring_bytes(self) -> int:
        return RING_BYTES_DEFAULT if self.ring_mib is None else self.ring_mib << 20
