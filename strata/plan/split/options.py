"""The split's knobs (`--gpus`, `--layer-split`, `--cover-b`, `--no-helper-tiers`, the carve's
kill switch, pinned stage caches, per-card bandwidths), validated once."""

from __future__ import annotations

from dataclasses import dataclass

from strata.plan.options import OptionError

HBM_BYTES_PER_S = 2.0e12  # a card's decode read rate when not given (H200 matvec: ~2-2.6 TB/s)
HOST_BYTES_PER_S = 50e9  # a missed expert read zero-copy from mapped host memory (PCIe gen5)
TIER_MIN_BYTES = 256 << 20  # leftover VRAM under this opens no helper tier
COVER_B_DEFAULT = 3.0
HANDOFFS = ("auto", "host")  # how the hidden state crosses GPUs (`--handoff`)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise OptionError(f"{flag} {text!r}: expected whole numbers separated by commas")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise OptionError(f"{flag} {text!r}: expected whole numbers separated by commas") from None


def parse_gpus(text: str) -> tuple[int, ...]:
    """`--gpus 0,1,3` -> (0, 1, 3): distinct, non-negative."""
    ids = _ints(text, "--gpus")
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise OptionError(f"--gpus {text!r}: GPU indices must be distinct and >= 0")
    return ids


def parse_layer_split(text: str) -> tuple[int, ...] | None:
    """`--layer-split auto` -> None; `--layer-split 10,19,34` -> the layers where the second,
    third, ... stage start (one fewer than the GPUs; checked against the model later)."""
    if text.strip().lower() == "auto":
        return None
    return _ints(text, "--layer-split")


def parse_floats(text: str, flag: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise OptionError(f"{flag} {text!r}: expected numbers separated by commas") from None
    if any(not v > 0 for v in vals):
        raise OptionError(f"{flag} {text!r}: every value must be positive")
    return vals


@dataclass(frozen=True, slots=True)
class SplitOptions:
    """`cuts`: None for the placement search, else the first layer of stages 1..G-1.
    `cover_b`: the coverage curve's exponent (None: fitted to the profile's shares when it has
    them, else 3). `carve`: False loads every layer's dense weights on every stage (the A/B).
    `stage_cache`: pinned slot counts per stage (the A/B keeps caches equal in both arms).
    `bandwidth`: each GPU's decode read rate in bytes/s (None: all `HBM_BYTES_PER_S`); it
    scores placements and orders the helper tiers (fastest card first). `handoff`: "auto"
    hands the hidden state peer-to-peer where two GPUs reach each other's memory, else through
    pinned host memory; "host" always through pinned host memory (to measure it, or to work
    around a peer-to-peer fault)."""

    cuts: tuple[int, ...] | None = None
    cover_b: float | None = None
    helper_tiers: bool = True
    carve: bool = True
    stage_cache: tuple[int, ...] | None = None
    bandwidth: tuple[float, ...] | None = None
    host_bytes_per_s: float = HOST_BYTES_PER_S
    tier_min_bytes: int = TIER_MIN_BYTES
    handoff: str = "auto"

    def __post_init__(self) -> None:
        if self.cuts is not None and (any(c < 1 for c in self.cuts)
                                      or list(self.cuts) != sorted(set(self.cuts))):
            raise OptionError(f"--layer-split {','.join(map(str, self.cuts))}: the stage starts "
                              f"must be strictly increasing layers >= 1")
        if self.cover_b is not None and not 0 < self.cover_b <= 1000:
            raise OptionError(f"--cover-b must be in (0, 1000], got {self.cover_b}")
        if self.stage_cache is not None and any(n < 0 for n in self.stage_cache):
            raise OptionError(f"--stage-cache: slot counts must be >= 0, got {self.stage_cache}")
        if self.bandwidth is not None and any(not b > 0 for b in self.bandwidth):
            raise OptionError("--gpu-bandwidth: every value must be positive")
        if self.handoff not in HANDOFFS:
            raise OptionError(f"--handoff {self.handoff!r}: expected {' or '.join(HANDOFFS)}")
        if not self.host_bytes_per_s > 0 or self.tier_min_bytes < 0:
            raise OptionError("host bandwidth must be positive and the tier minimum >= 0")

    def check_devices(self, n_gpu: int, n_layer: int) -> None:
        """The knobs against the GPUs and the model; OptionError names what does not match."""
        if n_gpu > n_layer:
            raise OptionError(f"{n_gpu} GPUs for {n_layer} layers: each stage needs a layer "
                              f"(--gpus picks fewer)")
        if self.cuts is not None:
            if len(self.cuts) != n_gpu - 1:
                raise OptionError(f"--layer-split {','.join(map(str, self.cuts))}: {n_gpu} GPUs "
                                  f"need {n_gpu - 1} stage starts, got {len(self.cuts)}")
            if self.cuts and self.cuts[-1] >= n_layer:
                raise OptionError(f"--layer-split: stage start {self.cuts[-1]} is past the "
                                  f"model's last layer ({n_layer - 1})")
        for what, vals in (("--stage-cache", self.stage_cache),
                           ("--gpu-bandwidth", self.bandwidth)):
            if vals is not None and len(vals) != n_gpu:
                raise OptionError(f"{what}: {len(vals)} values for {n_gpu} GPUs")

    def bandwidth_of(self, stage: int) -> float:
        return HBM_BYTES_PER_S if self.bandwidth is None else self.bandwidth[stage]
