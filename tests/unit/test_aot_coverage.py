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

from helpers.kernel_record import record_launches, registered, registered_options
from strata.synth import PRESETS, write_model


def _one_layer(name: str, n_head: int, n_head_kv: int, **more):
    return dataclasses.replace(PRESETS["tiny"], name=name, n_layer=1, n_head=n_head,
                               n_head_kv=n_head_kv, n_vocab=512, **more)


SHAPES = {
    "tiny-Q8_0": (PRESETS["tiny"], "Q8_0"),  # the default model, as `strata generate` writes it
    "g8-Q4_K_M": (_one_layer("cov8", 16, 2), "Q4_K_M"),
    "g16-Q4_K_M": (_one_layer("cov16", 16, 1), "Q4_K_M"),
    # gate and up in different formats: the mixed-format MoE kernels (strata.engine.cuda.mixed;
    # their prompt path needs n_embd >= 2 * n_ff)
    "g8-IQ_MIX": (_one_layer("cov8i", 16, 2, n_ff_expert=128), "IQ_MIX"),
    "g8-LEGACY_MIX": (_one_layer("cov8l", 16, 2, n_ff_expert=128), "LEGACY_MIX"),
}


def _zeroed(card):
    """Kernels that do not run leave their outputs as allocated: make that zeros (valid expert
    ids for the routing kernels that do run)."""
    allocate = card.allocate

    def zeroed(n):
        a = allocate(n)
        a._ary.fill(0)
        return a

    card.allocate = zeroed
    return card


def _run(path, kv_type="f16", **options):
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel
    from strata.engine.cuda.options import CudaOptions
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    card = _zeroed(NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30)))
    opts = CudaOptions(plan=PlanOptions(max_context=256, expert_cache=0, ring_mib=1,
                                        kv_type=kv_type),
                       graph=False, progress=False, **options)
    eng = CudaEngine(CudaModel(open_model(path), opts, backend=card), use_graph=False)
    tok = int(eng.prefill([5, 77]).argmax())
    eng.decode_step(tok)


def _run_batch(path, n_slots: int = 8):
    """`strata serve --batch 8`: every step size from 8 sequences down to 1 (one: the single
    engine's step), and a one-sequence step of `--batch-invariant` (the batched kernels' path)."""
    from strata.engine.cuda.batch import batch_options, load_batch
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions

    mf = open_model(path)
    card = _zeroed(NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30)))
    eng = load_batch(mf, batch_options(mf, n_slots, PlanOptions(max_context=256), graph=False,
                                       progress=False), backend=card)
    held = list(range(n_slots))
    for s in held:
        eng.prefill(s, [5, 77 + s])
    while held:
        eng.decode(held, [1] * len(held))
        eng.release(held.pop())
    same = load_batch(mf, batch_options(mf, 2, PlanOptions(max_context=256), graph=False,
                                        progress=False), backend=card, invariant=True)
    same.prefill(0, [5, 77])
    same.decode([0], [1])


def _run_split(path):
    """A layer split over two stages (one simulated GPU twice) with helper tiers on."""
    from strata.engine.cuda.options import CudaOptions
    from strata.engine.multi import SplitEngine, SplitModel
    from strata.gguf import open_model
    from strata.memory.numba_backend import NumbaBackend
    from strata.plan.options import PlanOptions
    from strata.plan.split import SplitOptions

    cards = [_zeroed(NumbaBackend(0, memory_info=lambda: (1 << 30, 1 << 30))) for _ in range(2)]
    opts = CudaOptions(plan=PlanOptions(max_context=256, ring_mib=1), graph=False,
                       progress=False)
    sm = SplitModel(open_model(path), opts,
                    SplitOptions(cuts=(1,), stage_cache=(1, 1), tier_min_bytes=0),
                    devices=[0, 0], backends=cards, log=None)
    try:
        assert any(t is not None for t in sm.tiers)
        eng = SplitEngine(sm, use_graph=False)
        eng.prefill([5, 77])
        eng.decode_tokens(2)
    finally:
        sm.close()


def _check(path, run):
    with record_launches(run=lambda name: name.startswith("strata.cuda_kernels.route.")) as seen:
        run(path)
    assert len(seen) >= 10, seen  # the prompt and decode paths really ran
    bundled = registered()
    missing = sorted(f"{name}({sig}) [{key}]" for (key, sig), name in seen.items()
                     if (key, sig) not in bundled)
    assert not missing, "launched but not in the AOT registry:\n" + "\n".join(missing)
    return set(seen.values())


def _model(tmp_models, shape):
    cfg, mix = SHAPES[shape]
    path = tmp_models / f"{cfg.name}-{mix}.gguf"
    if not path.is_file():
        write_model(path, cfg, mix=mix, seed=2, progress=False)
    return path


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_kernel_the_engine_launches_is_bundled(tmp_models, shape):
    names = _check(_model(tmp_models, shape), _run)
    if "MIX" in shape:  # gate and up differ: decode ran the mixed kernels
        assert {"proj_mixed", "down_mixed"} <= {n.rsplit(".", 1)[-1] for n in names}, names


@pytest.mark.parametrize("kv_type", ["int8", "q4_0"])
@pytest.mark.parametrize("shape", ["tiny-Q8_0", "g8-Q4_K_M", "g16-Q4_K_M"])
def test_every_kernel_a_quantized_kv_cache_launches_is_bundled(tmp_models, shape, kv_type):
    """`--kv int8` (the tensor-core decode attention) and `--kv q4_0` (the generic one)."""
    names = _check(_model(tmp_models, shape), lambda p: _run(p, kv_type=kv_type))
    want = "attention_stream" if kv_type == "int8" else "attention._split_kernel"
    assert any(want in n for n in names), names


@pytest.mark.parametrize("shape", ["tiny-Q8_0", "g8-Q4_K_M"])
def test_the_short_prompt_tiles_are_bundled(tmp_models, shape, monkeypatch):
    """`prefill_small_tiles`: a two-token prompt's grouped GEMMs take the 16-row tile."""
    from strata.cuda_kernels import matmul
    from strata.cuda_kernels.matmul_tiles import SMALL_TC_TILE
    tiles = []
    launch = matmul._launch
    monkeypatch.setattr(matmul, "_launch", lambda **kw: tiles.append(
        (kw["routing"] is not None, kw["tile"])) or launch(**kw))
    _check(_model(tmp_models, shape), lambda p: _run(p, prefill_small_tiles=True))
    grouped = {t for g, t in tiles if g}
    assert grouped == {SMALL_TC_TILE}, grouped
    assert {t for g, t in tiles if not g} == {None}  # dense projections keep their tiles


def test_every_kernel_a_layer_split_launches_is_bundled(tmp_models):
    names = _check(_model(tmp_models, "tiny-Q8_0"), _run_split)
    assert any(n.startswith("strata.engine.multi.tiers.") for n in names), names


@pytest.mark.parametrize("shape", ["tiny-Q8_0", "g8-Q4_K_M"])
def test_every_kernel_batched_serving_launches_is_bundled(tmp_models, shape):
    _check(_model(tmp_models, shape), _run_batch)


def test_no_two_bundled_specializations_share_a_key_with_other_options():
    """The bundle finds a kernel by (key, signature) and refuses an entry built with other
    options than the launching dispatcher's: two registrations of one key with different launch
    bounds (a kernel compiled twice) would leave one of them unloadable in the binary."""
    clashes = {k: v for k, v in registered_options().items()
               if any(o != v[0][1] for _, o in v[1:])}
    assert not clashes, sorted((v[0][0], [n for n, _ in v]) for v in clashes.values())[:5]
