"""Device memory: one arena per GPU, carved from the plan and validated by touching it.

`open_arena(plan, backend)` is the only place device memory is allocated. Backends:
`HostBackend` (host memory: the CPU engine and the tests) and, imported explicitly because it
pulls in numba, `strata.memory.numba_backend.NumbaBackend`. `strata.memory.probe` reads the
GPUs through NVML without numba (for `strata plan`).
"""

from strata.memory.arena import (
    MAX_SHRINKS, SHORTFALL_ENV, Arena, ArenaError, ArenaRefusedError, Attempt, live_device_info,
    open_arena, simulated_shortfall_bytes,
)
from strata.memory.backend import DeviceBackend, HostBackend

__all__ = [
    "MAX_SHRINKS", "SHORTFALL_ENV", "Arena", "ArenaError", "ArenaRefusedError", "Attempt",
    "DeviceBackend", "HostBackend", "live_device_info", "open_arena", "simulated_shortfall_bytes",
]
