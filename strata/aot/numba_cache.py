"""Where numba keeps the CPU engine's compiled functions, set before numba is imported.

numba checks a cached function against its own source file only: a function whose file did not
change is loaded from the cache even when a function it calls (in another file) did, so an
upgrade or an edit that changes only a callee would run the old machine code. Strata therefore
keys the cache folder by a digest of every source file that numba compiles
(`NUMBA_SOURCE_DIRS`): any change there starts a fresh folder.

* A source or pip install: `<user cache>/numba/src-<digest>` (numba's own locators below it).
* The frozen (PyInstaller) app: a one-file app unpacks itself to a new temporary folder on every
  run, and numba's own locators key the cache by the source file's folder and stamp it with that
  file, so in a frozen app they find no source (none is shipped for the CPU engine) or a new
  folder each run. `numba_locator.FrozenAppCacheLocator` (through NUMBA_CACHE_LOCATOR_CLASSES)
  files each function under `<user cache>/numba` by its package and stamps it with the
  executable: a new binary starts afresh, a second run of the same one compiles nothing.

A NUMBA_CACHE_DIR or NUMBA_CACHE_LOCATOR_CLASSES the user set wins.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import MutableMapping
from pathlib import Path

from strata.aot.platform import user_cache_dir
from strata.aot.runtime import frozen

LOCATOR = "strata.aot.numba_locator.FrozenAppCacheLocator"
# The folders of the strata package whose modules hold numba-compiled (njit, cache=True) code;
# tests/unit/test_numba_cache.py fails when a cached function appears anywhere else.
NUMBA_SOURCE_DIRS = ("aot", "engine/cpu", "quant")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def source_digest(root: Path = PACKAGE_ROOT) -> str:
    """16 hex digits of SHA-256 over the names and bytes of the .py files in NUMBA_SOURCE_DIRS
    under `root` (about 10 ms)."""
    h = hashlib.sha256()
    for sub in NUMBA_SOURCE_DIRS:
        for path in sorted((root / sub).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def numba_cache_dir(**kw) -> Path:
    """The frozen app's numba cache (see `platform.user_cache_dir`)."""
    return user_cache_dir(**kw) / "numba"


def source_cache_dir(**kw) -> Path:
    """A source install's numba cache: one folder per state of the compiled sources."""
    return numba_cache_dir(**kw) / f"src-{source_digest()}"


def configure(environ: MutableMapping[str, str] = os.environ, *,
              is_frozen: bool | None = None) -> str:
    """Set numba's cache folder (and, frozen, its locator) unless the user did. Must run before
    numba is imported. Returns "frozen" or "source"."""
    if frozen() if is_frozen is None else is_frozen:
        environ.setdefault("NUMBA_CACHE_DIR", str(numba_cache_dir(environ=environ)))
        environ.setdefault("NUMBA_CACHE_LOCATOR_CLASSES", LOCATOR)
        return "frozen"
    if "NUMBA_CACHE_DIR" not in environ:  # the digest reads the sources: only when it is used
        environ["NUMBA_CACHE_DIR"] = str(source_cache_dir(environ=environ))
    return "source"
