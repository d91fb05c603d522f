"""Probe (not part of the engine): where a CUDA engine's load time goes on this machine.

D1's report on the H200 (2026-12-05) put 15.2 s of an 17.9 s load in filling the expert store
(17.7 GB at 1.16 GB/s) and 1.25 s in the dense weights' upload (0.66 GB/s). A store's pages are
new memory, so its copy pays the kernel's page faults (and, on a virtual machine, the host's first
touch of the guest's memory). This times, in one process:
  * the store filled at the first thread count given, on pages the process never had (cold),
  * then each thread count in turn, twice, on pages freed by the fill before (warm),
  * registering one filled store (`map_host`),
  * the dense weights: their planar packing (`_stored`) and the upload through pinned staging.

    python bench/probes/load_phases.py -m FILE [--threads 8,1] [--json OUT]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import numpy as np


def fill(model, threads: int) -> tuple[float, int]:
    from strata.experts import store as store_mod
    store_mod.FILL_THREADS = threads
    s = store_mod.build_store(model, with_embd=True)
    out = (s.fill_seconds, s.n_bytes)
    del s
    gc.collect()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", required=True)
    ap.add_argument("--threads", default="8,1")
    ap.add_argument("--json")
    a = ap.parse_args()
    from numba import cuda

    from strata.engine.cuda.hostmem import map_host, upload
    from strata.engine.cuda.model import _stored
    from strata.experts import build_store
    from strata.experts import store as store_mod
    from strata.gguf import open_model
    model = open_model(a.m)
    counts = [int(t) for t in a.threads.split(",")]
    rows = []
    secs, n = fill(model, counts[0])
    rows.append({"what": "store fill, cold pages", "threads": counts[0], "s": secs,
                 "gb_per_s": n / secs / 1e9})
    for _ in range(2):
        for t in counts:
            secs, n = fill(model, t)
            rows.append({"what": "store fill, warm pages", "threads": t, "s": secs,
                         "gb_per_s": n / secs / 1e9})
    store_mod.FILL_THREADS = counts[0]
    s = build_store(model, with_embd=True)
    host = map_host(s.buffer)
    rows.append({"what": "register (mapped)", "s": host.seconds,
                 "gb_per_s": s.n_bytes / host.seconds / 1e9})
    del host, s
    gc.collect()
    names = [t for t in model.tensors if "_exps" not in t]
    t0 = time.perf_counter()
    srcs = [_stored(model, name) for name in names]
    pack = time.perf_counter() - t0
    total = sum(int(x.nbytes) for x in srcs)
    dev = cuda.device_array(total, np.uint8)
    pieces, off = [], 0
    for x in srcs:
        pieces.append((dev[off:off + x.nbytes], x.reshape(-1)))
        off += x.nbytes
    stream = cuda.stream()
    for r in range(2):
        n_up, up = upload(pieces, stream, progress=False)
        rows.append({"what": f"dense upload (round {r})", "s": up, "gb_per_s": n_up / up / 1e9,
                     "pieces": len(pieces)})
    rows.append({"what": "dense planar pack", "s": pack, "bytes": total})
    for r in rows:
        print(f"{r['what']:28s} {r.get('threads', ''):>3} {r['s']:8.3f} s "
              f"{r.get('gb_per_s', 0):7.2f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": os.path.basename(a.m), "cpus": os.cpu_count(), "rows": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
