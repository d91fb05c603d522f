"""Planar layouts: the engine's own VRAM arrangement of a format whose GGUF blocks sit at 2-byte
boundaries, so that the kernels read every field with aligned vector loads.

GGUF's Q6_K super-block is 210 bytes (ql[128] @0, qh[64] @128, int8 scales[16] @192, f16 d @208):
a lane's 16 bytes of it start at an even offset and take three 8-byte loads and a realignment
(`cuda_kernels.spans`). Measured on the H100 (`bench/probes/q6k_aligned.py`, blocks padded to 224
bytes): 9.5-17% faster one-token matvecs at 4096x4096, 2048->4096 and 4096->2048.

A planar tensor keeps GGUF's order of super-blocks and regroups each run of `group` of them (8:
1,680 bytes) field by field: the group's 8 ql fields, then its 8 qh, 8 scales and 8 d:

    group g (super-blocks 8g .. 8g + 7) at 1680 g:  ql[k] @128k   qh[k] @1024 + 64k
                                                    sc[k] @1536 + 16k   d[k] @1664 + 2k

Every field but d starts 16-byte aligned and no byte is added where the tensor holds a multiple
of 8 super-blocks (every 2048- or 4096-column matrix); otherwise the last group is padded. The
kernels keep GGUF's byte offsets as addresses of a super-block (row r, super-block j at
(r * n_sb + j) * 210) and the planar readers map them: super-block index g = off // 210.

Which tensors the engine stores planar (`planar_tensor`): the dense projection matrices and the
head: the matvecs, small-batch matvecs and prefill GEMMs read them, all of which have planar
readers. The token embedding (looked up from host memory too), the router and the experts (their
blobs come from the host store, which the CPU engine reads in GGUF's layout) keep GGUF's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .types import BY_NAME

PSEUDO_BASE = 256  # planar type numbers: 256 + the GGUF type's (GGML's own stay below 64)


@dataclass(frozen=True, slots=True)
class PlanarFormat:
    """One planar layout of a GGUF format (see the module doc)."""

    ggml_type: int      # the number the kernels dispatch on (PSEUDO_BASE + base_type)
    name: str           # e.g. "Q6_K_P8"
    base_type: int      # the GGUF type
    block_values: int
    block_bytes: int
    group: int          # super-blocks regrouped together
    fields: tuple[tuple[int, int], ...]  # (offset in a GGUF block, bytes), in GGUF's order

    @property
    def group_bytes(self) -> int:
        return self.group * self.block_bytes

    def field_offset(self, i: int) -> int:
        """Byte offset of field i's run (of `group` fields) inside a group."""
        return self.group * sum(n for _, n in self.fields[:i])

    def vram_bytes(self, n_bytes: int) -> int:
        """Bytes of a planar tensor of n_bytes GGUF bytes: whole groups."""
        n_blocks = self._blocks(n_bytes)
        return -(-n_blocks // self.group) * self.group_bytes

    def _blocks(self, n_bytes: int) -> int:
        n_blocks, rem = divmod(int(n_bytes), self.block_bytes)
        if rem:
            raise ValueError(f"{self.name}: {n_bytes} bytes is not a whole number of "
                             f"{self.block_bytes}-byte blocks")
        return n_blocks

    def pack(self, raw: np.ndarray) -> np.ndarray:
        """GGUF bytes [n_bytes] u8 -> planar bytes [vram_bytes(n_bytes)] u8 (padding zero).
        One strided copy a field (the engine packs the 30B head's 255 MB at load)."""
        raw = np.ascontiguousarray(raw, np.uint8).reshape(-1)
        n_blocks = self._blocks(raw.size)
        n_groups = -(-n_blocks // self.group)
        out = np.empty((n_groups, self.group_bytes), np.uint8)  # [group, its fields' runs]
        full, rest = divmod(n_blocks, self.group)
        out[full:] = 0  # a part-filled last group's unused places
        blocks = raw[:full * self.group_bytes].reshape(full, self.group, self.block_bytes)
        for k, (start, n) in enumerate(self.fields):
            at = self.field_offset(k)
            dst = out[:, at:at + self.group * n].reshape(n_groups, self.group, n)  # a view
            dst[:full] = blocks[:, :, start:start + n]
            if rest:  # the last group's blocks: the others stay zero
                tail = raw[full * self.group_bytes:].reshape(rest, self.block_bytes)
                dst[full, :rest] = tail[:, start:start + n]
        return out.reshape(-1)

    def unpack(self, planar: np.ndarray, n_bytes: int) -> np.ndarray:
        """The inverse of `pack`: the first n_bytes GGUF bytes of a planar tensor."""
        n_blocks = self._blocks(n_bytes)
        n_groups = -(-n_blocks // self.group)
        planar = np.asarray(planar, np.uint8).reshape(-1)
        if planar.size < n_groups * self.group_bytes:
            raise ValueError(f"{self.name}: {planar.size} planar bytes hold fewer than the "
                             f"{n_blocks} blocks of {n_bytes} GGUF bytes")
        g = planar[:n_groups * self.group_bytes].reshape(n_groups, self.group_bytes)
        blocks = np.empty((n_groups, self.group, self.block_bytes), np.uint8)
        for k, (start, n) in enumerate(self.fields):
            at = self.field_offset(k)
            blocks[:, :, start:start + n] = g[:, at:at + self.group * n].reshape(
                n_groups, self.group, n)
        return blocks.reshape(-1)[:n_bytes].copy()


def _planar(base: str, group: int, fields) -> PlanarFormat:
    q = BY_NAME[base]
    if sum(n for _, n in fields) != q.block_bytes:
        raise AssertionError(f"{base}: planar fields do not cover the block")
    return PlanarFormat(PSEUDO_BASE + q.ggml_type, f"{base}_P{group}", q.ggml_type, q.block_size,
                        q.block_bytes, group, tuple(fields))


Q6_K_P8 = _planar("Q6_K", 8, ((0, 128), (128, 64), (192, 16), (208, 2)))

BY_BASE: dict[int, PlanarFormat] = {Q6_K_P8.base_type: Q6_K_P8}
BY_TYPE: dict[int, PlanarFormat] = {p.ggml_type: p for p in BY_BASE.values()}
BY_NAME: dict[str, PlanarFormat] = {p.name: p for p in BY_BASE.values()}


def stored_bytes(name: str, n_bytes: int) -> int:
    """Bytes a tensor of n_bytes GGUF bytes takes in format `name` (a planar one's whole
    groups; any other format's n_bytes): what a kernel's buffer must hold."""
    p = BY_NAME.get(name)
    return int(n_bytes) if p is None else p.vram_bytes(n_bytes)

# The dense tensors the engine stores planar where their format has a planar layout: the
# projections and the head (see the module doc for why not the others).
PLANAR_NAMES = re.compile(r"(blk\.\d+\.attn_(q|k|v|output)|output)\.weight")


def planar_tensor(name: str, ggml_type: int) -> PlanarFormat | None:
    """The planar layout the engine keeps tensor `name` of GGUF type `ggml_type` in, or None
    where it keeps GGUF's bytes."""
    if PLANAR_NAMES.fullmatch(name) is None:
        return None
    return BY_BASE.get(int(ggml_type))


def dense_vram_bytes(name: str, ggml_type: int, n_bytes: int) -> int:
    """VRAM bytes of a dense tensor as the engine stores it (the plan's weights regions)."""
    p = planar_tensor(name, ggml_type)
    return int(n_bytes) if p is None else p.vram_bytes(n_bytes)


def vram_type(name: str, ggml_type: int) -> int:
    """The type number the kernels read tensor `name` with: its planar layout's, or its own."""
    p = planar_tensor(name, ggml_type)
    return int(ggml_type) if p is None else p.ggml_type


def base_type(ggml_type: int) -> int:
    """The GGUF type of a type number (a planar layout's base, else itself)."""
    p = BY_TYPE.get(int(ggml_type))
    return int(ggml_type) if p is None else p.base_type
