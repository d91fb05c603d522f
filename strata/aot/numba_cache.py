"""Start-up of the frozen (PyInstaller) app: numba's disk cache in the per-user cache folder.

A one-file app unpacks itself to a new temporary folder on every run, and numba's own locators
key the cache by the source file's folder and stamp it with that file, so in a frozen app they
find no source (none is shipped for the CPU engine) or a new folder each run. `configure` points
numba at `numba_locator.FrozenAppCacheLocator` through numba's NUMBA_CACHE_LOCATOR_CLASSES and at
`<user cache>/numba` through NUMBA_CACHE_DIR, before numba is imported, so a second run of the
same binary loads every compiled CPU-engine function instead of compiling it.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from pathlib import Path

from strata.aot.platform import user_cache_dir
from strata.aot.runtime import frozen

LOCATOR = "strata.aot.numba_locator.FrozenAppCacheLocator"


def numba_cache_dir(**kw) -> Path:
    """Where the frozen app keeps numba's compiled functions (see `platform.user_cache_dir`)."""
    return user_cache_dir(**kw) / "numba"


def configure(environ: MutableMapping[str, str] = os.environ, *,
              is_frozen: bool | None = None) -> bool:
    """Set numba's cache folder and locator for the frozen app (a user's own NUMBA_CACHE_DIR
    wins). Must run before numba is imported. Returns whether anything was set."""
    if not (frozen() if is_frozen is None else is_frozen):
        return False
    environ.setdefault("NUMBA_CACHE_DIR", str(numba_cache_dir(environ=environ)))
    environ.setdefault("NUMBA_CACHE_LOCATOR_CLASSES", LOCATOR)
    return True
