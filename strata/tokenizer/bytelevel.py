"""The byte-level alphabet of GPT-2-style BPE vocabularies.

Byte-level vocabularies store every byte as one printable character so that token texts never
hold raw control bytes or spaces: bytes that are already printable Latin-1 (``!``..``~``,
``¡``..``¬``, ``®``..``ÿ``) stand for themselves, the other 68 bytes take the code points from
U+0100 upwards in byte order (so a space is ``Ġ``, U+0120, and a newline ``Ċ``, U+010A).
"""

from __future__ import annotations


def _build() -> tuple[str, ...]:
    printable = set(range(ord("!"), ord("~") + 1))
    printable |= set(range(ord("¡"), ord("¬") + 1))
    printable |= set(range(ord("®"), ord("ÿ") + 1))
    chars: list[str] = []
    n_shifted = 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n_shifted))
            n_shifted += 1
    return tuple(chars)


BYTE_TO_CHAR: tuple[str, ...] = _build()
"""`BYTE_TO_CHAR[b]` is the character that stands for byte `b` in a byte-level token text."""

CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
"""The inverse of `BYTE_TO_CHAR`."""


def encode_bytes(data: bytes) -> str:
    """The byte-level text of raw bytes, e.g. ``b" hi"`` -> ``"Ġhi"``."""
    return "".join(BYTE_TO_CHAR[b] for b in data)


def decode_text(text: str) -> bytes:
    """The raw bytes of a byte-level token text. A character outside the alphabet (a vocabulary
    that stores some token as plain text) stands for its own UTF-8 bytes."""
    out = bytearray()
    for c in text:
        b = CHAR_TO_BYTE.get(c)
        if b is None:
            out += c.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)
