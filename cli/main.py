"""`strata`: the entry point. Subcommands are imported lazily, so `strata plan` and
`strata synth` start without importing numba or touching CUDA. numba's cache is pointed at the
per-user cache folder before any subcommand runs (`strata.aot.numba_cache`: per state of the
compiled sources, or per binary in the frozen build), and the hidden `strata selfcheck` checks
what the build runs on."""

from __future__ import annotations

import argparse
import importlib
import sys

from strata import __version__
from strata.aot.numba_cache import configure as configure_numba_cache
from strata.errors import StrataError

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
        return 1
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
        parser.print_help()
        return 0 if chosen is None else 1
    try:
        return int(args._run(args) or 0)
    except StrataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    """The `strata` command: main(), then the process ends with its status (`strata.shutdown`:
    past cuda.core's crash at exit). main() itself returns, for in-process callers (tests)."""
    from strata.shutdown import run_then_finish

    run_then_finish(main)


if __name__ == "__main__":
    import multiprocessing

    multiprocessing.freeze_support()  # a frozen app's worker processes start here too
    entry()
