"""`strata selfcheck` (not listed in --help): check what this build runs on from inside it —
numba-cuda, cuda.core, the kernel bundle, the CPU engine's numba code, a GPU kernel."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto",
                   help="launch a bundled kernel: auto = when the CUDA driver loads")
    p.add_argument("--partial-bundle", action="store_true",
                   help="pass although the kernel bundle lacks some registered kernels "
                        "(a test build of a subset)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args) -> int:
    from strata.aot.selfcheck import run_checks

    rows = run_checks(require_complete=not args.partial_bundle, gpu=args.gpu)
    if args.json:
        print(json.dumps([{"check": r.name, "ok": r.ok, "detail": r.detail} for r in rows],
                         indent=1))
    else:
        for r in rows:
            print(f"{'ok' if r.ok else 'FAIL':<5} {r.name:<14} {r.detail}")
    return 0 if all(r.ok for r in rows) else 1
