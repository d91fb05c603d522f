"""Where numba keeps the CPU engine's compiled functions, set before numba is imported.

numba checks a cached function against its own source file only: a function whose file did not
change is loaded from the cache even when a function it calls (in another file) did, so an
upgrade or an edit that changes only a callee would run the old machine code. Strata therefore
keys the cache folder by a digest of every source file that numba compiles
(`NUMBA_SOURCE_DIRS`): any change there starts a fresh folder.

* A source or pip install: `<user cache>/numba/src-<digest>` (numba's own locators below it).
  Each run marks its folder used (its modification time) and removes the `src-*` folders of
  other digests that no run has used for STALE_DAYS days: earlier states of the sources, tens of
  MB each, that would otherwise pile up with every upgrade. A folder in use by a running
  strata of another version was marked when it started, so only a month-long run could lose
  its cache (numba then compiles again; nothing fails).
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
import shutil
import time
from collections.abc import MutableMapping
from pathlib import Path

from strata.aot.platform import user_cache_dir
from strata.aot.runtime import frozen

LOCATOR = "strata.aot.numba_locator.FrozenAppCacheLocator"
STALE_DAYS = 30  # a source folder of another digest unused this long is removed
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
        here = source_cache_dir(environ=environ)
        environ["NUMBA_CACHE_DIR"] = str(here)
        prune_stale(here)
    return "source"


def prune_stale(here: Path, *, now: float | None = None,
                stale_days: float = STALE_DAYS) -> list[Path]:
    """Mark `here` (a `src-<digest>` folder) used and remove its `src-*` siblings unused for
    `stale_days`; returns those removed. Never raises: a folder that cannot be made, read or
    removed (another user's, read-only, in use on Windows) is left as it is."""
    removed: list[Path] = []
    try:
        here.mkdir(parents=True, exist_ok=True)
        os.utime(here)
        limit = (time.time() if now is None else now) - stale_days * 86400
        for old in here.parent.glob("src-*"):
            if old != here and old.is_dir() and old.stat().st_mtime < limit:
                shutil.rmtree(old, ignore_errors=True)
                if not old.exists():
                    removed.append(old)
    except OSError:
        pass
    return removed
