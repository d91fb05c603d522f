"""Numba-cuda's SSA reconstruction visits only the blocks that mention the variable it fixes.

`numba.cuda.core.ssa._run_ssa` fixes one variable at a time (each variable assigned more than
once), and for each it runs two rewrites over every statement of the function: fresh names for
its assignments, then each use re-pointed at its reaching definition (with phi nodes where
definitions meet). A statement that does not mention the variable comes back unchanged from
both, and leaves no trace in their state. Our kernels inline everything into functions of
thousands of statements with about a hundred such variables: `moe_gate_up_lanes_Q6_K` made
852,000 statement visits, of which 11,700 were in blocks that mention the variable.

`apply()` lists once, per `_run_ssa`, the blocks that mention each variable (as an assignment
target or anywhere in a statement; rewriting one variable only adds new names of that variable,
so the lists stay complete), and `_run_block_rewrite` runs numba-cuda's own per-block rewrite on
those blocks and copies the others' statement lists as they are. The statements the handlers see,
and their order, are the original's, so the IR that comes out is the same: the test
(tests/kernels/test_inline_cache_ssa.py) compares the two on every function of real kernels.
SSA of four of the heaviest kernels took 1.1 s of CPU instead of 7.9 s on the 2-core machine.
Like the other patches it applies only to the functions it was written against (numba-cuda
0.30.4, RUN_SSA_SHA, REWRITE_SHA); another numba-cuda keeps its own.
"""

from __future__ import annotations

from collections import defaultdict

from .lowering import source_sha

# sha256 of numba-cuda 0.30.4's `ssa._run_ssa` and `ssa._run_block_rewrite` sources
RUN_SSA_SHA = "aa09fda773d906df5bb0a2b1b896394610af9399556779e50f93650696a2443c"
REWRITE_SHA = "66a25c0bc90d6ed188fa1f0ec24b7c504911cfdd4be1f2bc1b26a3c5f8e73eb7"

_state = {"applied": False, "run_ssa": None, "rewrite": None}
_mentions: list[dict[str, set]] = []  # per running _run_ssa: variable name -> block labels


def _blocks_mentioning(blocks) -> dict[str, set]:
    by_name: dict[str, set] = defaultdict(set)
    for label, blk in blocks.items():
        for stmt in blk.body:
            for var in stmt.list_vars():  # an assignment's target is among its variables
                by_name[var.name].add(label)
    return by_name


def _run_ssa(blocks):
    """numba-cuda's `_run_ssa`, with the blocks that mention each variable listed first."""
    _mentions.append(_blocks_mentioning(blocks) if blocks else {})
    try:
        return _state["run_ssa"](blocks)
    finally:
        _mentions.pop()


def _run_block_rewrite(blocks, states, handler):
    """numba-cuda's `_run_block_rewrite` on the blocks that mention `states["varname"]`; the
    others get new blocks holding the same statements, as the rewrite would give them."""
    rewrite = _state["rewrite"]
    varname = states.get("varname")
    if not _mentions or varname is None:
        return rewrite(blocks, states, handler)
    from numba.cuda.core import ir

    mentioned = _mentions[-1].get(varname, ())
    newblocks = {}
    for label, blk in blocks.items():
        if label in mentioned:
            newblocks.update(rewrite({label: blk}, states, handler))
        else:
            newblk = ir.Block(scope=blk.scope, loc=blk.loc)
            newblk.body = list(blk.body)
            newblocks[label] = newblk
    return newblocks


def apply() -> bool:
    """Install the block-skipping rewrite in numba-cuda's SSA pass (once); False, and nothing
    changed, where its functions are not the ones this was written against."""
    if _state["applied"]:
        return True
    try:
        from numba.cuda.core import ssa
    except ImportError:  # a frozen app without numba-cuda's compiler passes: nothing to patch
        return False
    run_ssa = getattr(ssa, "_run_ssa", None)
    rewrite = getattr(ssa, "_run_block_rewrite", None)
    if (run_ssa is None or rewrite is None or source_sha(run_ssa) != RUN_SSA_SHA
            or source_sha(rewrite) != REWRITE_SHA):
        return False
    _state.update(run_ssa=run_ssa, rewrite=rewrite)
    ssa._run_ssa = _run_ssa
    ssa._run_block_rewrite = _run_block_rewrite
    _state["applied"] = True
    return True


def restore() -> None:
    """numba-cuda's own SSA pass again (the test runs both on the same IR)."""
    if not _state["applied"]:
        return
    from numba.cuda.core import ssa
    ssa._run_ssa = _state["run_ssa"]
    ssa._run_block_rewrite = _state["rewrite"]
    _state["applied"] = False
