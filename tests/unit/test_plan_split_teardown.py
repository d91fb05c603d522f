"""The layer split's teardown order (no GPU): the host store's registration ends exactly once,
after every stage's streams are drained and arenas released, and before its buffer can go; a
store passed in is left to its owner; a failed load gives back what it opened."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from strata.engine.multi.hostmap import PortableHost
from strata.engine.multi.model import SplitModel


class FakeDriver:
    def __init__(self, events):
        self.events = events

    def cuMemHostRegister(self, ptr, n, flags):
        self.events.append(("driver register", ptr, n))

    def cuMemHostUnregister(self, ptr):
        self.events.append(("driver unregister", ptr))


def _host(events):
    buf = np.zeros(4096, np.uint8)
    return buf, PortableHost(buf, driver=FakeDriver(events), events=events)


def test_registration_ends_once_on_close():
    events: list = []
    buf, ph = _host(events)
    assert ph.registered and events[-1] == ("register", buf.ctypes.data, 4096)
    ph.close()
    ph.close()
    assert [e[0] for e in events] == ["driver register", "register", "driver unregister",
                                      "unregister"]
    assert not ph.registered
    with pytest.raises(RuntimeError, match="registration has ended"):
        ph.mapped()


def test_registration_ends_when_dropped_and_keeps_the_buffer_until_then():
    events: list = []
    buf, ph = _host(events)
    ptr = buf.ctypes.data
    del buf  # the registration holds the pages: they cannot go back before it ends
    gc.collect()
    assert events[-1][0] == "register"
    del ph
    gc.collect()
    assert events[-2:] == [("driver unregister", ptr), ("unregister", ptr, 4096)]


def test_refuses_a_buffer_it_cannot_register():
    with pytest.raises(ValueError, match="C-contiguous 1-D uint8"):
        PortableHost(np.zeros(8, np.float32))


class _Stream:
    def __init__(self, events, name):
        self.events, self.name = events, name

    def synchronize(self):
        self.events.append(("sync", self.name))


class _Stage:
    def __init__(self, events, g):
        self.events, self.g = events, g
        self.stream, self.copy_stream = _Stream(events, f"{g}"), _Stream(events, f"{g} copy")

    def close(self):
        self.events.append(("arena", self.g))


class _Link:
    def __init__(self, events, name):
        self.events, self.name = events, name

    def close(self):
        self.events.append(("link", self.name))


def _split_model(events, *, shared: bool) -> SplitModel:
    sm = SplitModel.__new__(SplitModel)  # the load itself needs a model; close needs only these
    sm.devices, sm._shared, sm._closed = [0, 0], shared, False
    sm.stages = [_Stage(events, 0), _Stage(events, 1)]
    sm.links, sm.back = [_Link(events, "0->1")], _Link(events, "1->0")
    sm.store, sm.portable = _host(events)
    events.clear()
    return sm


def test_split_model_close_order_and_idempotence():
    events: list = []
    sm = _split_model(events, shared=False)
    with sm:
        pass
    sm.close()
    assert events == [("sync", "0"), ("sync", "0 copy"), ("sync", "1"), ("sync", "1 copy"),
                      ("link", "0->1"), ("link", "1->0"), ("arena", 0), ("arena", 1),
                      ("driver unregister", sm.store.ctypes.data),
                      ("unregister", sm.store.ctypes.data, 4096)]


def test_a_shared_store_is_left_to_its_owner():
    events: list = []
    sm = _split_model(events, shared=True)
    sm.close()
    assert ("arena", 1) in events and not any(e[0].endswith("unregister") for e in events)
    assert sm.portable.registered
    sm.portable.close()
    assert events[-1][0] == "unregister"


def test_a_failed_load_closes_what_it_opened(monkeypatch):
    events: list = []
    sm = _split_model(events, shared=False)
    stages = sm.stages

    def fail(self, model, options):
        self.stages.append(stages[0])
        raise MemoryError("the second stage's arena")

    monkeypatch.setattr(SplitModel, "_open_stages", fail)
    sm.stages, sm.links, sm.back = [], [], None
    with pytest.raises(MemoryError):
        sm._open_all(None, None)
    assert events[-3:] == [("arena", 0), ("driver unregister", sm.store.ctypes.data),
                           ("unregister", sm.store.ctypes.data, 4096)]
