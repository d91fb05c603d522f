"""What differs between Linux and Windows for the one-file app: the executable's name, the
driver libraries it needs, and the per-user cache folder. Every function takes the platform and
environment as arguments (defaults: this process), so Windows answers are tested on Linux."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


def is_windows(platform: str = sys.platform) -> bool:
    return platform == "win32"


def executable_name(platform: str = sys.platform) -> str:
    """What `pyinstaller strata.spec` writes under dist/."""
    return "strata.exe" if is_windows(platform) else "strata"


def user_cache_dir(*, platform: str = sys.platform, environ: Mapping[str, str] = os.environ,
                   home: Path | None = None) -> Path:
    """Strata's per-user cache folder (the same one the default model is written to):
    %LOCALAPPDATA%\\strata\\cache on Windows, else $XDG_CACHE_HOME/strata or ~/.cache/strata."""
    home = Path.home() if home is None else home
    if is_windows(platform):
        base = environ.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(base) / "strata" / "cache"
    base = environ.get("XDG_CACHE_HOME") or str(home / ".cache")
    return Path(base) / "strata"


@dataclass(frozen=True, slots=True)
class DriverLibraries:
    """File names of the NVIDIA driver's CUDA and NVML libraries on one platform."""

    cuda: str
    nvml: str


def driver_libraries(platform: str = sys.platform) -> DriverLibraries:
    """The driver's libraries: the only NVIDIA files the binary needs from the system. On Windows
    both live in System32 (NVML also in the driver store), found by the normal DLL search."""
    if is_windows(platform):
        return DriverLibraries(cuda="nvcuda.dll", nvml="nvml.dll")
    return DriverLibraries(cuda="libcuda.so.1", nvml="libnvidia-ml.so.1")


def load_driver(*, platform: str = sys.platform,
                loader: Callable[[str], object] | None = None) -> tuple[str, str | None]:
    """(library name, None when it loads or the loader's error): whether the CUDA driver library
    is present. `loader` defaults to ctypes' loader for the platform."""
    name = driver_libraries(platform).cuda
    if loader is None:
        loader = ctypes.WinDLL if is_windows(platform) else ctypes.CDLL  # type: ignore[attr-defined]
    try:
        loader(name)
    except OSError as e:
        return name, str(e) or type(e).__name__
    return name, None
