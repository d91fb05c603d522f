"""Which GPUs a `strata generate` / `strata bench` run uses, from its flags: one GPU (the
single-GPU engine, as before) or a layer split (`SplitEngine`). Light imports only.

Rules (the same as `strata plan`'s, applied to the GPUs this process sees):
* `--gpus I,J,...` picks GPUs in stage order; without it every visible GPU is used (one visible
  GPU: the single-GPU path).
* `--gpu-mem` gives one size for every picked GPU, or one size per picked GPU (without `--gpus`,
  N sizes pick GPUs 0..N-1).
* The split-only flags (`--layer-split L,...`, `--cover-b`, `--no-helper-tiers`, `--no-carve`,
  `--stage-cache`, `--gpu-bandwidth`, `--handoff host`) with a single GPU are refused: they would be silently
  meaningless.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from strata.errors import StrataError
from strata.plan.options import OptionError
from strata.plan.split.knobs import SPLIT_ONLY, split_flags_given, split_from_args  # noqa: F401 (re-exported)
from strata.plan.split.options import SplitOptions, parse_gpus

@dataclass(frozen=True, slots=True)
class GpuRequest:
    """The GPUs a run uses (CUDA device ids, stage order), each one's VRAM cap (None: its free
    memory) and, for several, the split's knobs."""

    devices: tuple[int, ...]
    gpu_mem: tuple[int | None, ...]
    split: SplitOptions | None

    def __post_init__(self) -> None:
        if not self.devices or len(self.devices) != len(self.gpu_mem):
            raise ValueError(f"{len(self.devices)} GPUs with {len(self.gpu_mem)} VRAM caps")
        if (self.split is None) != (len(self.devices) == 1):
            raise ValueError("split knobs go with several GPUs, and only with them")

    @property
    def is_split(self) -> bool:
        return len(self.devices) > 1


def gpu_sizes(text: str | None) -> list[int] | None:
    """`--gpu-mem 8GiB` or `8GiB,16GiB` -> bytes per size (None without the flag)."""
    if text is None:
        return None
    from strata.plan.devices import parse_gpu_mem
    return [d.total_bytes for d in parse_gpu_mem(text)]


def gpu_request(args: argparse.Namespace, n_visible: int, environ=None) -> GpuRequest:
    """The run's GPUs (see the module doc); OptionError names a bad flag."""
    if n_visible < 1:  # the machine, not a flag: a failed run (status 1), not a usage error
        raise StrataError("no CUDA GPU is visible")
    sizes = gpu_sizes(args.gpu_mem)
    if args.gpus:
        ids = parse_gpus(args.gpus)
        bad = [i for i in ids if i >= n_visible]
        if bad:
            raise OptionError(f"--gpus {args.gpus}: no GPU {', '.join(map(str, bad))} (this "
                              f"process sees {_count(n_visible)})")
    elif sizes is not None and len(sizes) > 1:
        if len(sizes) > n_visible:
            raise OptionError(f"--gpu-mem {args.gpu_mem}: {len(sizes)} sizes for "
                              f"{_count(n_visible)} (give one size per GPU, or --gpus)")
        ids = tuple(range(len(sizes)))
    else:
        ids = tuple(range(n_visible))
    if sizes is None:
        caps: tuple[int | None, ...] = (None,) * len(ids)
    elif len(sizes) == 1:
        caps = tuple(sizes) * len(ids)
    elif len(sizes) == len(ids):
        caps = tuple(sizes)
    else:
        raise OptionError(f"--gpu-mem {args.gpu_mem}: {len(sizes)} sizes for the {len(ids)} "
                          f"GPUs of --gpus {args.gpus} (one size for all, or one per GPU)")
    if len(ids) == 1:
        given = split_flags_given(args)
        if given:
            raise OptionError(f"{', '.join(given)}: a layer split's flags, and GPU {ids[0]} "
                              f"runs every layer alone (give several GPUs with --gpus I,J,...)")
        return GpuRequest(ids, caps, None)
    return GpuRequest(ids, caps, split_from_args(args, environ))


def _count(n: int) -> str:
    return f"{n} GPU" + ("" if n == 1 else "s")


def visible_gpus() -> int:
    """CUDA GPUs this process sees (the simulator's one device included)."""
    from numba import cuda
    return len(cuda.gpus)


def open_split(model, options, req: GpuRequest, *, use_graph: bool = True, log=None):
    """Load `model` over `req`'s GPUs and return its `SplitEngine` (`engine.close()` gives
    everything back)."""
    from strata.engine.multi import SplitEngine, SplitModel

    kw = {} if log is None else {"log": log}
    sm = SplitModel(model, options, req.split, devices=list(req.devices),
                    gpu_mem=list(req.gpu_mem), **kw)
    try:
        return SplitEngine(sm, use_graph=use_graph)
    except BaseException:
        sm.close()
        raise
