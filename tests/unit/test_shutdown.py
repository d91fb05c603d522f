"""strata.shutdown: a process that used CUDA ends with os._exit after its output is flushed (past
cuda.core's crash in thread-local destructors at exit); one that did not ends normally."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest

from strata import shutdown


class _Exited(Exception):
    def __init__(self, rc):
        self.rc = rc


def _fake_driver(monkeypatch, initialized: bool):
    mod = types.ModuleType("numba.cuda.cudadrv.driver")
    mod.driver = types.SimpleNamespace(is_initialized=initialized)
    monkeypatch.setitem(sys.modules, "numba.cuda.cudadrv.driver", mod)


def test_after_cuda_the_process_ends_with_os_exit_and_its_status(monkeypatch, capsys):
    _fake_driver(monkeypatch, True)
    flushed = []
    monkeypatch.setattr(sys.stdout, "flush", lambda: flushed.append("out"))
    monkeypatch.setattr(shutdown.os, "_exit", lambda rc: (_ for _ in ()).throw(_Exited(rc)))
    with pytest.raises(_Exited) as e:
        shutdown.finish(3)
    assert e.value.rc == 3 and flushed == ["out"]


def test_without_cuda_the_process_ends_normally(monkeypatch):
    _fake_driver(monkeypatch, False)
    monkeypatch.setattr(shutdown.os, "_exit", lambda rc: pytest.fail("os._exit without CUDA"))
    with pytest.raises(SystemExit) as e:
        shutdown.finish(2)
    assert e.value.code == 2
    monkeypatch.delitem(sys.modules, "numba.cuda.cudadrv.driver")
    assert not shutdown.cuda_started()


def test_the_output_written_before_os_exit_is_not_lost():
    """A real child process: buffered output to a pipe survives the os._exit path."""
    code = ("import sys, types; m = types.ModuleType('numba.cuda.cudadrv.driver'); "
            "m.driver = types.SimpleNamespace(is_initialized=True); "
            "sys.modules['numba.cuda.cudadrv.driver'] = m; "
            "print('x' * 100000, end=''); from strata.shutdown import finish; finish(5)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 5 and len(r.stdout) == 100000


def _boom():
    raise ValueError("moe: a kernel refused its shape")


@pytest.mark.parametrize("main,rc,err", [
    (lambda: 4, 4, ""),
    (lambda: None, 0, ""),
    (_boom, 1, "ValueError: moe: a kernel refused its shape"),
    (lambda: sys.exit(2), 2, ""),
    (lambda: sys.exit("bad input"), 1, "bad input"),
])
def test_run_then_finish_ends_through_finish_even_when_main_raises(monkeypatch, capsys, main,
                                                                   rc, err):
    _fake_driver(monkeypatch, True)
    monkeypatch.setattr(shutdown.os, "_exit", lambda rc: (_ for _ in ()).throw(_Exited(rc)))
    with pytest.raises(_Exited) as e:
        shutdown.run_then_finish(main)
    assert e.value.rc == rc
    assert err in capsys.readouterr().err
