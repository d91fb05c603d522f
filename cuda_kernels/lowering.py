"""A linear-time stand-in for one quadratic step of numba-cuda's lowering, applied at import.

Before it emits a function, numba-cuda's `Lower` lists the variables assigned exactly once (they
skip an alloca). For each candidate it scans every assignment of the variable's block, so a
block of n statements costs O(n^2). Our kernels inline every device function at the numba IR
level (`inline="always"`), and their blocks grow to thousands of statements. On a 2-core
machine the IQ3_S lane kernels took 100-230 s each to compile, most of it in that scan (cProfile:
119 of 179 s for `moe_gate_up_lanes_IQ3_S`), and the PTX compile test took about half of a full
test run.

`apply()` replaces the method with one that counts each block's assignments once. The result is
the same set by construction; the test compares it with numba-cuda's own method on real kernels.
It patches only the method whose source it was written against (numba-cuda 0.30.4, SOURCE_SHA),
so a numba-cuda that changes the method keeps its own (slower, never wrong).
"""

from __future__ import annotations

import hashlib
import inspect
from collections import Counter, defaultdict

# sha256 of numba-cuda 0.30.4's `Lower._find_singly_assigned_variable` source (inspect.getsource)
SOURCE_SHA = "c3b499f76517288510a5188fbb59bb96f7ca7d619b0cf4245b5f66a8bd90bbe4"

_state = {"applied": False}


def source_sha(fn) -> str | None:
    """sha256 of a function's source (what our numba-cuda patches check before they patch), or
    None where there is no source."""
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):  # no source (a frozen app): leave numba-cuda's method alone
        return None


def find_singly_assigned_variable(self) -> None:
    """numba-cuda's `Lower._find_singly_assigned_variable`, each block's assignments counted
    once instead of scanned once per variable."""
    from numba.cuda.core import ir
    from numba.cuda.core.analysis import compute_use_defs, must_use_alloca

    sav = set()
    if not self.func_ir.func_id.is_generator:
        blocks = self.func_ir.blocks
        use_defs = compute_use_defs(blocks)
        alloca_vars = must_use_alloca(blocks)
        var_assign_map = defaultdict(set)  # variable -> the blocks assigning it
        for blk, vl in use_defs.defmap.items():
            for var in vl:
                var_assign_map[var].add(blk)
        var_use_map = defaultdict(set)  # variable -> the blocks using it before defining it
        for blk, vl in use_defs.usemap.items():
            for var in vl:
                var_use_map[var].add(blk)
        n_assigned: dict = {}  # block label -> Counter of assignment targets
        for var, defblks in var_assign_map.items():
            if var in alloca_vars or len(defblks) != 1 or var_use_map[var]:
                continue
            [defblk] = defblks
            counts = n_assigned.get(defblk)
            if counts is None:
                counts = n_assigned[defblk] = Counter(
                    stmt.target.name for stmt in self.blocks[defblk].find_insts(ir.assign_types))
            if counts[var] == 1:
                sav.add(var)
    self._singly_assigned_vars = sav
    self._blk_local_varmap = {}


def apply() -> bool:
    """Install the linear method on numba-cuda's `Lower` (once); False, and nothing changed,
    where numba-cuda's method is not the one this replaces."""
    if _state["applied"]:
        return True
    from numba.cuda import lowering
    original = getattr(lowering.Lower, "_find_singly_assigned_variable", None)
    if original is None or source_sha(original) != SOURCE_SHA:
        return False
    lowering.Lower._find_singly_assigned_variable = find_singly_assigned_variable
    _state["applied"] = True
    return True
