"""`run_ahead`, the loop under the CUDA engines' `device_tokens`, with stand-in callbacks: what
it enqueues before each read, and when it takes a step back."""

from __future__ import annotations

import pytest

from strata.engine.cuda.run_ahead import run_ahead


class Device:
    """Records the order of enqueued work and reads; token i is 10 + i."""

    def __init__(self, room: int):
        self.log: list[str] = []
        self.fed = 0
        self.room = room  # how many tokens the context can still feed
        self.undone = None

    def kwargs(self, limit):
        return dict(limit=limit, first=self.first, step=self.step, read=self.read,
                    can_step=lambda: self.fed < self.room, finish=self.finish)

    def first(self):
        self.log.append("pick 0")
        return 0

    def step(self, i):
        self.log.append(f"feed {i}")
        self.fed += 1
        return i + 1

    def read(self, i, pending):
        assert pending == i
        self.log.append(f"read {i}")
        return 10 + i

    def finish(self, undo):
        assert self.undone is None  # once
        self.undone = undo
        self.fed -= int(undo)


def test_each_token_is_fed_before_it_is_read_and_the_last_is_not_fed():
    d = Device(room=100)
    assert list(run_ahead(**d.kwargs(3))) == [10, 11, 12]
    assert d.log == ["pick 0", "feed 0", "read 0", "feed 1", "read 1", "read 2"]
    assert d.undone is False and d.fed == 2


def test_stopping_early_takes_back_the_step_that_fed_the_last_token():
    d = Device(room=100)
    gen = run_ahead(**d.kwargs(10))
    assert next(gen) == 10 and next(gen) == 11
    gen.close()  # the caller stops at token 1 (a stop token): "feed 1" was one too many
    assert d.undone is True and d.fed == 1
    assert d.log == ["pick 0", "feed 0", "read 0", "feed 1", "read 1"]


def test_a_full_context_ends_the_tokens_without_a_step_to_undo():
    d = Device(room=1)
    assert list(run_ahead(**d.kwargs(10))) == [10, 11]
    assert d.undone is False and d.fed == 1


def test_one_token_needs_no_step_and_a_failing_caller_still_finishes():
    d = Device(room=100)
    assert list(run_ahead(**d.kwargs(1))) == [10] and d.fed == 0 and d.undone is False
    d = Device(room=100)
    with pytest.raises(RuntimeError):
        for _ in run_ahead(**d.kwargs(5)):
            raise RuntimeError("the caller failed at the first token")
    assert d.undone is True and d.fed == 0
    d = Device(room=1)
    with pytest.raises(ValueError, match="limit must be at least 1"):
        run_ahead(**d.kwargs(0))  # at the call, before anything is enqueued
    assert d.log == []


def test_device_tokens_needs_a_prefilled_sequence():
    from types import SimpleNamespace

    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.multi.engine import SplitEngine
    for cls in (CudaEngine, SplitEngine):
        with pytest.raises(ValueError, match="device_tokens needs a prefilled sequence"):
            cls.device_tokens(SimpleNamespace(_n_past=0), None, 4)
