"""`Metrics`: what the server counts, and its Prometheus text rendering (all names `strata_`).

Counters are written by the HTTP side (requests) and by the engine worker (tokens, seconds,
cancellations); a lock keeps a scrape consistent. Rates shown live (tok/s) are measured over a
sliding wall-clock window, so they fall to zero when the server idles.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable, Iterable

RATE_WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class Region:
    """One named region of a device's memory the engine owns (weights, kv, prompt, ring, ...)."""

    name: str
    n_bytes: int


@dataclass(frozen=True, slots=True)
class DeviceReport:
    """One device the engine runs on: its own regions, and (GPUs) what NVML measures."""

    device: str  # "cuda:0", "cpu"
    label: str  # "NVIDIA H200", "CPU"
    regions: tuple[Region, ...] = ()
    layers: tuple[int, int] | None = None  # [first, last) layer held here
    total_bytes: int | None = None  # NVML, GPUs only
    used_bytes: int | None = None
    free_bytes: int | None = None
    expert_slots: int | None = None
    expert_hit_rate: float | None = None  # hits / lookups since start, None before any lookup


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_value(value: float) -> str:
    """A sample's value as the exposition writes it: an integer in full (a token counter passes
    a million and a byte gauge 1e8, where a fixed count of digits would round them), a float
    with the fewest digits that read back the same (repr), and Prometheus' own spelling of
    the infinities and NaN."""
    if isinstance(value, numbers.Integral):  # numpy's integers too
        return str(int(value))
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


class _Writer:
    """Prometheus text exposition, one metric family at a time."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float]]) -> None:
        samples = list(samples)
        if not samples:
            return
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            text = sample_value(value)
            self.lines.append(f"{name}{{{lab}}} {text}" if lab else f"{name} {text}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


class Metrics:
    """Counters and gauges of one server."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self.t_start = clock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (route, status) -> n
        self.prompt_tokens = 0
        self.prompt_cached_tokens = 0  # prompt tokens whose KV a finished sequence left behind
        self.completion_tokens = 0
        self.prefill_tokens = 0
        self.prefill_seconds = 0.0
        self.decode_tokens = 0
        self.decode_seconds = 0.0
        self.decode_steps = 0
        self.device_picked = 0  # decode-step tokens the engine chose on the GPU
        self.cancelled: Counter[str] = Counter()  # "queued" | "prefill" | "running" -> n
        self.finished: Counter[str] = Counter()  # finish reason -> n
        self.queue_depth = 0
        self.active = 0
        self.n_slots = 0
        self._window: deque[tuple[float, str, int]] = deque()  # (t, "prefill"|"decode", n)

    # -- writers ---------------------------------------------------------------------------

    def record_request(self, route: str, status: int) -> None:
        with self._lock:
            self.requests[(route, status)] += 1

    def record_prefill(self, n_tokens: int, seconds: float, *, cached: int = 0) -> None:
        """A prompt of `n_tokens`, `cached` of which the engine found in its KV (not computed)."""
        with self._lock:
            self.prompt_cached_tokens += cached
            self.prefill_tokens += n_tokens
            self.prompt_tokens += n_tokens
            self.prefill_seconds += seconds
            self._window.append((self._clock(), "prefill", n_tokens))

    def record_decode(self, n_tokens: int, seconds: float, *, n_device_picked: int = 0) -> None:
        """One decode step that produced `n_tokens` tokens (one per sequence in the batch),
        `n_device_picked` of them chosen by the engine on the GPU (the rest sampled on the
        host from logits)."""
        with self._lock:
            self.device_picked += n_device_picked
            self.decode_tokens += n_tokens
            self.decode_seconds += seconds
            self.decode_steps += 1
            self._window.append((self._clock(), "decode", n_tokens))

    def record_finish(self, reason: str, n_completion: int, *, cancelled_in: str | None = None
                      ) -> None:
        with self._lock:
            self.finished[reason] += 1
            self.completion_tokens += n_completion
            if cancelled_in is not None:
                self.cancelled[cancelled_in] += 1

    def set_load(self, *, queue_depth: int, active: int, n_slots: int) -> None:
        with self._lock:
            self.queue_depth, self.active, self.n_slots = queue_depth, active, n_slots

    # -- readers ---------------------------------------------------------------------------

    def rate(self, kind: str) -> float:
        """Tokens per wall-clock second of `kind` ("prefill" or "decode") over the last window."""
        now = self._clock()
        with self._lock:
            while self._window and self._window[0][0] < now - RATE_WINDOW_S:
                self._window.popleft()
            n = sum(c for _, k, c in self._window if k == kind)
        span = min(RATE_WINDOW_S, max(now - self.t_start, 1e-9))
        return n / span

    def snapshot(self) -> dict:
        """A JSON-able summary for /health and the monitor page."""
        with self._lock:
            out = {
                "uptime_s": round(self._clock() - self.t_start, 3),
                "requests": sum(self.requests.values()),
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "queue_depth": self.queue_depth,
                "active": self.active,
                "slots": self.n_slots,
                "cancelled": dict(self.cancelled),
            }
        out["prefill_tok_s"] = round(self.rate("prefill"), 2)
        out["decode_tok_s"] = round(self.rate("decode"), 2)
        return out

    def render(self, devices: Iterable[DeviceReport] = ()) -> str:
        """The Prometheus text exposition of everything, devices included."""
        w = _Writer()
        with self._lock:
            reqs = sorted(self.requests.items())
            w.family("strata_requests_total", "counter",
                     "HTTP requests answered, by route and status.",
                     [({"route": r, "status": str(s)}, n) for (r, s), n in reqs])
            w.family("strata_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
                     [({}, self.prompt_tokens)])
            w.family("strata_prompt_cached_tokens_total", "counter",
                     "Prompt tokens found in the KV a finished request left (not computed).",
                     [({}, self.prompt_cached_tokens)])
            w.family("strata_completion_tokens_total", "counter", "Tokens generated.",
                     [({}, self.completion_tokens)])
            w.family("strata_prefill_seconds_total", "counter", "Engine time spent in prefill.",
                     [({}, self.prefill_seconds)])
            w.family("strata_decode_seconds_total", "counter", "Engine time spent in decode steps.",
                     [({}, self.decode_seconds)])
            w.family("strata_decode_steps_total", "counter", "Batched decode steps run.",
                     [({}, self.decode_steps)])
            w.family("strata_decode_tokens_total", "counter",
                     "Tokens decode steps produced, by where they were chosen (device: picked on "
                     "the GPU; host: sampled from logits copied back).",
                     [({"picked": "device"}, self.device_picked),
                      ({"picked": "host"}, self.decode_tokens - self.device_picked)])
            w.family("strata_requests_cancelled_total", "counter",
                     "Requests whose client went away, by where they were.",
                     [({"where": k}, self.cancelled.get(k, 0))
                      for k in ("queued", "prefill", "running")])
            w.family("strata_requests_finished_total", "counter", "Generations ended, by reason.",
                     [({"reason": k}, n) for k, n in sorted(self.finished.items())])
            w.family("strata_queue_depth", "gauge", "Requests waiting for a slot.",
                     [({}, self.queue_depth)])
            w.family("strata_active_sequences", "gauge", "Sequences being generated.",
                     [({}, self.active)])
            w.family("strata_slots", "gauge", "Sequences the engine decodes together at most.",
                     [({}, self.n_slots)])
        w.family("strata_prefill_tokens_per_second", "gauge",
                 f"Prompt tokens per wall second over the last {RATE_WINDOW_S:g} s.",
                 [({}, self.rate("prefill"))])
        w.family("strata_decode_tokens_per_second", "gauge",
                 f"Generated tokens per wall second over the last {RATE_WINDOW_S:g} s "
                 f"(all sequences).",
                 [({}, self.rate("decode"))])
        _render_devices(w, list(devices))
        return w.text()


def _render_devices(w: _Writer, devices: list[DeviceReport]) -> None:
    w.family("strata_region_bytes", "gauge", "Bytes of each engine memory region, per device.",
             [({"device": d.device, "region": r.name}, r.n_bytes)
              for d in devices for r in d.regions])
    for field, help_text in (("total_bytes", "Device memory in total (NVML)."),
                             ("used_bytes", "Device memory in use by all processes (NVML)."),
                             ("free_bytes", "Device memory free (NVML).")):
        w.family(f"strata_vram_{field}", "gauge", help_text,
                 [({"device": d.device}, getattr(d, field)) for d in devices
                  if getattr(d, field) is not None])
    w.family("strata_expert_cache_slots", "gauge", "Expert-cache slots in VRAM, per device.",
             [({"device": d.device}, d.expert_slots) for d in devices
              if d.expert_slots is not None])
    w.family("strata_expert_cache_hit_ratio", "gauge",
             "Expert lookups served from the VRAM cache, per device.",
             [({"device": d.device}, d.expert_hit_rate) for d in devices
              if d.expert_hit_rate is not None])
