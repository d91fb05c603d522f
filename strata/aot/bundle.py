"""The kernel bundle: every CUDA kernel specialization compiled ahead of time, one zip file.

    index.json                     {"format", "toolchain", "archs", "kernels": [entry, ...]}
    k0007/sm_90.cubin ...          one cubin per architecture of `CUBIN_ARCHS`
    k0007/compute_90.ptx           PTX for GPUs newer than every cubin (JIT-compiled by the driver)

An entry names its kernel by `identity.kernel_key` and its argument types by
`identity.signature_key`; `choose_image` picks what a GPU of a given compute capability loads.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from strata.errors import StrataError

FORMAT = 1
# Cubins run on their own major version at equal or higher minor (sm_80 also serves 8.7, sm_120
# also 12.1); the PTX serves every GPU of compute capability 9.0 and above without a cubin.
CUBIN_ARCHS: tuple[tuple[int, int], ...] = ((8, 0), (8, 6), (8, 9), (9, 0), (12, 0))
PTX_ARCH: tuple[int, int] = (9, 0)
INDEX = "index.json"


class BundleError(StrataError):
    """The kernel bundle is missing, unreadable, or cannot serve this GPU."""


def cubin_tag(cc: tuple[int, int]) -> str:
    return f"sm_{cc[0]}{cc[1]}"


def ptx_tag(cc: tuple[int, int]) -> str:
    return f"compute_{cc[0]}{cc[1]}"


def _parse_tag(tag: str) -> tuple[str, tuple[int, int]]:
    kind, _, digits = tag.partition("_")
    if kind not in ("sm", "compute") or not digits.isdigit() or len(digits) < 2:
        raise BundleError(f"kernel bundle: bad image tag {tag!r}")
    return kind, (int(digits[:-1]), int(digits[-1]))


# The dispatcher options that change the compiled code; an entry must have been built with the
# same values as the dispatcher that asks for it.
CODE_OPTIONS = ("launch_bounds", "fastmath", "max_registers", "opt", "lineinfo", "debug")


def options_key(options: dict | None) -> dict:
    """The code-changing options of a dispatcher or registry entry, JSON-shaped (tuples as lists,
    defaults dropped), so a bundle entry and a dispatcher can be compared."""
    defaults = {"fastmath": False, "opt": True, "lineinfo": False, "debug": False,
                "launch_bounds": None, "max_registers": None}
    out = {}
    for k in CODE_OPTIONS:
        v = (options or {}).get(k, defaults[k])
        if v != defaults[k] and v is not None:
            out[k] = list(v) if isinstance(v, tuple) else v
    return out


def choose_image(tags: list[str] | tuple[str, ...], cc: tuple[int, int]) -> str | None:
    """The image a GPU of compute capability `cc` loads: the cubin of its major version with the
    highest minor not above its own, else the newest PTX not newer than the GPU; None if neither."""
    best_cubin, best_ptx = None, None
    for tag in tags:
        kind, arch = _parse_tag(tag)
        fits_cubin = kind == "sm" and arch[0] == cc[0] and arch[1] <= cc[1]
        fits_ptx = kind == "compute" and arch <= tuple(cc)
        if fits_cubin and (best_cubin is None or arch > _parse_tag(best_cubin)[1]):
            best_cubin = tag
        elif fits_ptx and (best_ptx is None or arch > _parse_tag(best_ptx)[1]):
            best_ptx = tag
    return best_cubin or best_ptx


@dataclass(frozen=True, slots=True)
class Entry:
    """One kernel specialization: its keys, its registry name, its PTX entry symbol, and the
    zip member of each image (tag -> member)."""

    kernel: str
    signature: str
    name: str
    symbol: str
    cooperative: bool
    images: dict[str, str] = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # compile options, as `options_key` writes them

    def __post_init__(self) -> None:
        if not self.images:
            raise BundleError(f"kernel bundle: {self.name} has no image")
        for tag in self.images:
            _parse_tag(tag)


class KernelBundle:
    """A kernel bundle opened for lookups; images are read from the zip on first use."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        try:
            self._zip = zipfile.ZipFile(self.path)
            index = json.loads(self._zip.read(INDEX))
        except (OSError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as e:
            raise BundleError(f"kernel bundle {self.path}: cannot read it ({e})") from None
        if index.get("format") != FORMAT:
            raise BundleError(f"kernel bundle {self.path}: format {index.get('format')!r}, "
                              f"this strata reads format {FORMAT}")
        self.toolchain: dict = index.get("toolchain", {})
        self.archs: list[str] = list(index.get("archs", []))
        self.entries: dict[tuple[str, str], Entry] = {}
        for raw in index["kernels"]:
            e = Entry(**raw)
            self.entries[(e.kernel, e.signature)] = e

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, kernel: str, signature: str) -> Entry | None:
        return self.entries.get((kernel, signature))

    def image(self, entry: Entry, cc: tuple[int, int]) -> tuple[str, bytes]:
        """(tag, bytes) of the image `entry` loads on a GPU of compute capability `cc`."""
        tag = choose_image(list(entry.images), cc)
        if tag is None:
            raise BundleError(
                f"this build's kernels do not run on a GPU of compute capability "
                f"{cc[0]}.{cc[1]} (it carries {', '.join(sorted(entry.images))})")
        return tag, self._zip.read(entry.images[tag])


def write_bundle(path: Path | str, entries: list[tuple[dict, dict[str, bytes]]], *,
                 toolchain: dict, archs: list[str]) -> int:
    """Write a bundle from (entry fields without images, {tag: image bytes}) pairs; returns the
    number of kernels written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    index = {"format": FORMAT, "toolchain": toolchain, "archs": archs, "kernels": []}
    tmp = path.with_suffix(path.suffix + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as z:
        for i, (fields, images) in enumerate(entries):
            members = {}
            for tag, data in sorted(images.items()):
                ext = "ptx" if tag.startswith("compute") else "cubin"
                members[tag] = f"k{i:04d}/{tag}.{ext}"
                z.writestr(members[tag], data)
            Entry(**fields, images=members)  # validates the fields before they are written
            index["kernels"].append({**fields, "images": members})
        z.writestr(INDEX, json.dumps(index, indent=1, sort_keys=True))
    tmp.replace(path)
    return len(entries)
