"""A fast reader of the GGUF header: key/value fields and the tensor table, nothing else.

gguf-py's `GGUFReader` builds a numpy view per array element, which takes ~8 s for a 152k-token
vocabulary (measured on the CI machine): too slow for `strata plan`, which must answer in well under
a second. This reader walks the same layout (the GGUF v2/v3 format, with gguf-py's type constants)
with `struct` on a memory map, records where each value lies, and decodes a value only when asked.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGUFValueType

from strata.gguf.errors import ModelFileError, NotGGUFError, TruncatedError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# Fixed-size scalar types: struct format and numpy dtype (little-endian).
_SCALAR = {
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.FLOAT64: ("<d", np.float64),
    GGUFValueType.BOOL: ("<?", np.bool_),
}


@dataclass(frozen=True, slots=True)
class Field:
    """Where one metadata value lies: `offset` is the first byte of the value itself; for an
    array, of its first element, with `count` elements of `item_type`."""

    name: str
    vtype: GGUFValueType
    offset: int
    count: int = 1
    item_type: GGUFValueType | None = None


@dataclass(frozen=True, slots=True)
class RawTensor:
    name: str
    ggml_type: int
    ne: tuple[int, ...]
    rel_offset: int  # from the start of the data section


class _Cursor:
    def __init__(self, path: str, buf):
        self.path, self.buf, self.pos, self.size = path, buf, 0, len(buf)

    def take(self, n: int) -> int:
        at = self.pos
        if at + n > self.size:
            raise TruncatedError(self.path, f"the GGUF header is truncated: needs byte "
                                            f"{at + n:,}, the file has {self.size:,}")
        self.pos = at + n
        return at

    def unpack(self, fmt: str, n: int):
        return struct.unpack_from(fmt, self.buf, self.take(n))[0]

    def u32(self) -> int:
        return self.unpack("<I", 4)

    def u64(self) -> int:
        return self.unpack("<Q", 8)

    def string(self) -> str:
        n = self.u64()
        at = self.take(n)
        return bytes(self.buf[at:at + n]).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        self.take(self.u64())

    def vtype(self, what: str) -> GGUFValueType:
        raw = self.u32()
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise ModelFileError(self.path, f"{what}: unknown GGUF value type {raw}") from None

    def skip_value(self, t: GGUFValueType, what: str) -> None:
        if t in _SCALAR:
            self.take(struct.calcsize(_SCALAR[t][0]))
        elif t == GGUFValueType.STRING:
            self.skip_string()
        elif t == GGUFValueType.ARRAY:
            item = self.vtype(what)
            count = self.u64()
            if item in _SCALAR:
                self.take(count * struct.calcsize(_SCALAR[item][0]))
            elif item == GGUFValueType.STRING:  # the vocabulary: keep this loop tight
                at, buf, unpack = self.pos, self.buf, struct.unpack_from
                for _ in range(count):
                    if at + 8 > self.size:
                        self.pos = at
                        self.take(8)  # raises TruncatedError
                    at += 8 + unpack("<Q", buf, at)[0]
                self.take(at - self.pos)
            else:
                for _ in range(count):
                    self.skip_value(item, what)


class Header:
    """The parsed header of a GGUF file, over a read-only memory map of the whole file."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as fh:
            self.file_bytes = fh.seek(0, 2)
            if self.file_bytes < 4:
                raise NotGGUFError(path, "not a GGUF file (shorter than its magic)")
            self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        c = _Cursor(path, self.map)
        magic = bytes(self.map[:4])
        if magic != GGUF_MAGIC:
            raise NotGGUFError(path, f"not a GGUF file (starts with {magic!r}, expected "
                                     f"{GGUF_MAGIC!r})")
        c.take(4)
        self.version = c.u32()
        if self.version not in (2, 3):
            raise ModelFileError(path, f"GGUF version {self.version} is not supported "
                                       "(expected 2 or 3, little-endian)")
        n_tensors, n_kv = c.u64(), c.u64()
        self.fields: dict[str, Field] = {}
        for _ in range(n_kv):
            name = c.string()
            t = c.vtype(f"metadata key {name!r}")
            if t == GGUFValueType.ARRAY:
                item = c.vtype(f"metadata key {name!r}")
                count = c.u64()
                field = Field(name, t, c.pos, count, item)
                c.pos -= 12  # re-read the array's own header while skipping
                c.skip_value(t, name)
            else:
                field = Field(name, t, c.pos)
                c.skip_value(t, name)
            if name in self.fields:
                raise ModelFileError(path, f"metadata key {name!r} appears twice")
            self.fields[name] = field
        self.tensors: list[RawTensor] = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.u32()
            if not 1 <= n_dims <= 4:
                raise ModelFileError(path, f"tensor {name!r} has {n_dims} dimensions (1..4)")
            ne = tuple(c.u64() for _ in range(n_dims))
            ggml_type, rel = c.u32(), c.u64()
            self.tensors.append(RawTensor(name, ggml_type, ne, rel))
        align = self.value("general.alignment") if "general.alignment" in self.fields \
            else DEFAULT_ALIGNMENT
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise ModelFileError(path, f"general.alignment {align!r} is not a power of two")
        self.data_start = -(-c.pos // align) * align

    def value(self, key: str) -> Any:
        """Decode one field: int, float, bool, str, a list of str, or a numpy array."""
        f = self.fields[key]
        if f.vtype == GGUFValueType.ARRAY:
            return self._array(f)
        return self._scalar(f.vtype, f.offset)

    def _scalar(self, t: GGUFValueType, at: int) -> Any:
        if t == GGUFValueType.STRING:
            n = struct.unpack_from("<Q", self.map, at)[0]
            return bytes(self.map[at + 8:at + 8 + n]).decode("utf-8", errors="replace")
        return struct.unpack_from(_SCALAR[t][0], self.map, at)[0]

    def _array(self, f: Field) -> Any:
        if f.item_type in _SCALAR:
            dt = np.dtype(_SCALAR[f.item_type][1]).newbyteorder("<")
            return np.frombuffer(self.map, dtype=dt, count=f.count, offset=f.offset).copy()
        if f.item_type == GGUFValueType.STRING:
            out, at, buf = [], f.offset, self.map
            for _ in range(f.count):
                n = struct.unpack_from("<Q", buf, at)[0]
                out.append(bytes(buf[at + 8:at + 8 + n]).decode("utf-8", errors="replace"))
                at += 8 + n
            return out
        raise ModelFileError(self.path, f"metadata key {f.name!r}: arrays of "
                                        f"{f.item_type.name if f.item_type else '?'} are not read")

    def data(self) -> np.ndarray:
        """The whole file as a read-only uint8 array over the map: [file_bytes] uint8."""
        return np.frombuffer(self.map, dtype=np.uint8)
