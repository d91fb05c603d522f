"""Every Python folder ships: setup.py's package list must cover each one (a folder without
`__init__.py` is silently left out of `pip install .` and of the frozen binary)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# checkout folder -> the package name it installs as (setup.py's mapping)
ROOTS = {"strata": "strata", "cli": "strata.cli", "cuda_kernels": "strata.cuda_kernels"}


def _python_folders():
    for folder, name in ROOTS.items():
        for d in sorted((ROOT / folder).rglob("*")):
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")):
                rel = d.relative_to(ROOT / folder).parts
                yield d, ".".join((name, *rel))


def test_every_python_folder_is_a_package():
    missing = [str(d.relative_to(ROOT)) for d, _ in _python_folders()
               if not (d / "__init__.py").is_file()]
    assert not missing, f"folders with .py files but no __init__.py (not installed): {missing}"


def test_setup_lists_every_package():
    import runpy
    import sys
    from unittest import mock

    captured: dict = {}
    with mock.patch("setuptools.setup", lambda **kw: captured.update(kw)):
        cwd = Path.cwd()
        try:
            import os
            os.chdir(ROOT)
            sys.path.insert(0, str(ROOT))
            runpy.run_path(str(ROOT / "setup.py"))
        finally:
            sys.path.remove(str(ROOT))
            os.chdir(cwd)
    listed = set(captured["packages"])
    wanted = {name for _, name in _python_folders()}
    assert wanted <= listed, f"not in setup.py's packages: {sorted(wanted - listed)}"
