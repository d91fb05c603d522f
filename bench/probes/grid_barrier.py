"""What one barrier across the grid costs on this GPU, at grids of one, two and four blocks an SM
and the most the device holds at once: `gridsync.grid_sync` (ordered: an acq_rel arrival, a
release store, acquire polls), the form it replaced (fenced: full fences, atomic reads of the
generation), the ordered one polling with no pause, and a two-level one (the arrivals over 8
counters).

A cooperative launch of rounds of two barriers and nothing else; the cost of one barrier is the
time of 129 rounds less that of 33, over 192 barriers (the launch cancels; both long enough
that the host's launches keep ahead of the GPU). The barrier's words are
checked after every variant (arrivals back at zero, the generation counted once a round), so a
barrier that let a block through early or lost an arrival fails the probe rather than timing it.

    python bench/probes/grid_barrier.py --json OUT.json
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from numba import cuda

from strata.cuda_kernels.gridsync import POLL_NS, grid_sync
from strata.cuda_kernels.ordered import add_acq_rel, ld_acquire, st_relaxed, st_release

THREADS = 128  # the MoE lane kernels' and decode attention's blocks


@cuda.jit(device=True, inline="always")
def grid_sync_fenced(bar):
    """`gridsync.grid_sync` before 2026-12-04: the generation read and polled by atomic adds of
    0, full fences (`membar.gl`) around the arrival."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        gen = cuda.atomic.add(bar, 1, 0)
        cuda.threadfence()
        n_blocks = cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z
        if cuda.atomic.add(bar, 0, 1) == n_blocks - 1:
            cuda.atomic.exch(bar, 0, 0)
            cuda.threadfence()
            cuda.atomic.add(bar, 1, 1)
        else:
            while cuda.atomic.add(bar, 1, 0) == gen:
                cuda.nanosleep(POLL_NS)
        cuda.threadfence()
    cuda.syncthreads()


N_SUB = 8  # the two-level barrier's first-level counters


@cuda.jit(device=True, inline="always")
def grid_sync_spin(bar):
    """`gridsync.grid_sync` polling with no pause."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        gen = ld_acquire(bar, 1)
        n_blocks = cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z
        if add_acq_rel(bar, 0, 1) == n_blocks - 1:
            st_relaxed(bar, 0, 0)
            st_release(bar, 1, gen + 1)
        else:
            while ld_acquire(bar, 1) == gen:
                pass
    cuda.syncthreads()


@cuda.jit(device=True, inline="always")
def grid_sync_two_level(bar):
    """`gridsync.grid_sync` with the arrivals spread over N_SUB counters (bar[2:2 + N_SUB]):
    block b counts at b % N_SUB, the last of each such group at bar[0], the last of those bumps
    the generation. Fewer atomics queue at one word; two in turn for a group's last block."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        gen = ld_acquire(bar, 1)
        n_blocks = cuda.gridDim.x * cuda.gridDim.y * cuda.gridDim.z
        b = cuda.blockIdx.x
        sub = b % N_SUB
        n_groups = min(n_blocks, N_SUB)
        n_members = (n_blocks - 1 - sub) // N_SUB + 1
        last = False
        if add_acq_rel(bar, 2 + sub, 1) == n_members - 1:
            st_relaxed(bar, 2 + sub, 0)
            if add_acq_rel(bar, 0, 1) == n_groups - 1:
                st_relaxed(bar, 0, 0)
                st_release(bar, 1, gen + 1)
                last = True
        if not last:
            while ld_acquire(bar, 1) == gen:
                cuda.nanosleep(POLL_NS)
    cuda.syncthreads()


def _kernel(barrier):
    @cuda.jit
    def rounds(bar, n_round, base, seen):
        for r in range(n_round):
            barrier(bar)
            # every block sees the whole previous round's writes: a block's count of rounds
            # finished (from `base`, new every launch), written before the barrier, read by its
            # neighbour after it
            if cuda.threadIdx.x == 0:
                nb = (cuda.blockIdx.x + 1) % cuda.gridDim.x
                if seen[nb] < base + r:
                    seen[cuda.gridDim.x] = 1  # a neighbour's write not yet seen: a broken barrier
            barrier(bar)
            if cuda.threadIdx.x == 0:
                seen[cuda.blockIdx.x] = base + r + 1
    return rounds


def _time(compiled, bar, n_round, seen, n_block, reps=20) -> float:
    """Milliseconds a launch, the mean of reps after a warm-up (each launch's rounds counted on
    from the last's, as `rounds` checks them)."""
    stream = cuda.stream()
    base = 0

    def go():
        nonlocal base
        compiled.launch((bar, n_round, base, seen), (n_block, 1, 1), (THREADS, 1, 1), stream, 0)
        base += n_round
    go()
    start, stop = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(reps):
        go()
    stop.record(stream)
    stop.synchronize()
    return cuda.event_elapsed_time(start, stop) / reps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    a = p.parse_args(argv)
    n_sm = cuda.get_current_device().MULTIPROCESSOR_COUNT
    rows, ok = [], True
    for name, barrier in (("fenced", grid_sync_fenced), ("ordered", grid_sync),
                          ("ordered spin", grid_sync_spin), ("two-level", grid_sync_two_level)):
        kern = _kernel(barrier)
        bar = cuda.to_device(np.zeros(2 + N_SUB, np.int32))
        seen0 = cuda.to_device(np.zeros(4097, np.int32))
        compiled = kern.compile(tuple(kern.typeof_pyval(x) for x in (bar, 1, 1, seen0)))
        compiled.cooperative = True
        most = compiled.max_cooperative_grid_blocks(THREADS, 0)
        for n_block in sorted({n_sm, 2 * n_sm, 4 * n_sm, min(most, 4096)}):
            if n_block > most:
                continue
            seen = cuda.to_device(np.zeros(n_block + 1, np.int32))
            before = int(bar.copy_to_host()[1])
            t_short = _time(compiled, bar, 33, seen, n_block)
            broken = int(seen.copy_to_host()[n_block])
            seen = cuda.to_device(np.zeros(n_block + 1, np.int32))
            t_long = _time(compiled, bar, 129, seen, n_block)
            words, broken = bar.copy_to_host(), broken + int(seen.copy_to_host()[n_block])
            # 21 launches of 33 rounds and 21 of 129, two barriers a round
            want_gen = before + 2 * 21 * (33 + 129)
            good = (words[0] == 0 and words[1] == want_gen and not words[2:].any()
                    and broken == 0)
            ok &= good
            us = (t_long - t_short) * 1e3 / (2 * 96)
            rows.append({"barrier": name, "n_block": n_block, "launch_33_rounds_us": t_short * 1e3,
                         "barrier_us": us, "words_ok": bool(good)})
    print(f"{'barrier':<14} {'blocks':>6} {'33 rounds us':>13} {'a barrier us':>13}  words")
    for r in rows:
        print(f"{r['barrier']:<14} {r['n_block']:>6} {r['launch_33_rounds_us']:>13.2f} "
              f"{r['barrier_us']:>13.3f}  {'ok' if r['words_ok'] else 'BROKEN'}")
    if a.json:
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        from ab_engine import write
        write(a.json, "grid_barrier.py", rows=rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
