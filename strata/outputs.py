"""Output files (`synth -o`, `--logits-out`, `profile -o`, `bench --json-out`): the file a write
goes to, checked before anything is written. A symlink is written through, as a shell's `>`
would (the caller's rename then replaces its target, never the link); an existing output must be
a regular file, since the rename would replace a device node, FIFO or socket with a regular
file; its folder must exist."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from strata.errors import StrataError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


class OutputPathError(StrataError):
    """Why an output cannot be written there (the message is the reason alone: callers say
    which output)."""


def output_target(path: str | os.PathLike[str]) -> Path:
    """The file a write of `path` goes to (a symlink's target); `OutputPathError` where it is
    not a regular file or its folder is missing."""
    path = Path(path)
    target = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = target.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):  # not there: its folder is checked below
        mode = None
    except OSError as e:
        raise OutputPathError(e.strerror or str(e)) from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        raise OutputPathError(f"it is {kind}" + ("" if kind.startswith("not") else
                                                  ", not a regular file"))
    folder = target.parent
    if not folder.is_dir():
        raise OutputPathError(f"folder {folder} "
                              f"{'is not a folder' if folder.exists() else 'does not exist'}")
    return target
