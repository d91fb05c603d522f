"""Test-wide settings.

Kernels run in numba's CUDA simulator unless STRATA_TEST_GPU=1 asks for the real GPU: the choice
must be made before numba.cuda is first imported, so it is made here, once per test process.
Tests marked `gpu` need the real device and skip cleanly elsewhere.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile

import pytest

USE_REAL_GPU = os.environ.get("STRATA_TEST_GPU") == "1"
if not USE_REAL_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# Under pytest-xdist each worker gets its own numba disk cache (set before numba is imported,
# inherited by the servers and CLIs the tests start). numba's cache is not safe for processes
# that write one function's cache at once: each reads the index, picks a data-file name and
# writes the index back, so one loses the other's entry, and two that pick the same name leave
# an index entry pointing at the other signature's machine code. A worker runs whole files, so
# its cache still serves its own subprocesses and the next run. A folder the user chose wins.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and "NUMBA_CACHE_DIR" not in os.environ:
    os.environ["NUMBA_CACHE_DIR"] = os.path.join(
        tempfile.gettempdir(), f"strata-test-numba-{getpass.getuser()}", _WORKER)

if not USE_REAL_GPU:
    # numba's simulator without its polling block barrier and per-call module swaps (the same
    # semantics, less CPU: tests/helpers/simulator.py); after the environment above, which
    # numba reads once
    from helpers import simulator
    simulator.install()


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """On the GPU (STRATA_TEST_GPU=1) the tests run in one process: parallel workers would share
    the one device's memory and compile the same kernels once each."""
    if USE_REAL_GPU and getattr(config.option, "numprocesses", None):
        config.option.numprocesses = 0
        config.option.dist = "no"


def _real_gpu_present() -> bool:
    if not USE_REAL_GPU:
        return False
    try:
        from numba import cuda
        return bool(cuda.is_available())
    except Exception:
        return False


def _weight(path, slow: set) -> int:
    """A file's place in the run: the simulator's engine runs (minutes each) first, then the
    other slow files, then the rest."""
    if path.name.endswith("_sim.py"):
        return 0
    return 1 if path in slow else 2


def pytest_collection_modifyitems(config, items):
    # Longest first: xdist hands whole files to workers in collection order, so a slow file
    # collected last would run alone at the end while the other workers idle. The sort is
    # stable, so each file's tests stay together and in order.
    slow = {item.path for item in items if "slow" in item.keywords}
    items.sort(key=lambda item: _weight(item.path, slow))
    if _real_gpu_present():
        return
    why = ("needs a CUDA GPU: run with STRATA_TEST_GPU=1 on a machine that has one"
           if not USE_REAL_GPU else "STRATA_TEST_GPU=1 but numba sees no CUDA GPU")
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tmp_models(tmp_path_factory):
    """A per-session folder for GGUF files the tests write (one per xdist worker: pytest gives
    each worker its own base folder, so workers never write or read each other's files)."""
    return tmp_path_factory.mktemp("models")


_EXIT_STATUS: list[int] = []


def _pytest_owns_the_process() -> bool:
    """The `pytest` command or `python -m pytest`, not pytest.main() inside a bench script (which
    goes on after the tests) nor an xdist worker (its controller ends it)."""
    prog = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return (not os.environ.get("PYTEST_XDIST_WORKER")
            and (os.path.basename(prog) in ("pytest", "py.test")
                 or os.path.basename(os.path.dirname(prog)) == "pytest"))


def pytest_sessionfinish(session, exitstatus):
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """On the GPU the test process ends the way a `strata` command does (strata.shutdown):
    past cuda.core's crash at exit, which would otherwise turn a passing run's status into 134."""
    if USE_REAL_GPU and _EXIT_STATUS and _pytest_owns_the_process():
        from strata.shutdown import finish
        finish(_EXIT_STATUS[-1])
