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
import traceback
from collections.abc import Callable


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


def exit_status(e: SystemExit) -> int:
    """The status a SystemExit stands for, as `python -m` gives it: its code (None: 0), else 1
    with the message printed."""
    if e.code is None or isinstance(e.code, int):
        return int(e.code or 0)
    print(e.code, file=sys.stderr)
    return 1


def run_then_finish(main: Callable[[], int | None]) -> None:
    """Run `main` and end the process through `finish` whatever happens: its status; a
    SystemExit's; 1 with the traceback printed where it raised (without this, an error after
    CUDA started ended in the crash above, status 134, after the traceback)."""
    try:
        rc = main()
    except SystemExit as e:
        rc = exit_status(e)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        rc = 130
    except BaseException:  # noqa: BLE001 - reported in full, then the status says it failed
        traceback.print_exc()
        rc = 1
    finish(int(rc or 0))
