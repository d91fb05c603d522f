"""How a Strata process ends once its work is done.

A process that used CUDA ends with os._exit after flushing its output: cuda.core releases the
primary contexts it cached per thread from libc's thread-local destructors, after Python has
finalized, and that call re-enters Python and crashes the process at exit (NVIDIA/cuda-python
issue 2743; seen with two GPUs as 'double free or corruption' or SIGSEGV after complete output,
which turned a finished run's status into 134/139). Every file Strata writes is closed by the
time a command returns, so skipping those destructors loses nothing.
"""

from __future__ import annotations

import logging
import os
import sys


def cuda_started() -> bool:
    """Whether this process initialized the CUDA driver through numba-cuda."""
    drv = sys.modules.get("numba.cuda.cudadrv.driver")
    return bool(drv is not None and getattr(getattr(drv, "driver", None), "is_initialized",
                                            False))


def finish(rc: int) -> None:
    """End the process with status `rc` (never returns)."""
    if cuda_started():
        logging.shutdown()
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):  # a closed or broken pipe: nothing left to write
                pass
        os._exit(rc)
    sys.exit(rc)
