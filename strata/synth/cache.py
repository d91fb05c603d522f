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


def default_model_path(*, progress: bool = True) -> Path:
    """Path of the default model, writing it first (with a progress bar) if it is missing."""
    from strata.synth.config import PRESETS
    from strata.synth.writer import write_model

    path = cache_dir() / f"{DEFAULT_PRESET}-{DEFAULT_MIX}-v{FORMAT_VERSION}.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_model(path, PRESETS[DEFAULT_PRESET], mix=DEFAULT_MIX, seed=DEFAULT_SEED,
                    progress=progress)
    return path
