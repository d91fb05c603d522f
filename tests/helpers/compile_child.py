"""Run a numba-cuda patch's check in a child process with the simulator off (compiling to PTX
needs it off; the test process runs the simulator), and read its verdict.

The child prints "applied N M ..." when the patch is in place and checked, or "not applied" when
the installed numba-cuda is not the one the patch was written against (the patch then leaves
numba-cuda alone, and the child checks that it did).
"""

from __future__ import annotations

import os
import subprocess
import sys

WRITTEN_AGAINST = "0.30.4"  # the numba-cuda whose sources our patches match (SOURCE_SHA)


def run_patch_check(code: str, timeout: int) -> list[int] | None:
    """The numbers after "applied" (the child's counts); None where the patch does not apply to
    this numba-cuda (accepted only on a version other than WRITTEN_AGAINST). Asserts that the
    child succeeded and said one of the two."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    tail = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, tail
    words = proc.stdout.split()
    from importlib.metadata import version
    if words[:2] == ["not", "applied"]:
        assert version("numba-cuda") != WRITTEN_AGAINST, f"the patch did not apply\n{tail}"
        return None
    assert words[:1] == ["applied"], tail
    return [int(w) for w in words[1:]]
