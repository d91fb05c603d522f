"""Tokenizer speed on a model's vocabulary: `python -m strata.tokenizer.bench MODEL.gguf
[--kb 100] [--repeat 3] [--json PATH]`.

Times reading the vocabulary from the file, building the tokenizer, and encoding / decoding /
stream-decoding generated texts of `--kb` KB each (prose, code, CJK); encode is timed cold (a
fresh tokenizer's word cache) and warm (best of `--repeat`). Prints one table and optionally
writes the same rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import time

_WORDS = ("the of and to in is that for it as with was on be by this are from at or an have "
          "not which but they all one their there been has more when will would who out so up "
          "model token memory layer expert cache device plan budget prompt stream decode "
          "river bridge village market morning garden evening winter station question answer "
          "Strata GGUF GPU VRAM 2024 3.14 42 1,000 don't it's we'll").split()


def _texts(n_bytes: int, seed: int = 0) -> dict[str, str]:
    rng = random.Random(seed)

    def fill(make) -> str:
        parts, size = [], 0
        while size < n_bytes:
            piece = make()
            parts.append(piece)
            size += len(piece.encode("utf-8"))
        return "".join(parts)

    def sentence() -> str:
        words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 18))]
        return " ".join(words).capitalize() + rng.choice([". ", "? ", "! ", ".\n\n", ", "])

    def code_line() -> str:
        indent = " " * (4 * rng.randint(0, 3))
        a, b = rng.choice(_WORDS[:40]), rng.choice(_WORDS[40:60])
        return f"{indent}{a}_{b} = compute({a}, {rng.randint(0, 999)})  # {b}\n"

    def cjk() -> str:
        return "".join(chr(rng.randint(0x4E00, 0x4FFF)) for _ in range(20)) + "。"

    return {"prose": fill(sentence), "code": fill(code_line), "cjk": fill(cjk)}


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(path: str, *, n_bytes: int, repeat: int) -> dict:
    """Load/build seconds and, per text, encode/decode seconds and tokens."""
    from strata.gguf.metadata import Metadata
    from strata.tokenizer.tokenizer import Tokenizer

    t0 = time.perf_counter()
    meta = Metadata.read(path)
    t1 = time.perf_counter()
    tok = Tokenizer.from_metadata(meta)
    t2 = time.perf_counter()
    rows = []
    for name, text in _texts(n_bytes).items():
        cold = Tokenizer(tok.vocab)
        c0 = time.perf_counter()
        ids = cold.encode(text, add_bos=False)
        cold_s = time.perf_counter() - c0
        warm_s = _best(lambda: tok.encode(text, add_bos=False), repeat)
        decode_s = _best(lambda: tok.decode(ids), repeat)

        def stream():
            d = tok.stream_decoder()
            for i in ids:
                d.push(i)
            d.flush()
        stream_s = _best(stream, repeat)
        rows.append({"text": name, "bytes": len(text.encode("utf-8")), "tokens": len(ids),
                     "encode_cold_s": cold_s, "encode_warm_s": warm_s, "decode_s": decode_s,
                     "stream_us_per_token": stream_s / max(1, len(ids)) * 1e6})
    return {"model": path, "tokenizer": repr(tok), "read_metadata_s": t1 - t0,
            "build_s": t2 - t1, "texts": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a GGUF file (any architecture; only its vocabulary is read)")
    ap.add_argument("--kb", type=int, default=100, help="size of each text in KB (default 100)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs, best kept (default 3)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    if args.kb < 1 or args.repeat < 1:
        ap.error("--kb and --repeat must be at least 1")
    r = measure(args.model, n_bytes=args.kb * 1000, repeat=args.repeat)
    print(f"{r['tokenizer']}\nread metadata {r['read_metadata_s']:.2f} s, "
          f"build {r['build_s']:.2f} s")
    print(f"{'text':<6} {'KB':>5} {'tokens':>7} {'enc cold ms':>11} {'enc warm ms':>11} "
          f"{'MB/s warm':>9} {'decode ms':>9} {'stream us/tok':>13}")
    for row in r["texts"]:
        print(f"{row['text']:<6} {row['bytes'] / 1000:>5.0f} {row['tokens']:>7} "
              f"{row['encode_cold_s'] * 1e3:>11.1f} {row['encode_warm_s'] * 1e3:>11.1f} "
              f"{row['bytes'] / row['encode_warm_s'] / 1e6:>9.2f} {row['decode_s'] * 1e3:>9.1f} "
              f"{row['stream_us_per_token']:>13.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
