"""Stable names for kernel specializations: the same kernel built by the same factory with the
same arguments gets the same key in the build process and in the frozen app, although each
process makes its own function objects.

A key hashes the kernel's source text, the values its closure captured and the module globals
its code names (device functions, intrinsics and plain functions of the kernel's own package or
strata, and immutable constants: numba compiles all of them into the kernel), following
functions recursively; an argument signature is named by numba's type strings. Without the
globals, a change to a module-level device function alone (the fused MoE's grid barrier, say)
kept its callers' keys, and a build reusing an earlier bundle's images shipped the old code.
Source rather than bytecode, so a bundle compiled by one Python serves an app frozen with
another (the frozen app ships the kernel modules' sources for this). A function without
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
    """`module:qualname:hash` of a kernel's Python function (its code, captured values and the
    globals it names)."""
    h = hashlib.sha256()
    own = {"strata", (py_func.__module__ or "").split(".")[0]}
    _feed_function(h, py_func, depth=0, walk=_Walk(own))
    return f"{py_func.__module__}:{py_func.__qualname__}:{h.hexdigest()[:KEY_HEX]}"


class _Walk:
    """What a key follows: functions of these top-level packages (`own`), each once (`seen`:
    ids of the functions already fed; the walk's order is the code's, the same everywhere)."""

    __slots__ = ("own", "seen")

    def __init__(self, own: set[str]):
        self.own, self.seen = own, set()

    def follows(self, fn) -> bool:
        return (getattr(fn, "__module__", None) or "").split(".")[0] in self.own

    def follows_module(self, m: pytypes.ModuleType) -> bool:
        return m.__name__.split(".")[0] in self.own


def signature_key(argtypes: tuple) -> str:
    """The argument types as numba prints them, e.g. `array(uint8, 1d, C), int64`."""
    return ", ".join(str(t) for t in argtypes)


def _feed_function(h, fn, *, depth: int, walk: _Walk, source_only: bool = False) -> None:
    """fn's source, then (unless source_only) its closure's values and the globals it names."""
    if depth > 32:
        raise UnstableKeyError(f"{fn.__qualname__}: captured functions nest too deeply")
    h.update(f"fn {fn.__module__}.{fn.__qualname__}\n".encode())
    if id(fn) in walk.seen:  # fed already (a helper called from several places)
        return
    walk.seen.add(id(fn))
    try:
        h.update(inspect.getsource(fn).encode())
    except (OSError, TypeError) as e:
        raise UnstableKeyError(f"{fn.__qualname__}: no source text ({e})") from None
    if source_only:
        return
    for cell in fn.__closure__ or ():
        _feed_value(h, cell.cell_contents, depth=depth + 1, walk=walk)
    _feed_globals(h, fn, depth=depth, walk=walk)


def _code_names(code) -> list[str]:
    """The global and attribute names a code object and the code nested in it use, in order."""
    names = list(code.co_names)
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            names += _code_names(c)
    return names


_CONSTANT = (bool, int, float, complex, str, bytes, type(None), np.number, np.bool_)


def _feed_globals(h, fn, *, depth: int, walk: _Walk) -> None:
    """The module globals `fn`'s code names, where numba would compile them in: functions,
    dispatchers and intrinsics the walk follows, immutable constants, arrays; names looked up
    on a followed module too (`attn_split.split_len`). Anything else (modules of other
    packages, mutable containers, objects) is left out: it cannot change the kernel's code or
    is not stable text."""
    g = fn.__globals__
    names = _code_names(fn.__code__)
    mods = [g[n] for n in dict.fromkeys(names)
            if isinstance(g.get(n), pytypes.ModuleType) and walk.follows_module(g[n])]
    for name in dict.fromkeys(names):
        if name in g and not isinstance(g[name], pytypes.ModuleType):
            _feed_global(h, name, g[name], depth=depth, walk=walk)
        for m in mods:
            if hasattr(m, name) and not isinstance(getattr(m, name), pytypes.ModuleType):
                _feed_global(h, f"{m.__name__}.{name}", getattr(m, name), depth=depth,
                             walk=walk)


def _feed_global(h, name: str, v: Any, *, depth: int, walk: _Walk) -> None:
    py_func = getattr(v, "py_func", None)  # a numba dispatcher
    defn = getattr(v, "_defn", None)  # a numba intrinsic: its typing and codegen function
    if py_func is not None and walk.follows(py_func):
        h.update(f"global {name}\n".encode())
        _feed_function(h, py_func, depth=depth + 1, walk=walk)
    elif isinstance(v, pytypes.FunctionType) and walk.follows(v):
        h.update(f"global {name}\n".encode())
        _feed_function(h, v, depth=depth + 1, walk=walk)
    elif isinstance(defn, pytypes.FunctionType) and walk.follows(defn):
        # its source: the instruction it emits (its closure holds compiler objects that print
        # with their addresses; the factory arguments that differ are in the source's callers)
        h.update(f"global {name}\n".encode())
        _feed_function(h, defn, depth=depth + 1, walk=walk, source_only=True)
    elif isinstance(v, _CONSTANT) or (isinstance(v, tuple)
                                      and all(isinstance(x, _CONSTANT) for x in v)):
        h.update(f"global {name} {type(v).__qualname__} {v!r}\n".encode())
    elif isinstance(v, frozenset) and all(isinstance(x, _CONSTANT) for x in v):
        # sorted: a set's order follows string hashing, which differs between processes
        h.update(f"global {name} frozenset {sorted(map(repr, v))}\n".encode())
    elif isinstance(v, np.ndarray):
        h.update(f"global {name}\n".encode())
        _feed_value(h, v, depth=depth + 1, walk=walk)


def _feed_value(h, v: Any, *, depth: int, walk: _Walk) -> None:
    py_func = getattr(v, "py_func", None)  # a numba dispatcher (device function or kernel)
    if py_func is not None:
        _feed_function(h, py_func, depth=depth, walk=walk)
    elif isinstance(v, pytypes.FunctionType):
        _feed_function(h, v, depth=depth, walk=walk)
    elif isinstance(v, (tuple, list)):
        h.update(f"seq {len(v)}\n".encode())
        for x in v:
            _feed_value(h, x, depth=depth + 1, walk=walk)
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
