"""Output files of the subcommands (`--logits-out`, `profile -o`, `bench --json-out`): checked
before the work starts, so a bad path fails in a second instead of after the run, and written
atomically (a temporary file beside the target, then a rename), so a failure leaves nothing
half-written in the target's place."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Callable, IO

from strata.errors import StrataError
from strata.outputs import OutputPathError, output_target


def npy_path(path: str | os.PathLike[str]) -> str:
    """`path` as numpy's `np.save(path)` names it: `.npy` added where it lacks it."""
    path = os.fspath(path)
    return path if path.endswith(".npy") else path + ".npy"


def _tmp_name(target: Path) -> Path:
    return target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.partial")


def check_output(path: str | os.PathLike[str], flag: str) -> Path:
    """Refuse an output that cannot be written: a directory, an existing file that is not a
    regular one (the rename would replace a device or FIFO), a missing folder, a folder that
    refuses a new file (tried by making and removing one: permission bits do not tell, for
    root or on /proc). Returns the file to write (a symlink's target)."""
    shown = Path(path)
    try:
        target = output_target(shown)
    except OutputPathError as e:
        raise StrataError(f"{flag} {shown}: {e}") from None
    folder = target.parent
    probe = _tmp_name(target)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        os.unlink(probe)
    except OSError as e:
        raise StrataError(f"{flag} {shown}: cannot create a file in {folder} "
                          f"({e.strerror or e})") from None
    return target


def write_atomic(path: str | os.PathLike[str], flag: str, write: Callable[[IO[bytes]], None],
                 ) -> None:
    """Write `path` through `write(binary file)`: into a temporary file in the same folder,
    renamed over `path` once complete; on any failure the temporary file is removed and the
    target is left as it was. An OSError is a StrataError naming the flag and the path."""
    shown = Path(path)
    target = check_output(shown, flag)
    tmp = _tmp_name(target)
    try:
        # O_EXCL with mode 0o666: the new file gets the permissions a plain open would (umask)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder went away: nothing of ours is left in it
        if isinstance(e, OSError):
            raise StrataError(f"{flag} {shown}: writing it failed "
                              f"({e.strerror or e})") from None
        raise
