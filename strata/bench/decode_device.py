"""The decode engineer's device run in one process (kernels compiled once for tests and bench):

1. `strata synth qwen3-30b-a3b --quant Q4_K_M --skew 3` written in the background (D1's file),
   while the GPU tests `--tests` (pytest arguments) run in this process;
2. `strata bench --backend cuda` on that file with `--profile-decode` (D1), its JSON written to
   OUT/d1.json (the commit given by `--commit`: the device's copy is no git checkout) and its
   table, with the decode step's time per kernel unit, printed;
3. the GPU tests `--tests-after`, in this process (the kernels compiled above are reused).

    python -m strata.bench.decode_device --out DIR --commit HASH --tests "tests/gpu/... -k ..."
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

MODEL = "/tmp/m.gguf"
SYNTH = ["synth", "qwen3-30b-a3b", "--quant", "Q4_K_M", "--skew", "3", "-o", MODEL, "--quiet"]


def _bench_argv(args) -> list[str]:
    return ["bench", "--backend", "cuda", "-m", MODEL, "--prompt-tokens", str(args.prompt),
            "--gen", str(args.gen), "--max-context", str(args.max_context), "--json",
            "--profile-decode"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--commit", default="")
    p.add_argument("--tests", default="", help="pytest arguments (one string); empty: none")
    p.add_argument("--tests-after", default="", help="pytest arguments run after the bench")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--max-context", type=int, default=4096)
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    synth = subprocess.Popen([sys.executable, "-m", "strata.cli.main", *SYNTH])
    rc_tests = _pytest(args.tests, t0)
    if synth.wait() != 0:
        print("[decode_device] synth failed", flush=True)
        return 1
    print(f"[decode_device] synth done at {time.time() - t0:.0f} s", flush=True)
    from strata.bench.engine_cuda import table
    from strata.cli.main import main as cli_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(_bench_argv(args))
    if rc != 0:
        print(buf.getvalue()[-4000:], flush=True)
        return rc
    res = json.loads(buf.getvalue())
    res["commit"] = args.commit or res.get("commit")
    res["command"] = ("strata synth qwen3-30b-a3b --quant Q4_K_M --skew 3 -o /tmp/m.gguf; "
                      "strata " + " ".join(_bench_argv(args)))
    res["tests_rc"] = rc_tests
    (args.out / "d1.json").write_text(json.dumps(res, indent=2, default=float))
    print(table(res), flush=True)
    print(f"[decode_device] bench done at {time.time() - t0:.0f} s", flush=True)
    rc_after = _pytest(args.tests_after, t0)
    return rc_tests or rc_after


def _pytest(argstring: str, t0: float) -> int:
    if not argstring:
        return 0
    import pytest

    rc = int(pytest.main(shlex.split(argstring)))
    print(f"[decode_device] tests rc={rc} at {time.time() - t0:.0f} s: {argstring}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
