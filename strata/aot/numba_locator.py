"""The numba cache locator of the frozen app (selected by `numba_cache.configure`).

Each function's cache files go to `NUMBA_CACHE_DIR/<its package path>`, whatever folder the app
was unpacked to, and are stamped with the executable's size and modification time: a new binary
starts a fresh index, the same binary reuses it. numba still checks every entry's bytecode,
closure variables and CPU before loading it. If that folder cannot be written, a per-user folder
under the system's temporary directory is used (caching must never stop the app).
"""

from __future__ import annotations

import os
import sys
import tempfile

from numba.core import config
from numba.core.caching import _CacheLocator


def fallback_root() -> str:
    """A per-user folder under the temporary directory (POSIX: by uid; Windows: by user name)."""
    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"strata-numba-{user}")


class FrozenAppCacheLocator(_CacheLocator):
    """numba's cache locator for functions of the frozen app."""

    def __init__(self, py_func, py_file, *, root: str | None = None):
        self._lineno = py_func.__code__.co_firstlineno
        package = (py_func.__module__ or "__main__").split(".")
        self._cache_path = os.path.join(root or config.CACHE_DIR, *package)

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        st = os.stat(sys.executable)
        return ("strata-frozen", st.st_size, st.st_mtime_ns)

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        roots = [config.CACHE_DIR, fallback_root()]
        for root in roots:
            if not root:
                continue
            self = cls(py_func, py_file, root=root)
            try:
                self.ensure_cache_path()
            except OSError:
                continue
            return self
        return None
