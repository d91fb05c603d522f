"""Probe helper (not part of the engine): run `one(i)` over every specialization compile_check
lists, in `jobs` worker processes started with `setup`, one kernel at a time to whichever is
free. Returns (the rows one gave, wall seconds). Shared by ptx_identity.py and
forceinline_parity.py."""
import time
from concurrent.futures import ProcessPoolExecutor


def map_kernels(one, setup, jobs: int):
    setup()
    from strata.cuda_kernels import compile_check
    n = len(compile_check._checks(None, None))
    t0 = time.time()
    with ProcessPoolExecutor(jobs, initializer=setup) as ex:
        rows = list(ex.map(one, range(n), chunksize=1))
    return rows, time.time() - t0
