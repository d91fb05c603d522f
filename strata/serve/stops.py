"""`StopMatcher`: ends generated text at the first stop string, across token boundaries.

Text that could still be the start of a stop string is held back until the next piece decides
it, so a client never receives part of a stop sequence.
"""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Feed decoded text piece by piece; get back what is safe to send and the stop that hit."""

    def __init__(self, stops: Sequence[str]):
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        self.stops = tuple(stops)
        self._held = ""

    def _held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best

    def feed(self, text: str) -> tuple[str, str | None]:
        """(text safe to emit, the stop string matched or None). After a match, stop feeding."""
        buf = self._held + text
        if not self.stops:
            self._held = ""
            return buf, None
        first, hit = len(buf) + 1, None
        for stop in self.stops:
            i = buf.find(stop)
            if i != -1 and i < first:
                first, hit = i, stop
        if hit is not None:
            self._held = ""
            return buf[:first], hit
        keep = self._held_back(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], None

    def flush(self) -> str:
        """The held-back text, once generation ended without a stop."""
        out, self._held = self._held, ""
        return out
