"""The frozen app runs `strata -m cuda.pathfinder...` the way `python -m` would: numba-cuda's
library probe re-runs sys.executable (the binary itself) with `-m` before CUDA can start."""

from __future__ import annotations

import json
import os
import sys

import pytest

from strata.aot import numba_cache
from strata.cli import main as cli_main
from strata.cli.main import main

PROBE = "cuda.pathfinder._dynamic_libs.dynamic_lib_subprocess"


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # run_module rewrites it
    # the frozen app's numba settings, on a copy: in os.environ they would outlive the test and
    # send every later compile of this worker to the frozen app's cache and locator
    monkeypatch.setattr(cli_main, "configure_numba_cache",
                        lambda: numba_cache.configure(dict(os.environ)))


def test_the_library_probe_runs_as_python_m_would(frozen, capsys):
    assert main(["-m", PROBE, "canary", "nvrtc"]) == 0
    payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert payload["status"] in ("ok", "not-found")


def test_the_module_s_own_usage_error_is_its_exit(frozen, capsys):
    assert main(["-m", PROBE, "no-such-mode"]) == 1
    assert "Usage" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["-m", "os"], ["-m"]])
def test_other_modules_are_refused(frozen, capsys, argv):
    assert main(argv) == 1
    assert "frozen strata runs only cuda.pathfinder.*" in capsys.readouterr().err


def test_a_developer_install_has_no_m(capsys):
    with pytest.raises(SystemExit):
        main(["-m", PROBE, "canary", "nvrtc"])  # argparse: not a subcommand
