"""The probes that time a kernel's phases (`bench/probes/moe_fused_stamps.py`) stamp a copy of
the kernel's source at lines they find by text; a kernel change that moves those lines would
leave the probe failing on the GPU machine, where time is scarce. Here, with no GPU: every
mark is found, the stamped source runs, and its factory builds the kernel for the 30B pair."""

from __future__ import annotations

from pathlib import Path

from gguf import GGMLQuantizationType as T

from strata.cuda_kernels.lanes import LANE_FORMATS

PROBES = Path(__file__).resolve().parents[2] / "bench" / "probes"


def test_the_fused_moe_stamps_find_their_lines(monkeypatch):
    monkeypatch.syspath_prepend(str(PROBES))
    import moe_fused_stamps as probe
    factory, n_stamps = probe.stamped_factory()
    assert n_stamps == len(probe.NAMES) == 8
    kern = factory(LANE_FORMATS[int(T.Q4_K)], LANE_FORMATS[int(T.Q6_K)], 2)
    assert kern.py_func.__name__ == "moe_fused_lanes"  # compiled when the probe launches it
