"""The layer split's benchmark on real GPUs: greedy tokens, decode and prefill tok/s and measured
against predicted decode hit rate for a split over two GPUs against one GPU at the sum and at one
share of the budget; the carve's A/B (the same split with every stage holding every layer's
dense weights, stage caches pinned equal so only the weights differ); the hand-off's A/B (the
same split with the hidden state through pinned host memory, `--handoff-ab`); the helper tiers'
A/B (stage caches pinned small so the tiers hold pairs, against the same split without tiers,
`--tier-ab N,N`: tier hits per card, measured against predicted tier hit rate); the placement's
A/B (`--ab even,no-tiers,no-carve`: an even split of the layers, and the searched cuts without
helper tiers or without the carve, each planned afresh so its caches take what it frees or
costs). Every split run
times each link on every path the GPUs offer. One host store serves every run. Writes JSON
(updated after each run, so a run cut short still reports what it finished).

    python -m strata.engine.multi.bench MODEL --gpu-mem 8GiB,8GiB --out split.json
    python -m strata.engine.multi.bench MODEL --skip 1x16,1x8,carve --handoff-ab \
        --tier-ab 600,600 --out split.json
    python -m strata.engine.multi.bench MODEL --gpu-mem 12GiB,12GiB,16GiB,16GiB \
        --skip 1x8,carve --ab even,no-tiers,no-carve --out split4.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
from numba import cuda

from strata.engine.cuda.options import CudaOptions
from strata.errors import StrataError
from strata.gguf import open_model
from strata.plan.devices import parse_size
from strata.plan.options import PlanOptions
from strata.plan.split import SplitOptions


def _timed_run(eng, prompt: list[int], n_decode: int) -> dict:
    eng.prefill(prompt[:16])  # JIT and graph capture first
    eng.decode_tokens(4)
    eng.reset()
    before = eng.hits().counts.copy()
    tiers = getattr(eng, "tier_hits", None)  # a split's helper tiers
    tier_before = tiers() if tiers is not None else None
    eng.synchronize()
    t0 = time.perf_counter()
    logits = eng.prefill(prompt)
    eng.synchronize()
    t_pre = time.perf_counter() - t0
    t0 = time.perf_counter()
    toks = eng.decode_tokens(n_decode)
    t_dec = time.perf_counter() - t0
    h = eng.hits().counts - before
    hit = float(h[:, 0].sum() / max(1, h.sum()))
    extra = {}
    if tier_before is not None:
        t = tiers() - tier_before  # [n_layer, n_stages]: hits served by each card's tier
        extra = {"tier_hits_per_card": [int(v) for v in t.sum(axis=0)],
                 "measured_tier_hit_rate": float(t.sum() / max(1, h.sum()))}
    return {**extra, "prefill_tokens": len(prompt), "prefill_seconds": t_pre,
            "prefill_tok_per_s": len(prompt) / t_pre, "decode_steps": n_decode - 1,
            "decode_seconds": t_dec, "decode_tok_per_s": (n_decode - 1) / t_dec,
            "measured_hit_rate": hit, "first_token": int(np.argmax(logits)),
            "tokens": [int(t) for t in toks]}


def _single(mf, store, portable, cap: int, knobs: PlanOptions, prompt, n_decode) -> dict:
    from strata.engine.cuda.engine import CudaEngine
    from strata.engine.cuda.model import CudaModel

    with cuda.gpus[0]:
        m = CudaModel(mf, CudaOptions(plan=knobs, gpu_mem=cap, progress=False),
                      host_store=(store, portable.mapped()))
        try:
            out = _timed_run(CudaEngine(m), prompt, n_decode)
            dp = m.arena.device_plan
            out.update(gpus=1, gpu_mem=[cap], arena_bytes=[dp.arena_bytes],
                       weights_bytes=[dp.regions["weights"]], cache_slots=[dp.cache.n_slots],
                       predicted_hit_rate=m.plan.predicted_hit_rate,
                       prefill_chunk=m.plan.prefill.chunk)
        finally:
            m.stream.synchronize()
            m.close()
    return out


def _split(mf, store, portable, caps, knobs, split, prompt, n_decode) -> dict:
    from strata.engine.multi import SplitModel

    with SplitModel(mf, CudaOptions(plan=knobs, progress=False), split,
                    devices=list(range(len(caps))), gpu_mem=caps, store=(store, portable)) as sm:
        return _split_run(sm, caps, prompt, n_decode)


def _split_run(sm, caps, prompt, n_decode, *, use_graph: bool = True) -> dict:
    from strata.engine.multi import SplitEngine

    links = sm.measure_links()
    out = _timed_run(SplitEngine(sm, use_graph=use_graph), prompt, n_decode)
    p = sm.plan
    if p.predicted_hit_rate is not None and p.predicted_hit_rate_stages is not None:
        out["predicted_tier_hit_rate"] = p.predicted_hit_rate - p.predicted_hit_rate_stages
    out.update(gpus=len(caps), gpu_mem=list(caps), cuts=list(p.placement.cuts),
               handoff=p.split.handoff, stage_cache_pinned=p.split.stage_cache,
               search_seconds=p.placement.search_seconds,
               arena_bytes=[m.arena.device_plan.arena_bytes for m in sm.stages],
               weights_bytes=[m.arena.device_plan.regions["weights"] for m in sm.stages],
               cache_slots=[m.arena.device_plan.cache.n_slots for m in sm.stages],
               tier_slots=[s.tier.n_slots if s.tier else 0 for s in p.stages],
               predicted_hit_rate=p.predicted_hit_rate,
               predicted_hit_rate_stage_caches=p.predicted_hit_rate_stages,
               predicted_seconds_per_token=p.placement.seconds_per_token,
               prefill_chunk=p.chunk, links=links)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--gpu-mem", default="8GiB,8GiB")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=65)
    ap.add_argument("--out", required=True)
    ap.add_argument("--skip", default="", help="runs to leave out: 1x16 (one GPU at the sum "
                    "of the budgets), 1x8 (one GPU at the first budget), carve (the weights-only "
                    "carve A/B)")
    ap.add_argument("--handoff", choices=("auto", "host"), default="auto",
                    help="the first split run's hand-off")
    ap.add_argument("--handoff-ab", action="store_true",
                    help="also run the first split with the other hand-off")
    ap.add_argument("--tier-ab", metavar="N,N",
                    help="helper tiers' A/B with each stage cache pinned to N slots")
    ap.add_argument("--ab", default="", metavar="ARMS",
                    help=f"placement A/B arms beside the searched split: {','.join(AB_ARMS)}")
    a = ap.parse_args(argv)
    caps = [parse_size(x) for x in a.gpu_mem.split(",")]
    arms = [x for x in a.ab.split(",") if x]
    if bad := [x for x in arms if x not in AB_ARMS]:
        ap.error(f"--ab {a.ab!r}: unknown arm(s) {', '.join(bad)}; choose from "
                 f"{', '.join(AB_ARMS)}")
    if a.tier_ab and len(a.tier_ab.split(",")) != len(caps):
        ap.error(f"--tier-ab {a.tier_ab!r}: one slot count per GPU ({len(caps)})")
    if len(caps) > len(cuda.gpus):
        ap.error(f"--gpu-mem names {len(caps)} GPUs; {len(cuda.gpus)} visible")
    mf = open_model(a.model)
    knobs = PlanOptions(max_context=a.max_context)
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, mf.shape.n_vocab, a.prompt)]
    names = []
    for i in range(len(caps)):
        n = cuda.gpus[i].name
        names.append(n.decode() if isinstance(n, bytes) else str(n))
    res = {"date": time.strftime("%Y-%m-%d"), "commit": os.environ.get("STRATA_COMMIT", ""),
           "device": names, "command": " ".join(["python -m strata.engine.multi.bench"]
                                                   + (argv or sys.argv[1:])),
           "model": {"file": os.path.basename(a.model), "layers": mf.shape.n_layer,
                     "experts": mf.shape.n_expert, "bytes": mf.shape.file_bytes},
           "max_context": a.max_context, "runs": {}}

    def save():
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)

    from strata.engine.multi.hostmap import PortableHost
    from strata.experts import build_store

    t0 = time.perf_counter()
    store = build_store(mf, with_embd=knobs.embd_on_host)
    with cuda.gpus[0]:
        portable = PortableHost(store.buffer)
    res["store"] = {"bytes": store.n_bytes, "seconds": time.perf_counter() - t0}
    try:  # every model closes itself; the store's registration ends last, before exit
        _runs(mf, store, portable, caps, knobs, prompt, res, a, save)
    finally:
        with cuda.gpus[0]:
            portable.close()
    _table(res)
    return 0


def _runs(mf, store, portable, caps, knobs, prompt, res, a, save) -> None:
    parts = a.gpu_mem.split(",")
    key = f"{len(caps)}x" + (parts[0] if len(set(parts)) == 1 else "+".join(parts))
    res["runs"][key] = split_run = _split(mf, store, portable, caps, knobs,
                                         SplitOptions(handoff=a.handoff), prompt, a.decode)
    save()
    print(f"{key}: {split_run['decode_tok_per_s']:.1f} tok/s decode", flush=True)
    if "1x16" not in a.skip:  # one GPU at the sum of the budgets: the tokens to match
        total = sum(caps)
        res["runs"][f"1x{total >> 30}GiB"] = one = _single(mf, store, portable, total, knobs,
                                                           prompt, a.decode)
        res["tokens_identical_split_vs_1gpu"] = one["tokens"] == split_run["tokens"]
        save()
    if a.ab:
        _placement_ab(mf, store, portable, caps, knobs, split_run, prompt, a.decode,
                      [x for x in a.ab.split(",") if x], save, res)
    if a.tier_ab:
        pinned = tuple(int(x) for x in a.tier_ab.split(","))
        res["tier_ab"] = _tier_ab(mf, store, portable, caps, knobs, pinned, prompt, a.decode)
        save()
    if a.handoff_ab:
        res["handoff_ab"] = _handoff_ab(mf, store, portable, caps, knobs, split_run, prompt,
                                        a.decode)
        save()
    if "1x8" not in a.skip:  # one GPU at the first card's budget
        res["runs"][f"1x{caps[0] >> 30}GiB"] = small = _single(mf, store, portable, caps[0],
                                                               knobs, prompt, a.decode)
        res["tokens_identical_small_vs_split"] = small["tokens"] == split_run["tokens"]
        save()
    if "carve" not in a.skip:
        res["carve_ab"] = _carve_ab(mf, store, portable, caps, knobs, split_run, prompt,
                                    a.decode)
        save()


AB_ARMS = ("even", "no-tiers", "no-carve")


def even_cuts(n_layer: int, n_stages: int) -> tuple[int, ...]:
    """The first layer of stages 1..G-1 when every stage takes the same number of layers (the
    earlier stages one more where they do not divide evenly)."""
    base, extra = divmod(n_layer, n_stages)
    cuts, at = [], 0
    for g in range(n_stages - 1):
        at += base + (g < extra)
        cuts.append(at)
    return tuple(cuts)


def _placement_ab(mf, store, portable, caps, knobs, split_run, prompt, n_decode, arms, save,
                  res) -> None:
    """The searched split against an even split and against its own cuts without helper tiers or
    without the carve. Each arm is planned afresh (caches take what the arm frees or costs), so
    the table shows what each choice is worth at this budget. Saved after each arm."""
    cuts = tuple(split_run["cuts"])
    options = {"even": SplitOptions(cuts=even_cuts(mf.shape.n_layer, len(caps))),
               "no-tiers": SplitOptions(cuts=cuts, helper_tiers=False),
               "no-carve": SplitOptions(cuts=cuts, carve=False)}
    out = res["ab"] = {"searched_cuts": list(cuts), "arms": {}}
    for name in arms:
        try:
            run = _split(mf, store, portable, caps, knobs, options[name], prompt, n_decode)
        except StrataError as e:  # a refused arm (a stage that does not fit) is a result too
            out["arms"][name] = {"refused": str(e)}
        else:
            run["tokens_identical_to_searched"] = run["tokens"] == split_run["tokens"]
            out["arms"][name] = run
        save()
        print(f"ab {name}: {out['arms'][name].get('decode_tok_per_s', 'refused')}", flush=True)


def _carve_ab(mf, store, portable, caps, knobs, split_run, prompt, n_decode) -> dict:
    """The same cuts, stage caches pinned to what the carve-off arm can hold, tiers off."""
    from strata.plan.split import plan_split
    from strata.plan.split.options import SplitOptions as S

    cuts = tuple(split_run["cuts"])
    off_plan = plan_split(mf.shape, _infos(caps), knobs, S(cuts=cuts, carve=False,
                                                           helper_tiers=False))
    pinned = tuple(min(a, s.device_plan.cache.n_slots)
                   for a, s in zip(split_run["cache_slots"], off_plan.stages))
    arms = {}
    for name, carve in (("carve_on", True), ("carve_off", False)):
        sp = S(cuts=cuts, carve=carve, helper_tiers=False, stage_cache=pinned)
        arms[name] = _split(mf, store, portable, caps, knobs, sp, prompt, n_decode)
    on, off = arms["carve_on"], arms["carve_off"]
    return {"cuts": list(cuts), "stage_cache": list(pinned), "arms": arms,
            "tokens_identical": on["tokens"] == off["tokens"],
            "weights_freed_bytes": [b - a for a, b in zip(on["weights_bytes"],
                                                          off["weights_bytes"])],
            "arena_freed_bytes": [b - a for a, b in zip(on["arena_bytes"], off["arena_bytes"])]}


def _handoff_ab(mf, store, portable, caps, knobs, split_run, prompt, n_decode) -> dict:
    """The first split's cuts again with the other hand-off: same tokens, the step's cost."""
    other = "host" if split_run["handoff"] == "auto" else "auto"
    sp = SplitOptions(cuts=tuple(split_run["cuts"]), handoff=other)
    run = _split(mf, store, portable, caps, knobs, sp, prompt, n_decode)
    return {"cuts": split_run["cuts"], "arms": {split_run["handoff"]: _brief(split_run),
                                                other: run},
            "how": {split_run["handoff"]: split_run["links"][0]["how"],
                    other: run["links"][0]["how"]},
            "tokens_identical": run["tokens"] == split_run["tokens"]}


def _tier_ab(mf, store, portable, caps, knobs, pinned, prompt, n_decode) -> dict:
    """Stage caches pinned to `pinned` slots, with helper tiers (the searched cuts) and without
    (the same cuts): tier hits per card, measured against predicted tier hit rate."""
    on = _split(mf, store, portable, caps, knobs, SplitOptions(stage_cache=pinned), prompt,
                n_decode)
    off = _split(mf, store, portable, caps, knobs, SplitOptions(
        cuts=tuple(on["cuts"]), stage_cache=pinned, helper_tiers=False), prompt, n_decode)
    return {"cuts": on["cuts"], "stage_cache": list(pinned), "arms": {"tiers_on": on,
                                                                      "tiers_off": off},
            "tokens_identical": on["tokens"] == off["tokens"],
            "tier_slots": on["tier_slots"], "tier_hits_per_card": on["tier_hits_per_card"],
            "measured_tier_hit_rate": on["measured_tier_hit_rate"],
            "predicted_tier_hit_rate": on.get("predicted_tier_hit_rate"),
            "measured_hit_rate": [on["measured_hit_rate"], off["measured_hit_rate"]],
            "predicted_hit_rate": [on["predicted_hit_rate"], off["predicted_hit_rate"]]}


def _brief(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "tokens"}


def _infos(caps):
    from strata.plan.devices import DeviceInfo
    out = []
    for i, c in enumerate(caps):
        with cuda.gpus[i]:
            free, total = cuda.current_context().get_memory_info()
        f = min(int(free), c)
        out.append(DeviceInfo(i, f"GPU {i}", f, max(f, min(int(total), c))))
    return out


def _table(res: dict) -> None:
    print(f"{'run':<18} {'decode tok/s':>12} {'prefill tok/s':>13} {'hit meas':>9} "
          f"{'hit pred':>9} {'cuts':>12} {'slots':>24} {'tier slots':>20}")
    rows = dict(res["runs"])
    for ab in ("carve_ab", "handoff_ab", "tier_ab", "ab"):
        for name, r in res.get(ab, {}).get("arms", {}).items():
            if "decode_tok_per_s" in r:
                rows[f"{ab.removesuffix('_ab')} {name}"] = r
    for name, r in rows.items():
        print(f"{name:<18} {r['decode_tok_per_s']:>12.1f} {r['prefill_tok_per_s']:>13.1f} "
              f"{r['measured_hit_rate']:>9.3f} {r['predicted_hit_rate'] or 0:>9.3f} "
              f"{','.join(map(str, r.get('cuts', []))) or '-':>12} {r['cache_slots']!s:>24} "
              f"{r.get('tier_slots', '-')!s:>20}")
    for k in ("tokens_identical_split_vs_1gpu", "tokens_identical_small_vs_split"):
        if k in res:
            print(f"{k}: {res[k]}")
    for name, r in res.get("ab", {}).get("arms", {}).items():
        same = r.get("tokens_identical_to_searched")
        print(f"ab {name}: " + (f"refused: {r['refused']}" if "refused" in r else
                                f"tokens identical to the searched split {same}"))
    if "tier_ab" in res:
        t = res["tier_ab"]
        print(f"tiers A/B: tokens identical {t['tokens_identical']}, tier slots "
              f"{t['tier_slots']}, tier hits per card {t['tier_hits_per_card']}, tier hit rate "
              f"{t['measured_tier_hit_rate']:.3f} measured vs "
              f"{t['predicted_tier_hit_rate'] or 0:.3f} predicted")
    if "handoff_ab" in res:
        h = res["handoff_ab"]
        print(f"hand-off A/B: tokens identical {h['tokens_identical']}, {h['how']}")
    if "carve_ab" in res:
        c = res["carve_ab"]
        print(f"carve A/B: tokens identical {c['tokens_identical']}, weights freed "
              f"{[round(x / 2**20) for x in c['weights_freed_bytes']]} MiB per stage")
    for link in res["runs"][next(iter(res["runs"]))].get("links", []):
        for how, t in link["paths"].items():
            print(f"hand-off GPU {link['src']} -> {link['dst']} {how}: token "
                  f"{t['token']['bytes']} B in {t['token']['seconds'] * 1e6:.1f} us, block "
                  f"{t['block']['bytes']} B in {t['block']['seconds'] * 1e6:.1f} us "
                  f"({t['block']['gb_per_s']:.2f} GB/s)")



def run_split_cli(args, req) -> int:
    """`strata bench --backend cuda` over several GPUs (`req`: strata.engine.multi.request):
    one split run, its table line or JSON, and --json-out."""
    from strata.engine.cuda.options import CudaOptions
    from strata.errors import UsageError
    from strata.plan.knobs import options_from_args

    if not args.model or len(args.model) != 1:
        raise UsageError("--backend cuda measures one model: give -m FILE once")
    if args.prompt_tokens < 1 or args.gen < 2:
        raise UsageError("--prompt-tokens must be >= 1 and --gen >= 2")
    miss_path = getattr(args, "miss_path", None)
    for flag, on in ((f"--miss-path {miss_path}", miss_path in ("cpu", "hybrid")),
                     ("--adaptive-cache", getattr(args, "adaptive_cache", False)),
                     ("--profile-decode", args.profile_decode),
                     ("--profile-prefill", getattr(args, "profile_prefill", False)),
                     ("--temperature", bool(getattr(args, "temperature", 0.0)))):
        if on:
            raise UsageError(f"{flag} measures the one-GPU engine; a layer split over GPUs "
                             f"{','.join(map(str, req.devices))} does not take it")
    mf = open_model(args.model[0])
    options = CudaOptions(plan=options_from_args(args), graph=not args.no_graph,
                          profile_path=args.profile, progress=not args.json)
    rng = np.random.default_rng(args.seed)
    prompt = [int(t) for t in rng.integers(0, mf.shape.n_vocab, args.prompt_tokens)]
    from strata.engine.multi import SplitModel

    with SplitModel(mf, options, req.split, devices=list(req.devices),
                    gpu_mem=list(req.gpu_mem)) as sm:
        res = _split_run(sm, list(req.gpu_mem), prompt, args.gen, use_graph=not args.no_graph)
    res.update(date=time.strftime("%Y-%m-%d"), backend="cuda-split", devices=list(req.devices),
               model=args.model[0], command="strata " + " ".join(sys.argv[1:]))
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"{len(req.devices)} GPUs, cuts {res['cuts']}: decode "
              f"{res['decode_tok_per_s']:.1f} tok/s, prefill {res['prefill_tok_per_s']:.1f} "
              f"tok/s, hit {res['measured_hit_rate']:.3f} measured vs "
              f"{res['predicted_hit_rate'] or 0:.3f} predicted, tier hits per card "
              f"{res.get('tier_hits_per_card', [])}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.json_out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    from strata.shutdown import run_then_finish

    run_then_finish(main)
