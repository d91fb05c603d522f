"""The CUDA engine's device suite without a device: the OOM matrix's bookkeeping (a refusal's
knobs and allocations, an accepted cell's prompt and decode, a failure after load) over stand-in
loaders, the matrix and miss-sweep tables, and `strata generate`'s VRAM knobs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from strata.bench import engine_cuda_suite as suite_mod


class _Counter:
    sizes: list[int] = []


def _refusal_message(tmp_models) -> str:
    """A real planner refusal (its message lists the knobs, one per indented line)."""
    from helpers.engine_models import model_path
    from strata.gguf import open_model
    from strata.plan import plan
    from strata.plan.devices import parse_gpu_mem
    from strata.plan.options import PlanOptions

    shape = open_model(model_path(tmp_models, "Q8_0")).shape
    refused = plan(shape, parse_gpu_mem("600MiB"), PlanOptions(max_context=1024))
    assert not refused.accepted
    return refused.refusal.message()


def _fakes(monkeypatch, message: str, runs: list):
    from strata.engine.cuda import engine as engine_mod
    from strata.engine.cuda import model as model_mod
    from strata.engine.cuda.options import CudaEngineError

    class Model:
        def __init__(self, mf, opts, host_store=None):
            if opts.gpu_mem < 2 << 30:
                raise CudaEngineError(message)
            _Counter.sizes.append(123)  # the arena
            self.closed = False
            self.shape = SimpleNamespace(n_vocab=50)
            self.ctx = opts.plan.max_context
            chunk = 512 if opts.plan.prefill.auto else opts.plan.prefill.tokens
            self.plan = SimpleNamespace(prefill=SimpleNamespace(
                chunk=chunk, mode="borrowed", lend_slots=3, ring_slots=2), predicted_hit_rate=0.5)
            self.arena = SimpleNamespace(device_plan=SimpleNamespace(
                cache=SimpleNamespace(n_slots=7), arena_bytes=123))
            runs.append(self)

        def close(self):
            self.closed = True

    class Engine:
        def __init__(self, m):
            self.m = m

        def prefill(self, prompt):
            self.m.prompt = len(prompt)
            if self.m.ctx == 4096 and self.m.plan.prefill.chunk == 256:
                raise RuntimeError("boom")

        def decode_tokens(self, n):
            self.m.decoded = n
            return [0] * n

        def hits(self):
            return SimpleNamespace(hit_rate=0.25)

    monkeypatch.setattr(model_mod, "CudaModel", Model)
    monkeypatch.setattr(engine_mod, "CudaEngine", Engine)


def test_oom_matrix_records_refusals_runs_and_failures(tmp_models, tmp_path, monkeypatch,
                                                       capsys):
    message = _refusal_message(tmp_models)
    runs: list = []
    _fakes(monkeypatch, message, runs)
    s = suite_mod.Suite.__new__(suite_mod.Suite)
    s.args = SimpleNamespace(oom_seconds=60.0, out=str(tmp_path), model="m.gguf", file_note="")
    s.mf, s.store, s.counter, s.commit = None, None, _Counter, "abc"
    s.bw, s.store_seconds = {}, 0.0
    s.oom(budgets_gib=(1, 4), contexts=(1024, 4096), chunks=("auto", "256"), prompt_max=300,
          steps=5)
    import json

    cells = json.loads((tmp_path / "oom.json").read_text())["cells"]
    assert len(cells) == 8
    refused = [c for c in cells if c["budget_gib"] == 1]
    assert all(c["result"] == "refused" and c["allocations"] == 0 for c in refused)
    assert any(k.startswith("--kv int8") for k in refused[0]["knobs"])
    ok = [c for c in cells if c["result"] == "ok"]
    assert len(ok) == 3 and all(c["allocations"] == 1 for c in ok)
    assert {c["prompt_tokens"] for c in ok} == {256, 300}  # min(chunk, prompt_max, ctx - 40)
    failed = [c for c in cells if c["result"].startswith("FAILED after load")]
    assert len(failed) == 1 and "boom" in failed[0]["result"]
    assert all(m.closed for m in runs) and all(m.decoded == 6 for m in runs if m.ctx == 1024)
    table = capsys.readouterr().out
    assert "refused(" in table and "ok b512" in table and "FAIL" in table


def test_miss_table_names_the_faster_path():
    rows = [{"cache_fraction": f, "miss_path": mp, "tokens_per_s": t, "hit_rate_measured": h}
            for f, mp, t, h in ((0.0, "mapped", 21.7, 0.0), (0.0, "cpu", 7.4, 0.0),
                                (0.0, "hybrid", 9.0, 0.0), (0.3, "mapped", 5.0, 0.66),
                                (0.3, "cpu", 6.8, 0.66), (0.3, "hybrid", 8.1, 0.66))]
    lines = suite_mod.miss_table(rows).splitlines()
    assert lines[0].split()[2:5] == ["mapped", "cpu", "hybrid"]
    assert lines[1].split()[-1] == "mapped" and lines[2].split()[-1] == "hybrid"
    assert "66.0%" in lines[2] and "8.1" in lines[2]


def test_generate_takes_the_vram_knobs_and_notes_them_on_the_cpu(tmp_models, capsys):
    from helpers.engine_models import model_path
    from strata.cli.main import main

    path = str(model_path(tmp_models, "Q8_0"))
    rc = main(["generate", "-m", path, "--prompt-tokens", "1,2,3", "-n", "2",
               "--temperature", "0", "--backend", "cpu", "--gpu-mem", "8GiB",
               "--expert-cache", "4", "--max-context", "64", "--adaptive-cache",
               "--prompt-steps", "8", "--json"])
    assert rc == 0
    err = capsys.readouterr().err
    assert ("note: --gpu-mem, --adaptive-cache, --prompt-steps, --expert-cache: apply to the "
            "CUDA engine; the cpu backend ignores them") in err


def test_generate_refuses_bad_knobs(tmp_models, capsys):
    from helpers.engine_models import model_path
    from strata.cli.main import main

    path = str(model_path(tmp_models, "Q8_0"))
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        main(["generate", "-m", path, "--prompt-tokens", "1", "--miss-path", "disk"])
    assert "invalid choice: 'disk'" in capsys.readouterr().err
    assert main(["generate", "-m", path, "--prompt-tokens", "1", "--backend", "cpu",
                 "--prefill", "300"]) != 0
    assert "--prefill: chunk 300 is not a multiple of 256 (try 256 or 512)" in capsys.readouterr().err


def test_decode_profile_times_each_launcher_alone_and_restores_them(monkeypatch):
    import strata.engine.cuda.decode as decode_mod
    from strata.engine.cuda.profile import profile_step, profile_table

    launched: list[str] = []
    for name in ("matvec", "rms_norm", "moe_decode", "argmax"):  # stand-ins: a list entry each
        monkeypatch.setattr(decode_mod, name, lambda *a, name=name: launched.append(name))
    before = {n: getattr(decode_mod, n)
              for n in ("matvec", "rms_norm", "moe_decode", "argmax", "route")}

    class Step:
        m = SimpleNamespace(stream="s")

        def record(self, stream, mode):
            assert mode in ("logits", "greedy")
            for _ in range(3):
                decode_mod.matvec("w")
            decode_mod.rms_norm("x")
            decode_mod.moe_decode("y")
            if mode == "greedy":
                decode_mod.argmax("l")

    def capture(record, stream):
        launched.clear()
        record(stream)
        return SimpleNamespace(n_nodes=len(launched))

    prof = profile_step(Step(), reps=3, capture=capture,
                        timer=lambda g, st, reps: 0.5 * g.n_nodes)
    assert prof["step"] == {"ms": 2.5, "nodes": 5}
    assert prof["matvec"] == {"ms": 1.5, "nodes": 3}
    assert prof["rms_norm"]["nodes"] == 1 and prof["moe_decode"]["nodes"] == 1
    assert "route" not in prof  # never called by this step
    assert {n: getattr(decode_mod, n) for n in before} == before
    text = profile_table(prof)
    assert "matvec" in text.splitlines()[1] and "60.0%" in text
    assert "argmax" not in prof  # mode "logits" picks no token
    greedy = profile_step(Step(), reps=3, capture=capture, mode="greedy",
                          timer=lambda g, st, reps: 0.5 * g.n_nodes)
    assert greedy["step"]["nodes"] == 6 and greedy["argmax"] == {"ms": 0.5, "nodes": 1}
    assert {n: getattr(decode_mod, n) for n in before} == before


def test_batch_profile_keys_matvecs_by_role_and_leaves_frozen_launchers_out(monkeypatch):
    import numpy as np

    import strata.engine.cuda.batch_step as bs
    from strata.engine.cuda.profile import profile_step

    launched: list[str] = []
    for name in ("matvec_batch", "advance_seq_len", "rms_norm"):
        monkeypatch.setattr(bs, name, lambda *a, name=name: launched.append(name))
    shape = SimpleNamespace(n_head=4, head_dim=8, n_head_kv=2, n_embd=16, n_expert=8,
                            n_vocab=50)

    class Step:
        m = SimpleNamespace(stream="s", shape=shape)

    def record(stream):  # a step of 3 rows: q (32 out), head (50 out), then the positions move
        bs.rms_norm("x")
        bs.matvec_batch("w", 0, "x", np.zeros((3, 32)))
        bs.matvec_batch("w", 0, "x", np.zeros((3, 50)))
        bs.advance_seq_len("p")

    def capture(rec, stream):
        launched.clear()
        rec(stream)
        return SimpleNamespace(n_nodes=len(launched))

    prof = profile_step(Step(), capture=capture, timer=lambda g, st, reps: float(g.n_nodes),
                        module=bs, launchers=("matvec_batch", "advance_seq_len", "rms_norm"),
                        record=record, frozen=("advance_seq_len",))
    assert prof["step"]["nodes"] == 3  # the frozen launcher never reaches a graph
    assert prof["matvec_batch q"]["nodes"] == 1 and prof["matvec_batch head"]["nodes"] == 1
    assert "advance_seq_len" not in prof and prof["rms_norm"]["nodes"] == 1


@pytest.mark.parametrize("rows,why", [("9", "each row count must be 1..8"),
                                      ("one", "expected row counts like 1,8")])
def test_serve_batch_bench_refuses_bad_profile_rows(rows, why, capsys):
    from strata.bench.serve_batch import main

    with pytest.raises(SystemExit):  # refused before any model is opened
        main(["-m", "no-such.gguf", "--clients", "1,8", "--profile-rows", rows])
    assert why in capsys.readouterr().err


def test_decode_timer_splits_each_step_and_gives_the_engine_back():
    from strata.bench.serve_batch import DecodeTimer, host_table

    events: list[str] = []

    class Stream:
        def synchronize(self):
            events.append("sync")

    class Step:
        def run(self, n, pick=False):
            events.append(f"run {n}" + " pick" * pick)

    class Engine:  # decode: checks, the step enqueued, copies enqueued, sync, the host copy
        def __init__(self):
            self.step, self.m = Step(), SimpleNamespace(stream=Stream())

        def prefill(self, slot, tokens):
            self.m.stream.synchronize()

        def decode(self, slots, tokens):
            if len(slots) != len(tokens):
                raise ValueError("refused")
            self.step.run(len(slots))
            self.m.stream.synchronize()
            return [0] * len(slots)

        def decode_picked(self, slots, tokens, params):  # the same parts, tokens picked
            self.step.run(len(slots), True)
            self.m.stream.synchronize()
            return [7] * len(slots)

    ticks = iter(range(1000))
    eng = Engine()
    timer = DecodeTimer(eng, clock=lambda: next(ticks) / 1e3)  # each reading 1 ms later
    with timer.installed():
        eng.prefill(0, [1])  # a prefill's synchronize is not timed
        assert eng.decode([0, 1], [5, 6]) == [0, 0]
        with pytest.raises(ValueError, match="refused"):
            eng.decode([0, 1], [5])  # no step ran: not recorded
        eng.prefill(2, [1])
        eng.decode([0, 1, 2], [5, 6, 7])
        assert eng.decode_picked([0, 1, 2], [5, 6, 7], [None] * 3) == [7, 7, 7]
    assert events == ["sync", "run 2", "sync", "sync", "run 3", "sync", "run 3 pick", "sync"]
    assert not {"decode", "decode_picked", "prefill"} & set(vars(eng))
    assert "run" not in vars(eng.step)
    assert "synchronize" not in vars(eng.m.stream)
    three = timer.summary(3)  # readings: start, run returned, sync in, sync out, end
    assert three["n_steps"] == 2 and three["decode_ms"] == pytest.approx(4.0)
    for part in DecodeTimer.PARTS:
        assert three[part] == pytest.approx(1.0)
    assert three["step_period_ms"] == pytest.approx(5.0)  # the next start: the reading after end
    assert three["between_decodes_ms"] == pytest.approx(1.0)
    two = timer.summary(2)
    assert two["n_steps"] == 1 and two["step_period_ms"] is None
    assert timer.summary(8) is None
    table = host_table([{"clients": 2, "decode_host": two}, {"clients": 8, "decode_host": None}])
    lines = table.splitlines()
    assert "to replay" in lines[0] and lines[1].split()[:3] == ["2", "4.000", "1.000"]
    assert lines[2].split() == ["8"] + ["-"] * 6


@pytest.mark.parametrize("all_resident", [True, False])
def test_p1_records_the_compute_only_rate_of_the_same_prompt(tmp_path, all_resident):
    """P1 runs capped, then uncapped: the uncapped rate is P1's compute-only bound only where
    nothing streamed (every expert resident); otherwise the part says why it has none."""
    import json

    calls = []

    def bench(*, prompt, gen, options):
        calls.append((prompt, options.gpu_mem, options.plan.max_context))
        capped = options.gpu_mem is not None
        return {"prefill": {"tokens_per_s": 9000.0 if capped else 10000.0,
                            "pcie_streaming_bound_tokens_per_s": 30000.0,
                            "bytes_streamed": 0 if all_resident and not capped else 5},
                "load": {}}

    s = suite_mod.Suite.__new__(suite_mod.Suite)
    s.args = SimpleNamespace(out=str(tmp_path), model="q8.gguf", file_note="", temperature=0.0)
    s.commit, s.bw, s.store_seconds = "abc", {}, 0.0
    s.bench = bench
    s.write = lambda part, body: (tmp_path / f"{part}.json").write_text(json.dumps(body))
    s.p1()
    body = json.loads((tmp_path / "p1.json").read_text())
    assert calls == [(16384, 8 * 2**30, 16896), (16384, None, 16896)]
    c = body["compute_only"]
    if all_resident:
        assert c["tokens_per_s"] == 10000.0 and c["fraction"] == pytest.approx(0.9)
    else:
        assert c["tokens_per_s"] is None and "not every expert fits" in c["why"]
