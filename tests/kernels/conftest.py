"""Kernel tests run tiny matrices: `matvec.X8_MIN_BYTES` (a format's 8-bit decoding only from so
many weight bytes a launch, a speed choice measured on the H200) is lifted for them, so every
8-bit decoder runs here; `test_lanes.test_x8_floor` checks the rule itself."""

from __future__ import annotations

import pytest

from strata.cuda_kernels import matvec as mv


@pytest.fixture(autouse=True)
def _every_x8_decoder(monkeypatch):
    monkeypatch.setattr(mv, "X8_MIN_BYTES", {})
