"""Fixtures shared by the end-to-end tests."""

from __future__ import annotations

import pytest

from helpers.serve_process import start_server


@pytest.fixture(scope="module")
def server(tmp_models):
    """A real `strata serve` process on the tiny model, one per test module."""
    s = start_server(tmp_models)
    yield s
    s.stop()
