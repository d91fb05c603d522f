"""Flags a command line gave that this run cannot read, and checks of flag values only.

A flag that another backend of the same command reads (the CUDA engine's on `--backend cpu`,
the CPU bench's on `--backend cuda`) is named in a note, not refused: the same command line
runs on either backend (`generate --backend auto` picks by the machine). A flag that no backend
could read with the flags beside it is refused as a usage error (status 2)."""

from __future__ import annotations

import argparse
from contextlib import contextmanager
from typing import Callable, Iterator

from strata.errors import StrataError, UsageError

# argument groups whose flags only the CUDA engine reads: a command's own (`--backend cuda`)
# and the plan's VRAM knobs (`strata.plan.knobs.add_engine_knobs`)
CUDA_GROUPS = ("--backend cuda", "VRAM knobs")
CPU_READS = ("--max-context",)  # a VRAM knob the CPU engine takes too


def given_in_groups(add_arguments: Callable[[argparse.ArgumentParser], None],
                    args: argparse.Namespace, groups: tuple[str, ...],
                    read: tuple[str, ...] = ()) -> list[str]:
    """The flags of `add_arguments`' argument groups titled `groups`, but those in `read`, that
    `args` sets away from their defaults, as spelled on the command line, in the parser's
    order."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return [a.option_strings[0] for g in p._action_groups if g.title in groups
            for a in g._group_actions
            if a.option_strings[0] not in read
            and getattr(args, a.dest, a.default) != a.default]


def cuda_only_given(add_arguments: Callable[[argparse.ArgumentParser], None],
                    args: argparse.Namespace, read: tuple[str, ...] = CPU_READS) -> list[str]:
    """The flags of `add_arguments`' CUDA_GROUPS that `args` sets, but those the CPU run reads
    (`read`: the CPU engine's --max-context by default)."""
    return given_in_groups(add_arguments, args, CUDA_GROUPS, read)


def ignored_note(given: list[str], applies_to: str, run: str) -> str:
    """The note naming flags this run ignores: `note: --a, --b: apply to X; Y ignores them`."""
    many = len(given) > 1
    return (f"note: {', '.join(given)}: {'apply' if many else 'applies'} to {applies_to}; "
            f"{run} ignores {'them' if many else 'it'}")


@contextmanager
def flag_checks(*errors: type[StrataError]) -> Iterator[None]:
    """Around checks of the command line's values: an error of `errors` (default: any
    StrataError) raised inside is a usage error, status 2. For a library's own class that also
    says failures of a run (SynthError for a failed write, ServeConfigError for a port in use),
    where only these calls check flags."""
    try:
        yield
    except UsageError:
        raise
    except errors or (StrataError,) as e:
        raise UsageError(str(e)) from None
