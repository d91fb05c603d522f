"""The routing-adaptive expert cache's hit rate on a skewed synthetic stream (no GPU: the hit
rate is a property of the residency bookkeeping, run here with the real `ExpertCache` and
`AdaptiveRanks` over a device stand-in that counts the blobs it would copy).

Each layer's experts are routed with the synthesizer's skew (the top fraction f of experts
takes about 1-(1-f)^B of the selections, B = --skew) under a hidden random ranking; a token
picks its top-k experts by Gumbel top-k over those shares. A request is a prompt (its routing
counts are what the engine's prompt path reads back) then decode tokens, whose lookups give the
hit rate. Scenarios: the cache filled by uniform ranks (no profile), by the true ranking (a
right profile), and by the true ranking until the traffic shifts (new hidden rankings) half way.
Static = the fill kept; adaptive = `AdaptiveRanks.adapt` after every prompt.

    python -m strata.bench.adaptive_cache [--slots-per-layer 26] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone

import numpy as np

from strata.experts import ExpertCache
from strata.experts.adaptive import AdaptiveConfig, AdaptiveRanks
from strata.plan.cache import CacheLayout


class _Counting:
    """The device side of the cache, counting the blobs copied."""

    def __init__(self):
        self.n_loads = 0

    def write_table(self, table) -> None:
        pass

    def load(self, slot, layer, expert) -> None:
        self.n_loads += 1


def skew_shares(n_expert: int, skew: float) -> np.ndarray:
    """[n_expert] selection shares by rank: the top fraction f holds 1-(1-f)^skew."""
    edges = 1.0 - (1.0 - np.arange(n_expert + 1) / n_expert) ** skew
    return np.diff(edges)


def route(rng, log_w: np.ndarray, n_tokens: int, k: int) -> np.ndarray:
    """[n_tokens, k] experts: Gumbel top-k over one layer's log shares [n_expert]."""
    g = log_w[None, :] - np.log(-np.log(rng.random((n_tokens, log_w.size))))
    return np.argpartition(-g, k - 1, axis=1)[:, :k]


def _layout(n_layer: int, per_layer: int, experts: np.ndarray) -> CacheLayout:
    slot_layer = np.repeat(np.arange(n_layer, dtype=np.int32), per_layer)
    n = slot_layer.size
    ones = np.ones(n, np.int64)
    return CacheLayout(slot_layer, experts.reshape(-1).astype(np.int32),
                       np.arange(n, dtype=np.int64), ones, (per_layer,) * n_layer, n)


def run_scenario(args, *, fill: str, adaptive: bool) -> dict:
    """Mean decode hit rate over the requests (and over the last half) of one scenario."""
    rng = np.random.default_rng(args.seed)
    L, E, k, S = args.layers, args.experts, args.k, args.slots_per_layer
    shares = skew_shares(E, args.skew)
    ranks = [np.stack([rng.permutation(E) for _ in range(L)]) for _ in range(2)]
    shift = fill == "shift"

    def log_w(rank):  # [L, E]: expert rank[l, i] has the i-th share
        w = np.empty((L, E))
        np.put_along_axis(w, rank, shares[None, :], axis=1)
        return np.log(w)

    logs = [log_w(r) for r in ranks]
    first = np.tile(np.arange(S), (L, 1)) if fill == "uniform" else ranks[0][:, :S]
    dev = _Counting()
    cache = ExpertCache(_layout(L, S, first), L, E, dev)
    cache.fill()
    ar = AdaptiveRanks(L, E, AdaptiveConfig()) if adaptive else None
    rates, loads = [], []
    for r in range(args.requests):
        lw = logs[1] if shift and r >= args.requests // 2 else logs[0]
        n0 = dev.n_loads
        if ar is not None:
            for layer in range(L):
                ids = route(rng, lw[layer], args.prompt, k)
                ar.observe(layer, np.bincount(ids.reshape(-1), minlength=E))
            ar.adapt(cache)
        hits = 0
        for layer in range(L):
            ids = route(rng, lw[layer], args.decode, k)
            hits += int((cache.table[layer][ids] >= 0).sum())
        rates.append(hits / (L * args.decode * k))
        loads.append(dev.n_loads - n0)
    half = args.requests // 2
    return {"fill": fill, "adaptive": adaptive, "hit_rate": float(np.mean(rates)),
            "hit_rate_last_half": float(np.mean(rates[half:])),
            "hit_rate_per_request": [round(x, 4) for x in rates],
            "blobs_copied_per_request": float(np.mean(loads)),
            "swaps": ar.n_swaps if ar else 0}


def table(rows: list[dict]) -> str:
    lines = [f"{'cache fill':12s} {'static':>8s} {'adaptive':>9s} {'gain':>7s}   "
             f"(decode hit rate, last half of the requests; blobs copied per request)"]
    for fill in dict.fromkeys(r["fill"] for r in rows):
        s, a = (next(r for r in rows if r["fill"] == fill and r["adaptive"] == ad)
                for ad in (False, True))
        lines.append(f"{fill:12s} {s['hit_rate_last_half']:8.1%} {a['hit_rate_last_half']:9.1%} "
                     f"{a['hit_rate_last_half'] - s['hit_rate_last_half']:+7.1%}   "
                     f"{a['blobs_copied_per_request']:.0f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.bench.adaptive_cache")
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--slots-per-layer", type=int, default=26,
                    help="default 26: the 30B-A3B Q8_0 plan at --gpu-mem 8GiB (1247 slots)")
    ap.add_argument("--skew", type=float, default=3.0)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    if not 0 < a.slots_per_layer < a.experts or not 0 < a.k <= a.experts:
        ap.error("need 0 < --slots-per-layer < --experts and 0 < -k <= --experts")
    t0 = time.perf_counter()
    rows = [run_scenario(a, fill=f, adaptive=ad) for f in ("uniform", "profile", "shift")
            for ad in (False, True)]
    text = table(rows)
    print(text)
    if a.json_out:
        body = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "command": "python -m strata.bench.adaptive_cache "
                           + " ".join(argv or sys.argv[1:]),
                "device": "none (CPU bookkeeping simulation)", "settings": vars(a),
                "adaptive_config": {f: getattr(AdaptiveConfig(), f)
                                    for f in AdaptiveConfig.__dataclass_fields__},
                "rows": rows, "table": text, "seconds": time.perf_counter() - t0}
        with open(a.json_out, "w") as f:
            json.dump(body, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
