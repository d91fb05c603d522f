"""The engine behind the server's slots, per backend.

CUDA: one `CudaBatchEngine` planned for `--batch N` sequences of `--max-context` tokens each
with the plan knobs (`--gpu-mem` a budget cap): decode steps of all running sequences share one
pass over the weights. With several GPUs named (`--gpus 0,1` or several `--gpu-mem` sizes): a
layer split's `SplitEngine`, one sequence at a time. Any other backend: one single-sequence engine per slot
(`PerSlotEngines`), whose decode steps run the slots one after another.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any

from strata.serve.batch import PerSlotEngines
from strata.serve.config import SPLIT_KNOBS, ServeConfig, plan_knobs_set

log = logging.getLogger("strata.serve")


@dataclass(slots=True)
class Built:
    """The chosen backend, the slots' engine, and the accepted plan (backends that plan)."""

    backend: str
    engine: Any
    plan: Any = None


def plan_options(config: ServeConfig):
    """The per-sequence `PlanOptions` the knobs describe (batch 1: the engine multiplies)."""
    from strata.plan.knobs import options_from_args
    from strata.plan.options import LEND_FLOOR_SLOTS, LEND_PCT_DEFAULT

    ns = argparse.Namespace(
        max_context=config.max_context, kv=config.kv, kv_resident=config.kv_resident,
        prefill=config.prefill, expert_cache=config.expert_cache,
        vram_reserve_mib=config.vram_reserve_mib, ring_mib=config.ring_mib, spec=0, batch=1,
        no_prefill_borrow=config.no_prefill_borrow, embd_on_gpu=config.embd_on_gpu,
        lend_pct=LEND_PCT_DEFAULT if config.lend_pct is None else config.lend_pct,
        lend_floor_slots=(LEND_FLOOR_SLOTS if config.lend_floor_slots is None
                          else config.lend_floor_slots))
    return options_from_args(ns)


def split_args(config: ServeConfig) -> argparse.Namespace:
    """The GPU and split knobs as `strata generate`'s flags (`strata.engine.multi.request`)."""
    return argparse.Namespace(**{k: getattr(config, k) for k in ("gpu_mem",) + SPLIT_KNOBS})


def gpu_choice(config: ServeConfig, n_visible: int):
    """The GPUs the server runs on (a `GpuRequest`). Unlike `generate`, several visible GPUs
    alone do not split: `strata serve` batches sequences on one GPU (GPU 0, or the one `gpus`
    names) unless `gpus` names several or `gpu_mem` gives several sizes. A split serves one
    sequence at a time, so it refuses `batch` > 1. Every refusal is an `OptionError`: a knob's
    value or combination, status 2 like the command line's other usage errors."""
    from strata.engine.multi.request import gpu_request, gpu_sizes, split_flags_given
    from strata.plan.options import OptionError
    from strata.plan.split.options import parse_gpus

    ns = split_args(config)
    ids = parse_gpus(config.gpus) if config.gpus else None
    several = (ids is not None and len(ids) > 1) or len(gpu_sizes(config.gpu_mem) or []) > 1
    if not several:
        given = split_flags_given(ns)
        if given:
            raise OptionError(f"{', '.join(given)}: a layer split's knobs, and the server "
                                   f"runs on one GPU (name several with --gpus I,J,...)")
        ns.gpus = str(ids[0] if ids else 0)
    req = gpu_request(ns, n_visible)
    if req.is_split and config.batch > 1:
        raise OptionError(f"--batch {config.batch}: a layer split over GPUs "
                               f"{','.join(map(str, req.devices))} serves one sequence at a "
                               f"time (drop --batch, or serve from one GPU with --gpus I)")
    return req


def _cuda(config: ServeConfig, model_file: Any) -> Built:
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.engine.multi.request import visible_gpus

    req = gpu_choice(config, visible_gpus())
    if req.is_split:
        return _split(config, model_file, req)
    options = batch_options(model_file, config.batch, plan_options(config),
                            gpu_mem=req.gpu_mem[0], device=req.devices[0],
                            graph=not config.no_graph, profile_path=config.profile,
                            prompt_steps=config.prompt_steps)
    engine = load_batch(model_file, options, log=lambda text: print(text, file=sys.stderr),
                        invariant=config.batch_invariant)
    return Built("cuda", engine, engine.m.plan)


def _split(config: ServeConfig, model_file: Any, req) -> Built:
    """One `SplitEngine` over the request's GPUs behind a one-slot `SplitSlot`."""
    import dataclasses

    from strata.engine.cuda.batch import default_context
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi.request import open_split
    from strata.serve.batch import SplitSlot

    plan = plan_options(config)
    if plan.max_context is None:
        plan = dataclasses.replace(plan, max_context=default_context(model_file))
    options = CudaOptions(plan=plan, device=req.devices[0], graph=not config.no_graph,
                          profile_path=config.profile, prompt_steps=config.prompt_steps)
    engine = open_split(model_file, options, req, use_graph=not config.no_graph,
                        log=lambda text: print(text, file=sys.stderr))
    return Built("cuda-split", SplitSlot(engine), engine.sm.plan)


def build_engine(config: ServeConfig, model_file: Any) -> Built:
    """The backend `config.backend` resolves to and its engine for `config.batch` slots."""
    from strata.engine.backends import select_backend

    name, mod = select_backend(config.backend)
    if name == "cuda":
        return _cuda(config, model_file)
    ignored = plan_knobs_set(config)
    if ignored:
        log.warning("the %s backend ignores the CUDA plan knobs %s", name, ", ".join(ignored))
    make = mod.engine_factory(model_file, max_context=config.max_context)
    return Built(name, PerSlotEngines(make, config.batch))
