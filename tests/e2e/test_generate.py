"""`strata generate` end to end on the CPU backend: JSON output, streaming, logits, chat, stopping,
the built-in default model, and every bad input as a clear one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import ggufmake
from helpers import reference as ref
from helpers.engine_models import PROMPT, model_path
from strata.cli.main import main
from strata.gguf import open_model
from strata.tokenizer import ChatTemplate, Tokenizer

IDS = ",".join(map(str, PROMPT))
GREEDY = ["--temperature", "0"]


@pytest.fixture(scope="module")
def model(tmp_models):
    return str(model_path(tmp_models, "Q8_0"))


def _run(capsys, *argv):
    code = main(["generate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *argv):
    code, out, err = _run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_json_greedy_tokens_are_the_reference_and_text_their_decoding(capsys, model):
    res = _json(capsys, "-m", model, "--prompt-tokens", IDS, "-n", "6", *GREEDY)
    want, _ = ref.greedy(ref.RefModel.load(model), PROMPT, 6)
    assert res["tokens"] == want
    tok = Tokenizer.from_metadata(open_model(model).metadata)
    assert res["text"] == tok.decode(want)
    st = res["stats"]
    assert (st["prompt_tokens"], st["generated_tokens"], st["backend"]) == (7, 6, "cpu")
    assert st["prefill_tokens_per_s"] > 0 and st["decode_tokens_per_s"] > 0
    assert st["stop_reason"] == "length"


def test_compile_time_is_said_apart_from_the_rates(capsys, model, monkeypatch):
    """A run that compiled kernels (a first run of a version) says how long that took beside
    the rates, which include it; a run that compiled nothing says nothing of it, and --json
    always carries compile_s."""
    from contextlib import contextmanager

    from strata.telemetry import compile_clock as cc

    _run(capsys, "-m", model, "--prompt", "Hi", "-n", "2")  # whatever compiles, compiled here
    code, _, err = _run(capsys, "-m", model, "--prompt", "Hi", "-n", "2")
    assert code == 0 and "compiling" not in err
    assert _json(capsys, "-m", model, "--prompt", "Hi", "-n", "2")["stats"]["compile_s"] == 0.0

    @contextmanager
    def slow_first_run():
        clock = cc.CompileClock()
        yield clock
        clock.seconds, clock.count = 12.34, 7
    monkeypatch.setattr(cc, "compile_clock", slow_first_run)
    code, _, err = _run(capsys, "-m", model, "--prompt", "Hi", "-n", "2")
    assert code == 0 and "include 12.3 s of compiling kernels" in err
    assert _json(capsys, "-m", model, "--prompt", "Hi", "-n", "2")["stats"]["compile_s"] == 12.34


def test_text_streams_to_stdout_and_stats_go_to_stderr(capsys, model):
    res = _json(capsys, "-m", model, "--prompt", "The cat sat", "-n", "5", *GREEDY)
    code, out, err = _run(capsys, "-m", model, "--prompt", "The cat sat", "-n", "5", *GREEDY)
    assert code == 0
    assert out == res["text"] + "\n"
    assert "[cpu] prompt" in err and "generated 5" in err


def test_logits_out_holds_the_row_that_chose_each_token(capsys, model, tmp_path):
    path = tmp_path / "logits.npy"
    res = _json(capsys, "-m", model, "--prompt-tokens", IDS, "-n", "4", *GREEDY,
                "--logits-out", str(path))
    logits = np.load(path)
    assert logits.dtype == np.float32 and logits.shape == (4, 640)
    assert np.argmax(logits, axis=1).tolist() == res["tokens"]
    want = ref.forward(ref.RefModel.load(model), PROMPT)[-1]
    assert np.linalg.norm(logits[0] - want) / np.linalg.norm(want) < 1e-3


def test_chat_wraps_the_message_in_the_template(capsys, model):
    res = _json(capsys, "-m", model, "--chat", "Hello there", "-n", "2", *GREEDY)
    meta = open_model(model).metadata
    tok = Tokenizer.from_metadata(meta)
    message = [{"role": "user", "content": "Hello there"}]
    text = ChatTemplate.from_metadata(meta, tok).render(message)
    assert "Hello there" in text and text != "Hello there"
    assert res["stats"]["prompt_tokens"] == len(tok.encode(text))


def test_a_seed_repeats_a_sampled_generation(capsys, model):
    argv = ("-m", model, "--prompt-tokens", IDS, "-n", "8", "--temperature", "1.5",
            "--top-k", "0", "--top-p", "1", "--min-p", "0", "--seed", "11")
    assert _json(capsys, *argv)["tokens"] == _json(capsys, *argv)["tokens"]


def test_generation_stops_at_the_context_limit_with_a_message(capsys, model):
    code, out, err = _run(capsys, "-m", model, "--prompt-tokens", IDS, "-n", "10",
                          "--max-context", "9", *GREEDY, "--json")
    assert code == 0
    res = json.loads(out)
    assert res["stats"]["stop_reason"] == "context" and len(res["tokens"]) == 3
    assert "context of 9 tokens is full" in err


@pytest.mark.parametrize("argv, message, status", [
    # a bad flag: status 2, as argparse's own; each names the flag
    (["--prompt-tokens", "1,640"],
     "--prompt-tokens: token id 640 is outside the vocabulary (0..639)", 2),
    (["--prompt-tokens", "1,x"], "--prompt-tokens must be comma-separated integers", 2),
    (["--prompt", ""], "--prompt is empty: give some text", 2),
    (["--chat", ""], "--chat is empty: give some text", 2),
    (["--prompt-tokens", IDS, "-n", "0"], "-n must be at least 1", 2),
    (["--prompt-tokens", IDS, "--top-p", "0"], "--top-p must be in (0, 1], got 0.0", 2),
    (["--prompt-tokens", IDS, "--repeat-last-n", "-1"], "--repeat-last-n must be >= 0", 2),
    (["--prompt", "Hi", "--system", "Be brief."], "--system goes with --chat or --interactive",
     2),
    (["-i", "--json"], "--json: not with --interactive", 2),
    (["-i", "--json-object", "--logits-out", "x.npy"],
     "--logits-out, --json-object: not with --interactive", 2),
    # the engine refusing a prompt past the context: a failed run, 1
    (["--prompt-tokens", IDS, "--max-context", "4"],
     "the prompt has 7 tokens but the context holds 4", 1),
])
def test_bad_input_is_a_clear_error(capsys, model, argv, message, status):
    code, out, err = _run(capsys, "-m", model, *argv)
    assert code == status and out == ""
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err


def test_interactive_chat_turns_reuse_the_conversation(capsys, model, monkeypatch):
    """Lines on stdin are turns: each reply streams to stdout with its figures on stderr, the
    second turn computing only what it adds (its first turn's KV kept), /clear starting over,
    a line ending in a backslash going on, /exit ending; the same turns at temperature 0 give
    the replies of a one-shot --chat of the same conversation."""
    import io

    lines = "Hello there\nTell me\\\nmore\n/clear\nHello there\n/exit\nnot read\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    code, out, err = _run(capsys, "-m", model, "-i", "-n", "5", *GREEDY, "--system", "Be brief.")
    assert code == 0, err
    figures = [ln for ln in err.splitlines() if ln.startswith("[cpu] prompt")]
    assert len(figures) == 3, err
    kept = [int(f.split("(")[1].split(" kept")[0]) for f in figures]
    assert kept[0] == 0 and kept[1] > 0 and kept[2] == 0
    assert "the conversation starts over" in err
    replies = out.splitlines()
    first = _json(capsys, "-m", model, "--chat", "Hello there", "--system", "Be brief.", "-n",
                  "5", *GREEDY)
    assert len(replies) == 3 and replies[0] == replies[2] == first["text"]
    # end of input ends the chat too
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello there\n"))
    code, out, err = _run(capsys, "-m", model, "-i", "-n", "3", *GREEDY)
    assert code == 0 and len(out.splitlines()) == 1 and "(0 kept)" in err


def test_cuda_without_a_gpu_is_a_clear_error(capsys, model, monkeypatch):
    import sys
    import types

    from strata.engine import backends

    gpu = types.ModuleType("no_gpu_here")
    gpu.unavailable_reason = lambda: "no CUDA GPU is visible to numba"
    monkeypatch.setitem(sys.modules, "no_gpu_here", gpu)
    monkeypatch.setattr(backends, "BACKENDS", (
        backends.Backend("cuda", "no_gpu_here", "the CUDA engine (GPU)"), *backends.BACKENDS[1:]))
    code, out, err = _run(capsys, "-m", model, "--prompt-tokens", IDS, "--backend", "cuda")
    assert code == 1 and out == ""
    assert err == ("error: --backend cuda: no CUDA GPU is visible to numba; "
                   "available here: cpu\n")


def test_a_file_of_another_architecture_is_refused(capsys, tmp_path):
    path = ggufmake.write(tmp_path / "llama.gguf", arch="llama")
    code, _, err = _run(capsys, "-m", path, "--prompt-tokens", "1,2")
    assert code == 1 and "architecture 'llama' is not supported" in err


def test_the_default_model_runs_on_a_fresh_machine(tmp_path):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "strata.cli.main", "generate", "--prompt", "Hello", "-n", "4",
           "--seed", "1"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert list((tmp_path / "cache" / "strata").glob("tiny-*.gguf"))
    assert "[cpu] prompt" in p.stderr and "generated 4" in p.stderr


def test_json_schema_holds_the_output_to_it(capsys, model, tmp_path):
    """--json-schema (a file, and inline) on the real model and tokenizer: greedy output is one
    object the schema allows (jsonschema_rs, independent of the constraint), ended by the end
    token; a keyword it cannot hold, or a path that is not there, is refused before loading."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                               "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    for given in (str(path), json.dumps(schema)):
        res = _json(capsys, "-m", model, "--prompt", "Answer:", "-n", "400", *GREEDY,
                    "--json-schema", given)
        assert res["stats"]["stop_reason"] == "stop", res["text"]
        assert jsonschema_rs.is_valid(schema, json.loads(res["text"]))
    res = _json(capsys, "-m", model, "--prompt", "Answer:", "-n", "3", *GREEDY, "--json-object")
    assert res["text"].startswith("{")
    for bad, says in ((json.dumps({"type": "object", "properties": {"d": {"format": "x"}}}),
                       "format not supported"), (str(tmp_path / "nope.json"), "neither inline"),
                      ("{not json", "not JSON")):
        code, _, err = _run(capsys, "-m", model, "--prompt", "x", "--json-schema", bad)
        assert code != 0 and says in err
