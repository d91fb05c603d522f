"""Elementwise kernels of the decode path: SwiGLU, residual add, the embedding row lookup from
quantized rows (token ids read from device memory, any supported format), and the scatter of a
batched step's input tokens into each sequence's token history at its position."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, types

from .launch import check_array, flat, n_blocks, register_ptx
from .qformats import FORMATS, get_format, specialize

THREADS = 256
F1 = np.float32(1.0)


@cuda.jit(device=True, inline="always")
def silu(g):
    # exp(88) is near float32's top: clamping keeps g / (1 + e^-g) at its limit 0 without inf
    return g / (F1 + math.exp(min(-g, np.float32(88.0))))


@cuda.jit
def swiglu_kernel(gate, up, out, n):
    # gate, up, out: [n] f32 (flattened [n_tok, n_ff])
    i = cuda.grid(1)
    if i < n:
        out[i] = silu(gate[i]) * up[i]


@cuda.jit
def add_kernel(a, b, out, n):
    # a, b, out: [n] f32; out may alias a
    i = cuda.grid(1)
    if i < n:
        out[i] = a[i] + b[i]


def swiglu(gate, up, out, *, stream=0) -> None:
    """out = silu(gate) * up, float32 arrays of one shape (out may alias gate or up)."""
    check_array("gate", gate, np.float32)
    check_array("up", up, np.float32, tuple(gate.shape))
    check_array("out", out, np.float32, tuple(gate.shape))
    n = gate.size
    swiglu_kernel[n_blocks(n, THREADS), THREADS, stream](flat(gate), flat(up), flat(out), n)


def add(a, b, out, *, stream=0) -> None:
    """out = a + b (the residual add), float32 arrays of one shape; out may alias a."""
    check_array("a", a, np.float32)
    check_array("b", b, np.float32, tuple(a.shape))
    check_array("out", out, np.float32, tuple(a.shape))
    n = a.size
    add_kernel[n_blocks(n, THREADS), THREADS, stream](flat(a), flat(b), flat(out), n)


def _embed_factory(fmt):
    dq32 = fmt.dq32

    @cuda.jit
    def embed_kernel(table, row_bytes, n_groups, ids, first, n_tok, out):
        # table: [n_vocab * row_bytes] u8; ids: [*] i32; first: [1] i32 (index of token 0 in
        # ids); out: [n_tok * n_embd] f32. One thread per 32-value group.
        g = cuda.grid(1)
        if g < n_tok * n_groups:
            t = g // n_groups
            tok = ids[first[0] + t]
            dq32(table, tok * row_bytes, g - t * n_groups, out, g * 32)
    return embed_kernel


embed_kernel_for = specialize(_embed_factory)


def embed(table, ggml_type, ids, first, out, *, stream=0) -> None:
    """out[t] = row ids[first[0] + t] of the quantized embedding `table` ([n_vocab, row_bytes]
    uint8), for t < n_tok = out.shape[0]. `ids` (int32) and `first` (int32 [1]) live in device
    memory, so a decode graph reads the token the sampler just wrote (ids = the token history,
    first = its length minus one). Token ids are not range-checked on the device: the sampler
    and the tokenizer produce ids < n_vocab."""
    fmt = get_format(ggml_type)
    check_array("out", out, np.float32, (None, None))
    n_tok, n_embd = out.shape
    row_bytes = fmt.row_bytes(n_embd)
    check_array("table", table, np.uint8, (None, row_bytes))
    check_array("ids", ids, np.int32, (None,))
    check_array("first", first, np.int32, (1,))
    n_groups = n_embd // 32
    embed_kernel_for(fmt.ggml_type)[n_blocks(n_tok * n_groups, THREADS), THREADS, stream](
        flat(table), row_bytes, n_groups, ids, first, n_tok, flat(out))


@cuda.jit
def scatter_tokens_kernel(tokens, seq_len, history, n):
    # tokens, seq_len: [n] i32; history: [n, n_ctx] i32. One thread per row.
    r = cuda.grid(1)
    if r < n:
        p = seq_len[r]
        if 0 <= p < history.shape[1]:  # a full row is refused by the host; never write past it
            history[r, p] = tokens[r]


def scatter_tokens(tokens, seq_len, history, *, stream=0) -> None:
    """history[r, seq_len[r]] = tokens[r] for every row r < n = tokens.shape[0]: a batched decode
    step's input tokens placed at each row's position, on the device, so one copy of all n tokens
    feeds the step and the write is part of its CUDA graph (seq_len is read when the kernel runs,
    not when it is captured). int32 arrays: tokens [n], seq_len [n], history [n, n_ctx]; a
    position outside 0..n_ctx-1 writes nothing."""
    check_array("tokens", tokens, np.int32, (None,))
    n = tokens.shape[0]
    check_array("seq_len", seq_len, np.int32, (n,))
    check_array("history", history, np.int32, (n, None))
    scatter_tokens_kernel[n_blocks(n, 32), 32, stream](tokens, seq_len, history, n)


@cuda.jit
def last_tokens_kernel(history, n_tokens, out, n):
    # history: [n, n_ctx] i32; n_tokens, out: [n] i32. One thread per row.
    r = cuda.grid(1)
    if r < n:
        c = n_tokens[r]
        out[r] = history[r, c - 1] if 0 < c <= history.shape[1] else -1


def last_tokens(history, n_tokens, out, *, stream=0) -> None:
    """out[r] = history[r, n_tokens[r] - 1] (-1 where a row's count is outside 1..n_ctx) for
    every row r < n = out.shape[0]: the tokens a batched pick appended, gathered into one array
    the host copies back at once. int32 arrays: history [n, n_ctx], n_tokens [n], out [n]."""
    check_array("out", out, np.int32, (None,))
    n = out.shape[0]
    check_array("n_tokens", n_tokens, np.int32, (n,))
    check_array("history", history, np.int32, (n, None))
    last_tokens_kernel[n_blocks(n, 32), 32, stream](history, n_tokens, out, n)


_F32 = types.float32[::1]
register_ptx("elementwise", "swiglu", lambda: (swiglu_kernel.py_func, (_F32, _F32, _F32, types.int64)))
register_ptx("elementwise", "add", lambda: (add_kernel.py_func, (_F32, _F32, _F32, types.int64)))
register_ptx("elementwise", "scatter_tokens",
             lambda: (scatter_tokens_kernel.py_func,
                      (types.int32[::1], types.int32[::1], types.int32[:, ::1], types.int64)))


def _embed_ptx(fmt):
    return lambda: (_embed_factory(fmt).py_func,
                    (types.uint8[::1], types.int64, types.int64, types.int32[::1],
                     types.int32[::1], types.int64, _F32))


for _f in FORMATS.values():
    register_ptx("elementwise", f"embed_{_f.name}", _embed_ptx(_f))
register_ptx("elementwise", "last_tokens",
             lambda: (last_tokens_kernel.py_func,
                      (types.int32[:, ::1], types.int32[::1], types.int32[::1], types.int64)))
