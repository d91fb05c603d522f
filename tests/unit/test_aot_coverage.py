"""Every kernel specialization the CUDA engine launches is in the AOT registry the binary's kernel
bundle is built from, so the frozen app never meets a kernel it cannot load (it refuses to JIT).

The engine runs in the simulator, prompt and decode, with an empty expert cache so the ring and
the mapped miss path both run: on the built-in default model (`tiny`, Q8_0, 3 query heads per KV
head) and on one-layer models with the head groupings of the 30B (8) and 235B (16) models and a
K-quant mix. Only the routing kernels execute (the host reads their counts to pick the experts to
stream); the others are recorded, not run, which keeps full-width kernels affordable here.
"""

from __future__ import annotations

import dataclasses

import pytest

from helpers.kernel_record import record_launches, registered
from strata.synth import PRESETS, write_model


def _one_layer(name: str, n_head: int, n_head_kv: int):
    return dataclasses.replace(PRESETS["tiny"], name=name, n_layer=1, n_head=n_head,
                               n_head_kv=n_head_kv, n_vocab=512)


SHAPES = {
    "tiny-Q8_0": (PRESETS["tiny"], "Q8_0"),  # the default model, as `strata generate` writes it
    "g8-Q4_K_M": (_one_layer("cov8", 16, 2), "Q4_K_M"),
    "g16-Q4_K_M": (_one_layer("cov16", 16, 1), "Q4_K_M"),
}


def _run(path):
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    card = NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))  # the simulator has no size
    allocate = card.allocate

    def zeroed(n):  # kernels that do not run leave their outputs as allocated: make that zeros
        a = allocate(n)
        a._ary.fill(0)
        return a

    card.allocate = zeroed
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=0, ring_mib=1),
                       graph=False, progress=False)
    eng = CudaEngine(CudaModel(open_model(path), opts, backend=card), use_graph=False)
    tok = int(eng.prefill([5, 77]).argmax())
    eng.decode_step(tok)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_kernel_the_engine_launches_is_bundled(tmp_models, shape):
    cfg, mix = SHAPES[shape]
    path = tmp_models / f"{cfg.name}-{mix}.gguf"
    if not path.is_file():
        write_model(path, cfg, mix=mix, seed=2, progress=False)
    with record_launches(run=lambda name: name.startswith("strata.cuda_kernels.route.")) as seen:
        _run(path)
    assert len(seen) >= 10, seen  # the prompt and decode paths really ran
    bundled = registered()
    missing = sorted(f"{name}({sig}) [{key}]" for (key, sig), name in seen.items()
                     if (key, sig) not in bundled)
    assert not missing, "launched but not in the AOT registry:\n" + "\n".join(missing)
