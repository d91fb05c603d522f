"""Which flags a command line gave that only the CUDA engine reads: the CPU backend names them
in a note instead of ignoring them silently."""

from __future__ import annotations

import argparse
from typing import Callable

# argument groups whose flags only the CUDA engine reads: a command's own (`--backend cuda`)
# and the plan's VRAM knobs (`strata.plan.knobs.add_engine_knobs`)
CUDA_GROUPS = ("--backend cuda", "VRAM knobs")
CPU_READS = ("--max-context",)  # a VRAM knob the CPU engine takes too


def cuda_only_given(add_arguments: Callable[[argparse.ArgumentParser], None],
                    args: argparse.Namespace) -> list[str]:
    """The flags of `add_arguments`' CUDA_GROUPS that `args` sets away from their defaults,
    as spelled on the command line, in the parser's order."""
    p = argparse.ArgumentParser(add_help=False)
    add_arguments(p)
    return [a.option_strings[0] for g in p._action_groups if g.title in CUDA_GROUPS
            for a in g._group_actions
            if a.option_strings[0] not in CPU_READS
            and getattr(args, a.dest, a.default) != a.default]
