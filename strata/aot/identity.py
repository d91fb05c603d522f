"""Stable names for kernel specializations: the same kernel built by the same factory with the
same arguments gets the same key in the build process and in the frozen app, although each
process makes its own function objects.

A key hashes the kernel's source text and the values its closure captured, following captured
device functions and plain functions recursively; an argument signature is named by numba's type
strings. Source rather than bytecode, so a bundle compiled by one Python serves an app frozen
with another (the frozen app ships the kernel modules' sources for this). A function without
source, or a captured value whose text would differ between processes (an object printed with
its address), makes the kernel unkeyable: it is then never served from a bundle.
"""

from __future__ import annotations

import hashlib
import inspect
import types as pytypes
from collections.abc import Callable
from typing import Any

import numpy as np

KEY_HEX = 24  # characters of the sha256 kept in a key: 96 bits


class UnstableKeyError(ValueError):
    """A kernel captured a value with no process-independent text."""


def kernel_key(py_func: Callable[..., Any]) -> str:
    """`module:qualname:hash` of a kernel's Python function (its code and captured values)."""
    h = hashlib.sha256()
    _feed_function(h, py_func, depth=0)
    return f"{py_func.__module__}:{py_func.__qualname__}:{h.hexdigest()[:KEY_HEX]}"


def signature_key(argtypes: tuple) -> str:
    """The argument types as numba prints them, e.g. `array(uint8, 1d, C), int64`."""
    return ", ".join(str(t) for t in argtypes)


def _feed_function(h, fn, *, depth: int) -> None:
    if depth > 32:
        raise UnstableKeyError(f"{fn.__qualname__}: captured functions nest too deeply")
    h.update(f"fn {fn.__module__}.{fn.__qualname__}\n".encode())
    try:
        h.update(inspect.getsource(fn).encode())
    except (OSError, TypeError) as e:
        raise UnstableKeyError(f"{fn.__qualname__}: no source text ({e})") from None
    for cell in fn.__closure__ or ():
        _feed_value(h, cell.cell_contents, depth=depth + 1)


def _feed_value(h, v: Any, *, depth: int) -> None:
    py_func = getattr(v, "py_func", None)  # a numba dispatcher (device function or kernel)
    if py_func is not None:
        _feed_function(h, py_func, depth=depth)
    elif isinstance(v, pytypes.FunctionType):
        _feed_function(h, v, depth=depth)
    elif isinstance(v, (tuple, list)):
        h.update(f"seq {len(v)}\n".encode())
        for x in v:
            _feed_value(h, x, depth=depth + 1)
    elif isinstance(v, np.ndarray):
        h.update(f"ndarray {v.dtype.str} {v.shape}\n".encode())
        h.update(np.ascontiguousarray(v).tobytes())
    elif isinstance(v, type):
        h.update(f"type {v.__module__}.{v.__qualname__}\n".encode())
    else:
        text = repr(v)
        if " at 0x" in text:
            raise UnstableKeyError(f"captured value {text[:80]} has no stable text")
        h.update(f"val {type(v).__qualname__} {text}\n".encode())
