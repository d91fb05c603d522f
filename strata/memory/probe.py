"""Free/total VRAM and the driver model of each GPU, read through NVML (no CUDA context, no
numba): what `strata plan` plans against when no `--gpu-mem` is given."""

from __future__ import annotations

import sys

from strata.errors import StrataError
from strata.plan.devices import DeviceInfo


class NoGpuError(StrataError):
    """No NVIDIA GPU could be read."""


_DRIVER_MODELS = {0: "wddm", 1: "tcc", 2: "mcdm"}  # NVML_DRIVER_WDDM / _WDM (TCC) / _MCDM
_HINT = "to plan for a card you don't have, give its size: --gpu-mem 16GiB"


def _driver_model(nvml, handle) -> str:
    if not sys.platform.startswith("win"):
        return "linux"
    try:
        return _DRIVER_MODELS.get(int(nvml.nvmlDeviceGetCurrentDriverModel(handle)), "wddm")
    except nvml.NVMLError:
        return "wddm"  # Windows without the query: assume the cautious model


def probe_devices() -> list[DeviceInfo]:
    """Every GPU NVML sees; NoGpuError (naming --gpu-mem) when there is none or no NVML."""
    try:
        import pynvml as nvml
    except ImportError as e:
        raise NoGpuError(f"cannot read GPUs: the NVML bindings are missing ({e}); {_HINT}") from e
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:
        raise NoGpuError(f"no NVIDIA GPU found (NVML: {e}); {_HINT}") from None
    try:
        out = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            out.append(DeviceInfo(i, name, int(mem.free), int(mem.total),
                                  _driver_model(nvml, h)))
    except nvml.NVMLError as e:
        raise NoGpuError(f"reading the GPUs through NVML failed ({e}); {_HINT}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
    if not out:
        raise NoGpuError(f"NVML reports no GPU; {_HINT}")
    return out
