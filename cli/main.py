"""`strata`: the entry point. Subcommands are imported lazily, so `strata plan` and
`strata synth` start without importing numba or touching CUDA. numba's cache is pointed at the
per-user cache folder before any subcommand runs (`strata.aot.numba_cache`: per state of the
compiled sources, or per binary in the frozen build), and the hidden `strata selfcheck` checks
what the build runs on."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from strata import __version__
from strata.aot.numba_cache import configure as configure_numba_cache
from strata.errors import EXIT_FAILED, EXIT_USAGE, StrataError, UsageError

# name -> one-line help. Each name is a module strata.cli.<name> with
# `add_arguments(parser)` and `run(args) -> int`; its heavy imports live inside run().
COMMANDS: dict[str, str] = {
    "generate": "generate text from a prompt (CPU or GPU backend)",
    "plan": "print the VRAM plan for a model and GPU(s) without loading anything",
    "synth": "write a synthetic GGUF model of a real shape (for tests and benchmarks)",
    "bench": "measure prefill and decode speed against their bounds",
    "profile": "record a routing profile (which experts each layer uses) by running prompts",
    "serve": "serve a model over HTTP: OpenAI and Anthropic APIs, metrics, a monitor page",
}
# Subcommands left out of --help (same module contract).
HIDDEN: tuple[str, ...] = ("selfcheck",)
# In the frozen app `sys.executable` is this binary, so a library that re-runs "the interpreter"
# as `sys.executable -m MODULE ...` reaches main(): cuda.pathfinder probes how a CUDA library
# loads that way before numba-cuda can start. Those modules run as `python -m` would run them.
FROZEN_MODULES: tuple[str, ...] = ("cuda.pathfinder.",)


def _parser_for(argv: list[str]) -> tuple[argparse.ArgumentParser, str | None]:
    parser = argparse.ArgumentParser(
        prog="strata",
        description="Run Mixture-of-Experts GGUF models on GPUs smaller than the model.",
    )
    parser.add_argument("--version", action="version", version=f"strata {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name in (*COMMANDS, *HIDDEN):
        # a parser added without help= is left out of the command list
        kw = {"help": COMMANDS[name], "description": COMMANDS[name]} if name in COMMANDS else {}
        p = sub.add_parser(name, **kw)
        if name == chosen:  # only the chosen subcommand's module is imported
            module = importlib.import_module(f"strata.cli.{name}")
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    return parser, chosen


def _run_module(argv: list[str]) -> int:
    """`strata -m MODULE ARGS...` in the frozen app: run an allowed module as `__main__`."""
    import runpy

    name = argv[1] if len(argv) > 1 else ""
    if not name.startswith(FROZEN_MODULES):
        print(f"error: -m {name or '(no module)'}: the frozen strata runs only "
              f"{', '.join(m + '*' for m in FROZEN_MODULES)} this way", file=sys.stderr)
        return 1  # `python -m` stands in here, and it exits 1 on a module it cannot run
    sys.argv = [name, *argv[2:]]
    try:
        runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # the module's own exit status, as python -m would give it
        from strata.shutdown import exit_status
        return exit_status(e)
    return 0


def main(argv: list[str] | None = None) -> int:
    configure_numba_cache()  # before anything imports numba
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["-m"] and getattr(sys, "frozen", False):
        return _run_module(argv)
    parser, chosen = _parser_for(argv)
    args = parser.parse_args(argv)
    if chosen is None or not hasattr(args, "_run"):
        # no subcommand is a usage error: argparse's status for one, after the help
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except UsageError as e:  # a flag's value or combination: argparse's status for its own
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except StrataError as e:  # a run that failed: a file, the machine, the model
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


_STDOUT_MARK = "strata_stdout"  # set on an OSError that standard output raised


class _MarkedStdout:
    """sys.stdout with its own write errors marked, so that `entry` tells a reader gone (a
    closed pipe) or a full disk behind `>` from any other OSError, which stays a bug."""

    def __init__(self, stream):
        self._stream = stream

    def _call(self, name: str, *a):
        try:
            return getattr(self._stream, name)(*a)
        except OSError as e:
            setattr(e, _STDOUT_MARK, True)
            raise

    def write(self, text):
        return self._call("write", text)

    def writelines(self, lines):
        return self._call("writelines", lines)

    def flush(self):
        return self._call("flush")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _stdout_to_devnull(stream) -> None:
    """Point standard output's descriptor at the null device: what is still buffered then goes
    nowhere, instead of failing again at interpreter exit (the pattern Python's documentation
    gives for SIGPIPE, in the signal module's notes)."""
    try:
        fd = stream.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):  # no descriptor (a stand-in stream)
        return
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _utf8_streams() -> None:
    """Standard output and error written as UTF-8 where Python chose another encoding: Windows
    writes a redirected stream (`strata generate > out.txt`, a tool reading the pipe) in the
    ANSI code page, where a generated CJK character or emoji raised UnicodeEncodeError in the
    middle of the answer. What still cannot be written is replaced, never raised."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and callable(getattr(stream, "reconfigure", None)):
            stream.reconfigure(encoding="utf-8", errors="replace")


def _main_writing_stdout() -> int:
    """main(), with standard output's failures made an exit status: its reader gone (`| head`)
    ends quietly with status 1, as Python's own EPIPE exit; another write error (`> /dev/full`)
    is one line on stderr and status 1."""
    _utf8_streams()
    out = sys.stdout
    sys.stdout = _MarkedStdout(out)
    try:
        try:
            rc = main()
        except SystemExit as e:  # argparse's --help, --version, usage: their output too
            rc = e
        sys.stdout.flush()  # what is still buffered fails here, not at interpreter exit
        if isinstance(rc, SystemExit):
            raise rc
        return rc
    except OSError as e:
        if not getattr(e, _STDOUT_MARK, False):
            raise
        _stdout_to_devnull(out)
        if not isinstance(e, BrokenPipeError):
            try:
                print(f"error: cannot write to standard output: {e.strerror or e}",
                      file=sys.stderr)
            except OSError:  # stderr goes to the same place: the status alone says it
                pass
        return 1
    finally:
        sys.stdout = out


def entry() -> None:
    """The `strata` command: main(), then the process ends with its status (`strata.shutdown`:
    past cuda.core's crash at exit). main() itself returns, for in-process callers (tests)."""
    from strata.shutdown import run_then_finish

    run_then_finish(_main_writing_stdout)


if __name__ == "__main__":
    import multiprocessing

    multiprocessing.freeze_support()  # a frozen app's worker processes start here too
    entry()
