"""The engine behind the server's slots, per backend.

CUDA: one `CudaBatchEngine` planned for `--batch N` sequences of `--max-context` tokens each
with the plan knobs (`--gpu-mem` a budget cap): decode steps of all running sequences share one
pass over the weights. Any other backend: one single-sequence engine per slot
(`PerSlotEngines`), whose decode steps run the slots one after another.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import dataclass
from typing import Any

from strata.serve.batch import PerSlotEngines
from strata.serve.config import ServeConfig, plan_knobs_set

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


def _cuda(config: ServeConfig, model_file: Any) -> Built:
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.plan.devices import parse_size

    options = batch_options(model_file, config.batch, plan_options(config),
                            gpu_mem=parse_size(config.gpu_mem) if config.gpu_mem else None,
                            graph=not config.no_graph, profile_path=config.profile)
    engine = load_batch(model_file, options, log=lambda text: print(text, file=sys.stderr))
    return Built("cuda", engine, engine.m.plan)


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
