"""The built-in default model: the `tiny` preset at Q8_0, made once in the user's cache.

`write_model` writes under a temporary name and renames at the end, so a killed first run leaves
no file here that looks complete; the next call simply writes it again.
"""

from __future__ import annotations

import sys
from pathlib import Path

DEFAULT_PRESET = "tiny"
DEFAULT_MIX = "Q8_0"
DEFAULT_SEED = 0
# Bump when the synthesizer's output for the same arguments changes, so an old cached default
# is not mistaken for the current one.
FORMAT_VERSION = 1


def cache_dir() -> Path:
    """Strata's per-user cache folder: one rule (`strata.aot.platform.user_cache_dir`) for the
    default model and the frozen app's numba cache."""
    from strata.aot.platform import user_cache_dir

    return user_cache_dir(platform=sys.platform)  # read now: tests stand in for Windows


def ensure_cache_dir(sub: str | None = None) -> Path:
    """The cache folder (or its subfolder `sub`), made if missing; a folder that cannot be made
    (its parent is a file, or not writable) is a SynthError naming it and what to do."""
    from strata.synth.errors import SynthError

    folder = cache_dir() if sub is None else cache_dir() / sub
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SynthError(f"cannot use the cache folder {folder}: {e.strerror or e} "
                         f"{_fix_hint()}") from None
    return folder


def _fix_hint() -> str:
    from strata.aot.platform import is_windows

    var = "LOCALAPPDATA" if is_windows(sys.platform) else "XDG_CACHE_HOME"
    return f"(set {var} to a writable folder, or pass -m FILE)"


def default_model_path(*, progress: bool = True) -> Path:
    """Path of the default model, writing it first (with a progress bar) if it is missing."""
    from strata.synth.config import PRESETS
    from strata.synth.errors import SynthError
    from strata.synth.writer import write_model

    path = cache_dir() / f"{DEFAULT_PRESET}-{DEFAULT_MIX}-v{FORMAT_VERSION}.gguf"
    try:
        present = path.is_file()
    except OSError:  # a folder on the way that cannot be searched: said below, by name
        present = False
    if not present:
        ensure_cache_dir()
        try:
            write_model(path, PRESETS[DEFAULT_PRESET], mix=DEFAULT_MIX, seed=DEFAULT_SEED,
                        progress=progress)
        except SynthError as e:  # the folder is there but refuses the file (read-only, full)
            raise SynthError(f"{e} {_fix_hint()}") from None
    return path
