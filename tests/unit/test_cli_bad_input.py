"""The subcommands' bad input is one `error: ...` line, said before any work (an output path
that cannot be written included), and never a traceback: status 2 for a bad flag (as argparse's
own), 1 for a run that cannot go on (a file, the machine); generate, profile, bench, synth,
the entry point's handling of a standard output that fails, and `strata` alone."""

from __future__ import annotations

import errno
import io
import json
import os
import sys

import numpy as np
import pytest

from helpers.engine_models import PROMPT, model_path
from strata.cli import main as cli_main
from strata.cli.main import main
from strata.errors import StrataError

IDS = ",".join(map(str, PROMPT))
BENCH_QUICK = ["--n-prompt", "3", "--n-decode", "2", "--n-pool", "2", "--membw-mib", "16"]


@pytest.fixture(scope="module")
def model(tmp_models):
    return str(model_path(tmp_models, "Q8_0"))


@pytest.fixture(scope="module")
def header_only(tmp_path_factory):
    from strata.synth import PRESETS, write_model

    path = tmp_path_factory.mktemp("hdr") / "hdr.gguf"
    write_model(path, PRESETS["tiny"], header_only=True, progress=False)
    return str(path)


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _refused(capsys, *argv, says: str, status: int = 1):
    code, out, err = _run(capsys, *argv)
    assert code == status, err
    assert err.startswith("error: ") and says in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return out


# -- generate ---------------------------------------------------------------------------------

def test_the_cpu_backend_names_every_cuda_flag_it_ignores(capsys, model, tmp_path):
    """A flag only the CUDA engine reads is named by the CPU backend's note (the plan's VRAM
    knobs too, but --max-context, which it takes); a bad --gpu-mem is refused there as well."""
    prof = tmp_path / "p.npy"
    np.save(prof, np.ones((4, 8)))
    code, _, err = _run(capsys, "generate", "-m", model, "--backend", "cpu", "--prompt-tokens",
                        IDS, "-n", "1", "--max-context", "64", "--kv", "int8", "--miss-share",
                        "0.5", "--profile", str(prof), "--no-graph")
    assert code == 0, err
    note = next(line for line in err.splitlines() if line.startswith("note: --"))
    assert note == ("note: --no-graph, --miss-share, --kv, --profile: apply to the CUDA engine; "
                    "the cpu backend ignores them"), note
    _refused(capsys, "generate", "-m", model, "--backend", "cpu", "--prompt-tokens", IDS,
             "--gpu-mem", "16XB", says="16XB", status=2)


def test_the_cpu_bench_names_the_cuda_flags_it_ignores(capsys, model):
    code, _, err = _run(capsys, "bench", "--backend", "cpu", "-m", model, "--kv", "int8",
                        "--temperature", "0.5", "--no-graph", *BENCH_QUICK)
    assert code == 0, err
    note = next(line for line in err.splitlines() if line.startswith("note: --"))
    assert note == ("note: --temperature, --no-graph, --kv: apply to --backend cuda; the CPU "
                    "bench ignores them"), note
    _refused(capsys, "bench", "--backend", "cpu", "-m", model, "--gpu-mem", "16XB",
             *BENCH_QUICK, says="16XB", status=2)


def test_generate_refuses_a_kv_cache_larger_than_the_machine(capsys, model, monkeypatch):
    from strata.kv import cache as kv_cache

    monkeypatch.setattr(kv_cache, "host_memory_bytes", lambda: 64 << 30)
    _refused(capsys, "generate", "-m", model, "--backend", "cpu", "--prompt-tokens", IDS,
             "--max-context", "1000000000",
             says="a KV cache of 1,000,000,000 positions needs 2.33 TiB of host memory; this "
                  "machine has 64.00 GiB (lower --max-context)")


def test_generate_says_the_temperature_must_be_finite(capsys, model):
    for bad in ("inf", "nan", "-1"):
        _refused(capsys, "generate", "-m", model, "--prompt-tokens", IDS, "--temperature", bad,
                 says=f"--temperature must be a finite number >= 0, got {bad}", status=2)


@pytest.mark.parametrize("where, says", [
    ("{tmp}/missing/x.npy", "folder {tmp}/missing does not exist"),
    ("{tmp}/adir.npy", "it is a directory"),
    ("{tmp}/file/x.npy", "folder {tmp}/file is not a folder"),
])
def test_generate_checks_logits_out_before_running(capsys, model, tmp_path, monkeypatch, where,
                                                    says):
    from strata.cli import generate as cli_generate

    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "adir.npy").mkdir()
    monkeypatch.setattr(cli_generate, "_generate",
                        lambda *a, **k: pytest.fail("generated before --logits-out was checked"))
    where, says = where.format(tmp=tmp_path), says.format(tmp=tmp_path)
    _refused(capsys, "generate", "-m", model, "--backend", "cpu", "--prompt-tokens", IDS,
             "-n", "2", "--logits-out", where, says=f"--logits-out {where}: {says}")


def test_generate_json_schema_file_not_utf8_is_named(capsys, model, tmp_path):
    bad = tmp_path / "schema.json"
    bad.write_bytes(b'{"type": "object", "description": "caf\xe9"}')
    _refused(capsys, "generate", "-m", model, "--prompt", "x", "--json-schema", str(bad),
             says=f"--json-schema: {bad}: not UTF-8 text", status=2)


def test_generate_without_m_names_an_unusable_cache_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    afile = tmp_path / "afile"
    afile.write_bytes(b"")
    for cache in (afile, afile / "below"):  # a file, and a folder under a file
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        _refused(capsys, "generate", "--prompt", "hi",
                 says=f"cannot use the cache folder {cache / 'strata'}")
    err = _run(capsys, "generate", "--prompt", "hi")[2]
    assert "set XDG_CACHE_HOME to a writable folder, or pass -m FILE" in err
    assert afile.read_bytes() == b""


def test_generate_refuses_a_directory_as_the_model(capsys, tmp_path):
    _refused(capsys, "generate", "-m", str(tmp_path), "--prompt", "hi",
             says=f"{tmp_path}: is a directory, not a GGUF file")


def test_generate_refuses_a_header_only_file(capsys, header_only):
    _refused(capsys, "generate", "-m", header_only, "--backend", "cpu", "--prompt", "hi",
             says=f"{header_only}: header-only: it has no weights; it is for `strata plan`")
    # the file stays good for planning
    code, out, _ = _run(capsys, "plan", "-m", header_only, "--gpu-mem", "8GiB", "--json")
    assert code == 0 and json.loads(out)["accepted"]


# -- profile ----------------------------------------------------------------------------------

@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("hello world\n", encoding="utf-8")
    return str(path)


def test_profile_validates_max_context(capsys, model, prompts, tmp_path):
    for bad in ("1", "0", "-3"):
        _refused(capsys, "profile", "-m", model, "--prompts", prompts, "-o",
                 str(tmp_path / "p.npy"), "--max-context", bad, status=2,
                 says=f"--max-context must be at least 2 (a prompt token and the token it "
                      f"generates), got {bad}")


@pytest.mark.parametrize("where, says", [
    ("{tmp}/missing/p.npy", "folder {tmp}/missing does not exist"),
    ("{tmp}/adir.npy", "it is a directory"),
])
def test_profile_checks_its_output_before_running(capsys, model, prompts, tmp_path, monkeypatch,
                                                   where, says):
    from strata.experts import profile as experts_profile

    (tmp_path / "adir.npy").mkdir()
    monkeypatch.setattr(experts_profile, "record",
                        lambda *a, **k: pytest.fail("the prompts ran before -o was checked"))
    where, says = where.format(tmp=tmp_path), says.format(tmp=tmp_path)
    out = _refused(capsys, "profile", "-m", model, "--prompts", prompts, "-o", where,
                   says=f"-o {where}: {says}")
    assert out == ""


def test_profile_refuses_a_header_only_file(capsys, header_only, prompts, tmp_path):
    _refused(capsys, "profile", "-m", header_only, "--prompts", prompts, "-o",
             str(tmp_path / "p.npy"), says="header-only: it has no weights")
    assert not (tmp_path / "p.npy").exists()


def test_profile_counts_in_the_singular(capsys, model, prompts, tmp_path):
    out = tmp_path / "p.npy"
    code, stdout, err = _run(capsys, "profile", "-m", model, "--prompts", prompts, "-o",
                             str(out), "--max-context", "16")
    assert code == 0, err
    assert "recorded 1 prompt, " in stdout and f"-> {out}" in stdout
    assert np.load(out).shape == (2, 10)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")] == []


# -- bench ------------------------------------------------------------------------------------

def test_bench_refuses_a_negative_seed(capsys, model):
    _refused(capsys, "bench", "--backend", "cpu", "-m", model, "--seed", "-1", *BENCH_QUICK,
             says="--seed must be >= 0, got -1", status=2)


def test_bench_refuses_an_empty_mix_list(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "linux")
    for mix in (",", " , ,", ""):
        out = _refused(capsys, "bench", "--backend", "cpu", "--preset", "tiny", "--mix", mix,
                       *BENCH_QUICK, says="names no quant mix", status=2)
        assert out == ""
    # a bad name among good ones is refused before the first file is written
    _refused(capsys, "bench", "--backend", "cpu", "--preset", "tiny", "--mix", "Q8_0,Q9",
             *BENCH_QUICK, says="unknown quantization mix 'Q9'", status=2)
    assert not list(tmp_path.rglob("*.gguf"))


def test_bench_synthetic_files_need_a_seed_they_can_store(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "platform", "linux")
    _refused(capsys, "bench", "--backend", "cpu", "--preset", "tiny", "--mix", "Q8_0",
             "--seed", str(2 ** 32), *BENCH_QUICK, says="--seed must be an integer in 0..",
             status=2)


@pytest.mark.parametrize("where, says", [
    ("{tmp}/missing/x.json", "folder {tmp}/missing does not exist"),
    ("{tmp}", "it is a directory, not a regular file"),
])
def test_bench_checks_json_out_before_running(capsys, model, tmp_path, monkeypatch, where, says):
    from strata.cli import bench as cli_bench

    monkeypatch.setattr(cli_bench, "bench_file",
                        lambda *a, **k: pytest.fail("measured before --json-out was checked"))
    where, says = where.format(tmp=tmp_path), says.format(tmp=tmp_path)
    for backend in ("cpu", "cuda"):
        code, out, err = _run(capsys, "bench", "--backend", backend, "-m", model,
                              "--json-out", where, *BENCH_QUICK)
        assert code == 1 and out == "" and err == f"error: --json-out {where}: {says}\n", err


def test_bench_cuda_without_a_driver_is_a_clear_error(capsys, model, monkeypatch):
    """numba raising at driver init (no libcuda) is the error generate gives there."""
    from numba.cuda.cudadrv.error import CudaSupportError

    from strata.engine.multi import request

    def no_driver():
        raise CudaSupportError("Error at driver init: CUDA driver library cannot be found")

    monkeypatch.setattr(request, "visible_gpus", no_driver)
    code, out, err = _run(capsys, "bench", "--backend", "cuda", "-m", model)
    assert code == 1 and out == ""
    assert err.startswith("error: --backend cuda: ") and "Traceback" not in err, err
    assert err.count("\n") == 1


def test_bench_refuses_a_header_only_file(capsys, header_only, model, monkeypatch):
    from strata.bench import engine_cuda

    _refused(capsys, "bench", "--backend", "cpu", "-m", model, "-m", header_only, *BENCH_QUICK,
             says=f"{header_only}: header-only: it has no weights")
    monkeypatch.setattr(engine_cuda, "run_cuda", lambda args: pytest.fail("benched it"))
    _refused(capsys, "bench", "--backend", "cuda", "-m", header_only,
             says=f"{header_only}: header-only: it has no weights")


# -- synth ------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", ["-1", str(2 ** 32), "99999999999"])
def test_synth_refuses_a_seed_the_file_cannot_store(capsys, tmp_path, seed):
    out = tmp_path / "x.gguf"
    _refused(capsys, "synth", "tiny", "-o", str(out), "--seed", seed, "--quiet", status=2,
             says=f"--seed must be an integer in 0..4294967295 (the file stores a 32-bit "
                  f"seed), got {seed}")
    assert not out.exists()


def test_synth_stores_the_largest_seed_as_given(capsys, tmp_path):
    from strata.gguf import open_model

    out = tmp_path / "x.gguf"
    assert main(["synth", "tiny", "-o", str(out), "--seed", str(2 ** 32 - 1), "--quiet",
                 "--header-only"]) == 0
    assert open_model(out).metadata.int("strata.synth.seed") == 2 ** 32 - 1


# -- the entry point --------------------------------------------------------------------------

def test_no_subcommand_prints_the_help_and_exits_2(capsys):
    code, out, err = _run(capsys)
    assert code == 2 and out == ""
    assert err.startswith("usage: strata") and "generate" in err


class _FailingStdout(io.TextIOBase):
    """A standard output whose writes fail as a closed pipe or a full disk makes them. Its
    descriptor is a scratch file's, for what the handlers point at the null device (rich
    does so itself on a broken pipe)."""

    def __init__(self, error: OSError, fd: int):
        self.error, self.fd = error, fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.fd

    def write(self, text):
        raise self.error

    def flush(self):
        raise self.error

    def close(self):  # garbage collection would flush (and fail) once more
        pass


@pytest.fixture
def failing_stdout(tmp_path):
    fds = []

    def make(error: OSError) -> _FailingStdout:
        fds.append(os.open(tmp_path / "stdout", os.O_WRONLY | os.O_CREAT))
        return _FailingStdout(error, fds[-1])

    yield make
    for fd in fds:
        os.close(fd)


def _entry(monkeypatch, stdout, argv) -> int:
    from strata import shutdown

    ended: list[int] = []
    monkeypatch.setattr(shutdown, "finish", ended.append)  # the status, not the process's end
    monkeypatch.setattr(sys, "argv", ["strata", *argv])
    monkeypatch.setattr(sys, "stdout", stdout)
    cli_main.entry()
    assert sys.stdout is stdout  # given back as it was
    return ended[0]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from helpers import ggufmake

    return ggufmake.write(tmp_path_factory.mktemp("plan") / "small.gguf", n_ctx=4096)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
@pytest.mark.parametrize("error, says", [
    # the reader gone (`| head`): quiet, status 1
    (BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)), ""),
    # a full disk behind `>`: one line
    (OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
     "error: cannot write to standard output: No space left on device\n"),
])
def test_a_failing_stdout_is_status_1_without_a_traceback(monkeypatch, capsys, small, json_flag,
                                                           failing_stdout, error, says):
    rc = _entry(monkeypatch, failing_stdout(error),
                ["plan", "-m", small, "--gpu-mem", "8GiB", *json_flag])
    assert rc == 1
    assert capsys.readouterr().err == says


def test_another_oserror_keeps_its_traceback(monkeypatch, capsys):
    """Only standard output's own failures are said as such: any other is a bug."""
    def broken(argv=None):
        raise OSError(errno.ENOSPC, "not stdout's")

    monkeypatch.setattr(cli_main, "main", broken)
    rc = _entry(monkeypatch, io.StringIO(), [])
    assert rc == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "not stdout's" in err and "standard output" not in err


def test_a_stream_in_another_encoding_writes_utf8(monkeypatch):
    """Windows writes a redirected stdout in its ANSI code page (cp1252): the answer's text is
    written as UTF-8 instead of raising UnicodeEncodeError at the first CJK character."""
    raw = io.BytesIO()
    stdout = io.TextIOWrapper(raw, encoding="cp1252")

    def speaks(argv=None):
        print("answer: 你好 🙂")
        return 0

    monkeypatch.setattr(cli_main, "main", speaks)
    assert _entry(monkeypatch, stdout, []) == 0
    stdout.flush()
    assert raw.getvalue().decode("utf-8") == "answer: 你好 🙂\n"


# -- the output helper ------------------------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_and_no_partial(tmp_path):
    from strata.cli.output import write_atomic

    target = tmp_path / "out.json"
    target.write_text("old")

    def half(f):
        f.write(b"{\"half\": ")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(StrataError, match=r"--json-out .*out.json: writing it failed \(No space"):
        write_atomic(target, "--json-out", half)
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]
    write_atomic(target, "--json-out", lambda f: f.write(b"new"))
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_outputs_write_through_symlinks_and_refuse_fifos(tmp_path):
    from strata.cli.output import check_output, write_atomic

    real = tmp_path / "real.npy"
    link = tmp_path / "link.npy"
    link.symlink_to(real)
    write_atomic(link, "-o", lambda f: np.save(f, np.arange(3)))
    assert link.is_symlink() and np.load(real).tolist() == [0, 1, 2]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(StrataError, match="it is a FIFO, not a regular file"):
        check_output(fifo, "-o")
    assert fifo.is_fifo()
