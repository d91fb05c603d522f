"""Test-wide settings.

Kernels run in numba's CUDA simulator unless STRATA_TEST_GPU=1 asks for the real GPU: the choice
must be made before numba.cuda is first imported, so it is made here, once per test process.
Tests marked `gpu` need the real device and skip cleanly elsewhere.
"""

from __future__ import annotations

import getpass
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

USE_REAL_GPU = os.environ.get("STRATA_TEST_GPU") == "1"
if not USE_REAL_GPU:
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

# Each pytest-xdist worker gets its own numba disk cache (set before numba is imported,
# inherited by the servers and CLIs the tests start). numba's cache is not safe for processes
# that write one function's cache at once: each reads the index, picks a data-file name and
# writes the index back, so one loses the other's entry, and two that pick the same name leave
# an index entry pointing at the other signature's machine code. A worker runs whole files, so
# its cache still serves its own subprocesses and the next run of the same sources: the folder
# is keyed by their digest (`numba_cache.source_digest`), because numba would load a function
# whose file is unchanged but whose callee in another file changed. A folder the user chose wins
# (the marker tells a worker that the folder it inherited is the controller's, not the user's).
_OURS = "STRATA_TEST_NUMBA_CACHE"
_STALE_S = 2 * 86400  # another state's folder unused this long is removed (tens of MB each)


def _test_numba_cache() -> str:
    from strata.aot.numba_cache import source_digest
    mine = Path(tempfile.gettempdir(), f"strata-test-numba-{getpass.getuser()}",
                os.environ.get("PYTEST_XDIST_WORKER", "main"))
    here = mine / f"src-{source_digest()}"
    here.mkdir(parents=True, exist_ok=True)
    os.utime(here)  # its mtime: when a run last used it
    now = time.time()
    for old in mine.iterdir():
        try:
            if old != here and now - old.stat().st_mtime > _STALE_S:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
        except OSError:
            pass  # another run's, in use or gone: never a reason to fail the tests
    return str(here)


if "NUMBA_CACHE_DIR" not in os.environ or os.environ.get(_OURS) == "1":
    os.environ["NUMBA_CACHE_DIR"] = _test_numba_cache()
    os.environ[_OURS] = "1"

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


def _numba_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("NUMBA_")}


@pytest.fixture(autouse=True)
def _numba_settings_stay(request):
    """numba re-reads its NUMBA_* settings at every compile, so a test that leaves one changed
    changes how every later test of its worker compiles and caches (a frozen-app cache locator
    leaked this way stamps entries by the interpreter, not the sources, and can serve machine
    code compiled from older ones). Restored here, and the test that changed them fails."""
    before = _numba_env()
    yield
    after = _numba_env()
    if after == before:
        return
    for k in set(after) - set(before):
        del os.environ[k]
    os.environ.update(before)
    if "numba" in sys.modules:
        from numba.core import config
        config.reload_config()
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    pytest.fail(f"{request.node.nodeid} left numba settings changed: {', '.join(changed)}",
                pytrace=False)


@pytest.fixture(autouse=True)
def _prompts_take_the_prompt_path(monkeypatch):
    """The CUDA engines' automatic short-prompt steps off (`prompt_steps.MAX_STEPS` 0: the
    plan's estimate gives 0), so every test written for the prompt path still runs it, however
    short its prompt; the tests of the steps give `prompt_steps` (an explicit limit is kept)."""
    from strata.engine.cuda import prompt_steps
    monkeypatch.setattr(prompt_steps, "MAX_STEPS", 0)


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


def pytest_terminal_summary(terminalreporter):
    """With $STRATA_KERNEL_BUNDLE on the GPU, what the bundle served this process: its images
    loaded, and the kernels it lacked (compiled instead), so a run checks the bundle too."""
    if not USE_REAL_GPU or "strata.aot.runtime" not in sys.modules:
        return
    from strata.aot import runtime
    if runtime.attached() is None:
        return
    st = runtime.stats()
    loaded = ", ".join(f"{k} {v}" for k, v in sorted(st.loaded.items())) or "none"
    missed = sorted(set(st.missed))
    terminalreporter.write_line(f"kernel bundle {runtime.bundle_path()}: loaded {loaded}; "
                                f"not in it (compiled): {len(missed)}")
    for name in missed:
        terminalreporter.write_line(f"  not bundled: {name}")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """On the GPU the test process ends the way a `strata` command does (strata.shutdown):
    past cuda.core's crash at exit, which would otherwise turn a passing run's status into 134."""
    if USE_REAL_GPU and _EXIT_STATUS and _pytest_owns_the_process():
        from strata.shutdown import finish
        finish(_EXIT_STATUS[-1])
