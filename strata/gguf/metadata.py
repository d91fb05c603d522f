"""Typed access to a GGUF file's key/value metadata, with errors that name the key."""

from __future__ import annotations

from typing import Any

from gguf import GGUFValueType

from strata.gguf.errors import MissingKeyError
from strata.gguf.header import Header

_INT_TYPES = {
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
}
_FLOAT_TYPES = {GGUFValueType.FLOAT32, GGUFValueType.FLOAT64}


class Metadata:
    """The metadata of one file. Values are decoded on first use; arrays stay numpy where numeric."""

    def __init__(self, header: Header):
        self.path = header.path
        self._header = header
        self._fields = header.fields  # name -> Field (where the value lies)
        self._cache: dict[str, Any] = {}

    @classmethod
    def read(cls, path: str) -> "Metadata":
        """The metadata of the GGUF file at `path` (header only; no architecture checks)."""
        return cls(Header(str(path)))

    def __contains__(self, key: str) -> bool:
        return key in self._fields

    def keys(self) -> list[str]:
        return [k for k in self._fields if not k.startswith("GGUF.")]

    def scalars(self) -> dict[str, Any]:
        """Every key whose value is one number, bool or string (arrays, such as a tokenizer's
        vocabulary, left out without being read)."""
        return {k: self.value(k) for k in self.keys()
                if self._fields[k].vtype != GGUFValueType.ARRAY}

    def _field(self, key: str):
        f = self._fields.get(key)
        if f is None:
            raise MissingKeyError(self.path, f"missing metadata key {key!r}")
        return f

    def value(self, key: str) -> Any:
        """The decoded value: int, float, bool, str, or a list / numpy array for arrays."""
        if key in self._cache:
            return self._cache[key]
        self._field(key)
        v = self._header.value(key)
        self._cache[key] = v
        return v

    def get(self, key: str, default: Any = None) -> Any:
        return self.value(key) if key in self._fields else default

    def int(self, key: str, default: int | None = None) -> int:
        if key not in self._fields and default is not None:
            return default
        f = self._field(key)
        if f.vtype not in _INT_TYPES:
            raise MissingKeyError(self.path, f"metadata key {key!r} should be an integer, "
                                             f"found {f.vtype.name}")
        return int(self.value(key))

    def float(self, key: str, default: float | None = None) -> float:
        if key not in self._fields and default is not None:
            return default
        f = self._field(key)
        if f.vtype not in _FLOAT_TYPES | _INT_TYPES:
            raise MissingKeyError(self.path, f"metadata key {key!r} should be a number, "
                                             f"found {f.vtype.name}")
        return float(self.value(key))

    def str(self, key: str, default: str | None = None) -> str:
        if key not in self._fields and default is not None:
            return default
        f = self._field(key)
        if f.vtype != GGUFValueType.STRING:
            raise MissingKeyError(self.path, f"metadata key {key!r} should be a string, "
                                             f"found {f.vtype.name}")
        return self.value(key)
