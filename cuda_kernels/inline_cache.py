"""Numba-cuda's inliner translates a device function once per compile instead of once per call.

Our device functions are inlined at the numba IR level (`inline="always"`). For every call site,
numba-cuda's `InlineWorker.inline_function` runs the whole untyped pipeline on the callee again:
bytecode to IR, its own inlining (recursively, so a helper called by a helper is translated once
per path to it), SSA and the rewrites, and only then copies the result into the caller. Within
one compile those runs all produce the same IR: the function's code, its globals, the flags and
the locals do not change while numba holds its compiler lock. `moe_gate_up_lanes_IQ3_S` ran the
pipeline 503 times for 26 distinct functions.

`apply()` keeps the callee's IR per compile (keyed by the compile's flags object, which every
nested pipeline of that compile shares) and hands the inliner a fresh shallow copy with a fresh
function identity for each later call site: the inliner deep-copies what it is given before it
changes anything, and names the inlined variables after the identity's unique name, so every
call site still gets variables of its own. The PTX is the same except for the numbers numba
puts in mangled names (tests/kernels/test_inline_cache_ssa.py). The inliner's second copy of
each callee, which numba-cuda's caller drops, is skipped too (`inline_copy.first_copy_only`).
On the 2-core machine four of the heaviest kernels took 48 s of CPU to compile with both against
70 s without (two processes side by side). Like the other patches it applies only to the
methods it was written against (numba-cuda 0.30.4, SOURCE_SHA, RUN_SHA); another numba-cuda
keeps its own.
"""

from __future__ import annotations

import weakref

from . import inline_copy
from .lowering import source_sha

# sha256 of numba-cuda 0.30.4's `InlineWorker.inline_function` and `.run_untyped_passes` sources
SOURCE_SHA = "69a1df109038391f7135344be3f40f6d95cf03a9e39293304a447950549a549c"
RUN_SHA = "bb8aca3616067fe2aec32bca7cde3f0bfd55577b4c113c9f2e38bcf7055f007c"

_state = {"applied": False, "original": None}
_caches: dict[int, dict] = {}  # id(flags of a compile) -> {python function: its untyped IR}


def _cache_for(flags) -> dict:
    cache = _caches.get(id(flags))
    if cache is None:
        cache = _caches[id(flags)] = {}
        # dropped with the compile's flags, so an id is never reused while its entry exists
        weakref.finalize(flags, _caches.pop, id(flags), None)
    return cache


def _inline_function(self, caller_ir, block, i, function, arg_typs=None):
    """numba-cuda's `InlineWorker.inline_function`, the callee's untyped IR kept per compile."""
    from numba.cuda.core.bytecode import FunctionIdentity

    cache = _cache_for(self.flags)
    kept = cache.get(function)
    if kept is None:
        kept = callee_ir = cache[function] = self.run_untyped_passes(function)
    else:
        # what run_untyped_passes leaves behind on the compile's shared flags
        self.flags.enable_ssa = False
        callee_ir = kept.copy()  # new block list; inline_ir deep-copies the blocks
        callee_ir.func_id = FunctionIdentity.from_function(function)  # a new unique name
    freevars = function.__code__.co_freevars
    scopes = {id(b.scope): b.scope for b in kept.blocks.values()}
    if not inline_copy._state["applied"] or len(scopes) != 1:
        return self.inline_ir(caller_ir, block, i, callee_ir, freevars, arg_typs=arg_typs)
    # inline_ir's "unmutated copy of the callee IR" is the kept IR itself: its copy of it is
    # skipped (inline_copy.first_copy_only) and the caller gets a new block list of the kept
    # one. numba-cuda's caller (InlineInlinables) drops it; one that changed its statements
    # would change the kept IR.
    with inline_copy.first_copy_only(next(iter(scopes.values()))):
        _, callee_blocks, var_dict, new_blocks = self.inline_ir(
            caller_ir, block, i, callee_ir, freevars, arg_typs=arg_typs)
    return kept.copy(), callee_blocks, var_dict, new_blocks


def apply() -> bool:
    """Install the per-compile cache in numba-cuda's inliner (once); False, and nothing changed,
    where its methods are not the ones this was written against."""
    if _state["applied"]:
        return True
    try:
        from numba.cuda.core import inline_closurecall as icc
    except ImportError:  # a frozen app without numba-cuda's compiler passes: nothing to patch
        return False
    worker = getattr(icc, "InlineWorker", None)
    original = getattr(worker, "inline_function", None)
    run = getattr(worker, "run_untyped_passes", None)
    if (original is None or run is None or source_sha(original) != SOURCE_SHA
            or source_sha(run) != RUN_SHA):
        return False
    _state["original"] = original
    worker.inline_function = _inline_function
    _state["applied"] = True
    return True


def restore() -> None:
    """numba-cuda's own inliner again (the test compiles both ways in one process)."""
    if not _state["applied"]:
        return
    from numba.cuda.core import inline_closurecall as icc
    icc.InlineWorker.inline_function = _state["original"]
    _caches.clear()
    _state["applied"] = False
