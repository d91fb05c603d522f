"""The CLI's flag rules: a flag nothing on the command line reads is refused (bench's synthetic
model flags with -m) or, where another backend reads it, named in a note; one least
--max-context for every command (a VRAM plan's larger one where a plan sizes the context);
profile refuses a prompt past the context as generate does; and one exit status for a bad flag
everywhere (2, argparse's), 1 for a run that fails, 3 for a refused plan."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.engine_models import PROMPT, model_path
from strata.cli.main import main

IDS = ",".join(map(str, PROMPT))
BENCH_QUICK = ["--n-prompt", "3", "--n-decode", "2", "--n-pool", "2", "--membw-mib", "16"]


@pytest.fixture(scope="module")
def model(tmp_models):
    return str(model_path(tmp_models, "Q8_0"))


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note: ")]


# -- bench: flags that no backend reads with -m ------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("argv, named", [
    (["--mix", "Q8_0"], "--mix: shapes"),
    (["--preset", "tiny", "--layers", "2"], "--preset, --layers: shape"),
    (["--layers", "4"], "--layers: shapes"),  # the default, spelled: still read by nothing
])
def test_bench_refuses_synthetic_model_flags_with_m(capsys, model, monkeypatch, backend, argv,
                                                    named):
    """With -m the synthetic files are never written, so --preset, --mix and --layers can have
    no effect on either backend: refused (status 2) before anything is measured (they were
    silently ignored)."""
    from strata.bench import engine_cuda
    from strata.cli import bench as cli_bench

    monkeypatch.setattr(cli_bench, "bench_file", lambda *a, **k: pytest.fail("measured"))
    monkeypatch.setattr(engine_cuda, "run_cuda", lambda args: pytest.fail("measured"))
    code, out, err = _run(capsys, "bench", "--backend", backend, "-m", model, *argv,
                          *BENCH_QUICK)
    assert code == 2 and out == "", err
    assert err.startswith(f"error: {named} the synthetic files measured without -m; with -m "
                          f"FILE nothing reads "), err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_cpu_bench_names_max_context_it_ignores(capsys, model):
    """The CPU bench sizes its context from --n-prompt and --n-decode: --max-context, a VRAM
    knob that `generate`'s CPU engine reads, is one the CPU bench does not (it went unsaid)."""
    code, _, err = _run(capsys, "bench", "--backend", "cpu", "-m", model, "--max-context", "512",
                        *BENCH_QUICK)
    assert code == 0, err
    assert _notes(err) == ["note: --max-context: applies to --backend cuda; the CPU bench "
                           "ignores it"], err
    # a bad VRAM knob is refused there as the CUDA bench would refuse it
    code, _, err = _run(capsys, "bench", "--backend", "cpu", "-m", model, "--prefill", "100",
                        *BENCH_QUICK)
    assert code == 2 and "--prefill: chunk 100 is not a multiple of 256" in err, err


def test_the_cuda_bench_names_the_cpu_bench_flags_it_ignores(capsys, model, monkeypatch):
    from strata.bench import engine_cuda
    from strata.engine.multi import request

    ran = []
    monkeypatch.setattr(request, "visible_gpus", lambda: 1)
    monkeypatch.setattr(engine_cuda, "run_cuda", lambda args: ran.append(args) or 0)
    code, _, err = _run(capsys, "bench", "--backend", "cuda", "-m", model, "--n-decode", "3",
                        "--membw-mib", "8")
    assert code == 0 and len(ran) == 1, err
    assert _notes(err) == ["note: --n-decode, --membw-mib: apply to --backend cpu; the CUDA "
                           "bench ignores them"], err
    code, _, err = _run(capsys, "bench", "--backend", "cuda", "-m", model, "--gen", "8")
    assert code == 0 and _notes(err) == [], err


# -- one least --max-context ------------------------------------------------------------------

@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("a\nhello world\nhi\nthe quick brown fox\n", encoding="utf-8")
    return str(path)


LEAST = "--max-context must be at least 2 (a prompt token and the token it generates), got {}"


@pytest.mark.parametrize("command", ["generate", "profile", "serve"])
@pytest.mark.parametrize("bad", ["1", "0", "-5"])
def test_every_command_takes_the_same_least_max_context(capsys, model, prompts, tmp_path,
                                                        command, bad):
    """generate and profile took 1, serve 2 (in other words), plan 256: one least, one message,
    status 2. (serve's accepted case would start a server: its check runs before that.)"""
    argv = {"generate": ["generate", "-m", model, "--backend", "cpu", "--prompt-tokens", "1"],
            "profile": ["profile", "-m", model, "--prompts", prompts, "-o",
                        str(tmp_path / "p.npy")],
            "serve": ["serve", "-m", model, "--backend", "cpu", "--port", "0"]}[command]
    code, out, err = _run(capsys, *argv, "--max-context", bad)
    assert (code, out, err) == (2, "", f"error: {LEAST.format(bad)}\n")


def test_the_least_max_context_runs(capsys, model, prompts, tmp_path):
    code, out, err = _run(capsys, "generate", "-m", model, "--backend", "cpu", "--prompt-tokens",
                          "1", "-n", "3", "--temperature", "0", "--max-context", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["stats"]["max_context"] == 2 and "context of 2 tokens is full" in err


def test_a_vram_plan_takes_one_prompt_chunk_at_least(capsys, model):
    """Where a VRAM plan sizes the context (plan, every --backend cuda) it holds a 256-token
    prompt chunk: the larger least, said with its reason, in the same words."""
    code, out, err = _run(capsys, "plan", "-m", model, "--gpu-mem", "8GiB", "--max-context", "255")
    assert (code, out) == (2, "")
    assert err == ("error: --max-context must be at least 256 where a VRAM plan sizes it (the "
                   "CUDA engine runs prompts in 256-token chunks), got 255\n")
    code, out, _ = _run(capsys, "plan", "-m", model, "--gpu-mem", "8GiB", "--max-context", "256",
                        "--json")
    assert code == 0 and json.loads(out)["kv"]["max_context"] == 256


# -- profile: a prompt past the context --------------------------------------------------------

def test_profile_refuses_prompts_longer_than_the_context(capsys, model, prompts, tmp_path,
                                                          monkeypatch):
    """As generate refuses a prompt past the context, before any prompt runs (they were cut to
    fit without a word, and counted for part of their length)."""
    from strata.experts import profile as experts_profile

    monkeypatch.setattr(experts_profile, "record", lambda *a, **k: pytest.fail("ran"))
    out_path = tmp_path / "p.npy"
    code, out, err = _run(capsys, "profile", "-m", model, "--prompts", prompts, "-o",
                          str(out_path), "--max-context", "4", "-n", "10")
    assert (code, out) == (1, ""), err
    assert err == (f"error: --prompts {prompts}: 2 of 4 prompts have more tokens than the "
                   f"context holds (4); the longest, line 4, has 14 (raise --max-context; the "
                   f"model was trained for 512)\n")
    assert not out_path.exists()
    one = tmp_path / "one.txt"
    one.write_text("a\n\nhello world\n", encoding="utf-8")
    code, _, err = _run(capsys, "profile", "-m", model, "--prompts", str(one), "-o",
                        str(out_path), "--max-context", "4")
    assert code == 1 and err == (f"error: --prompts {one}: 1 of 2 prompts has more tokens than "
                                 f"the context holds (4); line 3 has 7 (raise --max-context; "
                                 f"the model was trained for 512)\n"), err


def test_profile_says_where_the_context_stopped_the_generated_tokens(capsys, model, tmp_path):
    """-n tokens past the end of the context stop there, as generate's do, with a note naming
    how many prompts they stopped for."""
    prompts = tmp_path / "short.txt"
    prompts.write_text("a\nhi\n", encoding="utf-8")  # 1 and 2 tokens
    out_path = tmp_path / "p.npy"
    code, out, err = _run(capsys, "profile", "-m", model, "--prompts", str(prompts), "-o",
                          str(out_path), "--max-context", "3", "-n", "5")
    assert code == 0, err
    assert "recorded 2 prompts, 6 tokens," in out  # each prompt whole, then up to 3 positions
    assert _notes(err) == ["note: 2 of 2 prompts reached the end of the context (3 tokens) "
                           "before their -n 5 tokens: fewer were generated and counted (raise "
                           "--max-context)"], err
    assert np.load(out_path).sum() > 0
    code, _, err = _run(capsys, "profile", "-m", model, "--prompts", str(prompts), "-o",
                        str(out_path), "--max-context", "8", "-n", "5")
    assert code == 0 and _notes(err) == [], err


# -- exit status: 2 for a bad flag everywhere, 1 for a run that fails ---------------------------

@pytest.mark.parametrize("argv, status", [
    (["plan", "-m", "{model}", "--gpu-mem", "8GiB", "--kv", "f8"], 2),  # argparse's
    (["plan", "-m", "{model}", "--gpu-mem", "16Q"], 2),  # was 1
    (["plan", "-m", "{tmp}/none.gguf", "--gpu-mem", "8GiB"], 1),
    (["plan", "-m", "{model}", "--gpu-mem", "64MiB"], 3),  # refused: was 2, a bad flag's
    (["generate", "-m", "{model}", "--prompt-tokens", IDS, "-n", "0"], 2),
    (["generate", "-m", "{tmp}/none.gguf", "--prompt", "x"], 1),
    (["bench", "--backend", "cpu", "-m", "{model}", "--n-pool", "0"], 2),
    (["profile", "-m", "{model}", "--prompts", "{tmp}/none.txt"], 1),
    (["profile", "-m", "{model}", "--prompts", "{tmp}/none.txt", "-n", "-1"], 2),
    (["synth", "tiny", "-o", "{tmp}/x.gguf", "--skew", "0"], 2),
    (["serve", "-m", "{model}", "--port", "70000"], 2),
    (["serve", "-m", "{model}", "--config", "{tmp}/none.json"], 1),
    (["serve", "-m", "{model}", "--config", "{tmp}/batch0.json"], 2),  # a knob in the file
])
def test_a_bad_flag_exits_2_and_a_failed_run_1(capsys, model, tmp_path, argv, status):
    (tmp_path / "batch0.json").write_text('{"batch": 0}')
    argv = [a.format(model=model, tmp=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own error
        code = e.code
    err = capsys.readouterr().err
    assert code == status, err
    assert "Traceback" not in err
    if status != 3:  # a refused plan prints the refusal on stdout
        assert "error: " in err, err
