"""One deep copy per inlined function instead of one per block, in numba-cuda's inliner.

Our device functions are inlined at the numba IR level (`inline="always"`): numba-cuda's
`InlineWorker.inline_ir` copies the callee's IR twice per call site, and it deep-copies each block
on its own. Every block refers to the callee's one `Scope`, which holds every variable of the
function, so each block's copy copies the whole scope again: a callee of B blocks and V variables
costs B x V. On the 2-core machine cProfile put 29 of the 93 s that `moe_gate_up_lanes_IQ3_S`
takes to compile in those copies (503 inlined calls), and the PTX compile test is most of a full
test run.

`apply()` makes the blocks of one copy share one deep-copy memo: the scope (and anything else the
blocks share) is copied once per copy, and the copies share it as the originals do. Only the
`copy.deepcopy` that the inliner's module sees changes, and only for IR blocks inside
`inline_ir`; every other deep copy is the standard library's. It patches only the `inline_ir`
whose source it was written against (numba-cuda 0.30.4, SOURCE_SHA); another numba-cuda keeps
its own (slower, never wrong). tests/kernels/test_inline_copy.py compiles kernels both ways and
compares their PTX.
"""

from __future__ import annotations

import copy as _copy
from contextlib import contextmanager

from .lowering import source_sha

# sha256 of numba-cuda 0.30.4's `InlineWorker.inline_ir` source (inspect.getsource)
SOURCE_SHA = "e00bda41aca063e0db5f5ee8fac67f6ada3b3f419f37ff2a50f10e63122a8060"

_state = {"applied": False, "original": None}


class _SharedMemoCopy:
    """The `copy` module as numba-cuda's inliner sees it: while `inline_ir` runs (memos is a
    dict), the blocks of one scope share one memo; otherwise the standard library's."""

    def __init__(self) -> None:
        self.memos: dict[int, dict] | None = None
        self.only_scope = None  # see first_copy_only

    def __getattr__(self, name: str):
        return getattr(_copy, name)

    def deepcopy(self, x, memo=None):
        if memo is None and self.memos is not None:
            from numba.cuda.core import ir
            if isinstance(x, ir.Block):
                if self.only_scope is not None and x.scope is not self.only_scope:
                    return x  # the second copy's block: shared with the first, see first_copy_only
                # keyed by the scope's identity: the memo keeps the scope alive, so the id is
                # not reused within the call; the second copy of a call (of the first copy)
                # has a scope of its own and so a fresh memo
                memo = self.memos.setdefault(id(x.scope), {})
        return _copy.deepcopy(x, memo)


_SHIM = _SharedMemoCopy()


def _inline_ir(self, *args, **kwargs):
    """numba-cuda's `InlineWorker.inline_ir` with a fresh set of shared memos per call."""
    outer, _SHIM.memos = _SHIM.memos, {}
    try:
        return _state["original"](self, *args, **kwargs)
    finally:
        _SHIM.memos = outer


@contextmanager
def first_copy_only(scope):
    """While `inline_ir` runs inside this, only blocks of `scope` (those of the callee IR it is
    given) are deep-copied. Its second copy, of its own first copy, is what it returns as "an
    unmutated copy of the callee IR" and then shares that copy's (mutated) blocks: only for a
    caller that drops it or gets another (inline_cache.py hands back its cached IR instead).
    cProfile of batch_gate_up_tc_Q6_K: `inline_ir` took 6.7 s with the second copy, 3.9 s
    without."""
    assert _state["applied"] and _SHIM.only_scope is None
    _SHIM.only_scope = scope
    try:
        yield
    finally:
        _SHIM.only_scope = None


def apply() -> bool:
    """Install the shared-memo copy in numba-cuda's inliner (once); False, and nothing changed,
    where its `inline_ir` is not the one this was written against."""
    if _state["applied"]:
        return True
    try:
        from numba.cuda.core import inline_closurecall as icc
    except ImportError:  # a frozen app without numba-cuda's compiler passes: nothing to patch
        return False
    worker = getattr(icc, "InlineWorker", None)
    original = getattr(worker, "inline_ir", None)
    if original is None or source_sha(original) != SOURCE_SHA or icc.copy is not _copy:
        return False
    _state["original"] = original
    worker.inline_ir = _inline_ir
    icc.copy = _SHIM
    _state["applied"] = True
    return True


def restore() -> None:
    """numba-cuda's own inliner again (the test compiles both ways in one process)."""
    if not _state["applied"]:
        return
    from numba.cuda.core import inline_closurecall as icc
    icc.InlineWorker.inline_ir = _state["original"]
    icc.copy = _copy
    _state["applied"] = False
