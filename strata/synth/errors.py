"""The synthesizer's user-facing error."""

from __future__ import annotations

from strata.errors import StrataError


class SynthError(StrataError, ValueError):
    """A bad preset, mix, dimension, skew or output path; the message names it."""
