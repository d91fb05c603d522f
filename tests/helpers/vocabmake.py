"""Synthetic tokenizer vocabularies for the tokenizer tests, and naive reference encoders.

The references are deliberately the slow textbook algorithms (rescan every pair after every
merge), written independently of `strata.tokenizer`, so a test compares two formulations.
"""

from __future__ import annotations

import random
import re
from collections import Counter

import gguf

CONTROL, USER_DEFINED, NORMAL, BYTE, UNKNOWN, UNUSED = 3, 4, 1, 6, 2, 5
SPACE = "\u2581"

# The byte-level alphabet written out from its definition (printable Latin-1 bytes stand for
# themselves, the rest take U+0100.. in byte order), independently of strata.tokenizer.
_KEEP = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
BYTE_CHAR = {b: chr(b) for b in _KEEP}
BYTE_CHAR.update({b: chr(0x100 + k) for k, b in enumerate(b for b in range(256) if b not in _KEEP)})

CORPUS = (
    "The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away!\n"
    "Tokenizers turn text into tokens, and tokens back into text. It's what they're for.\n"
    "def encode(text):\n    return [ord(c) for c in text]  # 1234 5678 90\n"
    "Ünïcödé: naïve café, 日本語のテキスト, 中文文本, emoji 🙂🚀 and more.\n"
)

# Python-`re` versions of the pre-tokenizer patterns, valid for texts whose letters are
# letters in both senses and whose digits are ASCII (\p{L} -> [^\W\d_], \p{N} -> \d).
_L, _N, _NOT_LNS = r"[^\W\d_]", r"\d", r"(?:[^\s\w]|_)"
_CONTR = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
PY_PATTERNS = {
    "qwen2": (_CONTR + rf"|(?:[^\r\n\w]|_)?{_L}+|{_N}| ?{_NOT_LNS}+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+"),
    "llama-bpe": (_CONTR + rf"|(?:[^\r\n\w]|_)?{_L}+|{_N}{{1,3}}| ?{_NOT_LNS}+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "gpt2": rf"'s|'t|'re|'ve|'m|'ll|'d| ?{_L}+| ?{_N}+| ?{_NOT_LNS}+|\s+(?!\S)|\s+",
}


def to_byte_level(text: str) -> str:
    return "".join(BYTE_CHAR[b] for b in text.encode("utf-8"))


def isolated_split(pattern: str, text: str) -> list[str]:
    """Every match is a word and so is every run of text between matches."""
    words, at = [], 0
    for m in re.finditer(pattern, text):
        if m.start() > at:
            words.append(text[at:m.start()])
        if m.end() > m.start():
            words.append(m.group())
        at = m.end()
    if at < len(text):
        words.append(text[at:])
    return words


def train_merges(text: str, n_merges: int,
                 pattern: str = PY_PATTERNS["qwen2"]) -> list[tuple[str, str]]:
    """A tiny byte-level BPE trainer: most frequent adjacent pair first (ties: smallest pair)."""
    words = Counter(tuple(to_byte_level(w)) for w in isolated_split(pattern, text))
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs: Counter = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        new: Counter = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += n
        words = new
    return merges


def byte_level_meta(merges, *, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                    n_filler=0, pre="qwen2", eos="<|im_end|>", bos=None, add_bos=None,
                    chat_template=None, user_defined=()) -> dict:
    """A `tokenizer.ggml.*` mapping: 256 byte tokens, one token per merge, `n_filler`
    unreachable filler tokens, then user-defined and control tokens."""
    tokens = [BYTE_CHAR[b] for b in range(256)]
    seen = set(tokens)
    for a, b in merges:
        if a + b not in seen:
            tokens.append(a + b)
            seen.add(a + b)
    types = [NORMAL] * len(tokens)
    tokens += [f"[PAD{i}]" for i in range(n_filler)]
    types += [UNUSED] * n_filler
    tokens += list(user_defined)
    types += [USER_DEFINED] * len(user_defined)
    tokens += list(specials)
    types += [CONTROL] * len(specials)
    meta = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in merges],
    }
    if eos is not None:
        meta["tokenizer.ggml.eos_token_id"] = tokens.index(eos)
    if bos is not None:
        meta["tokenizer.ggml.bos_token_id"] = tokens.index(bos)
    if add_bos is not None:
        meta["tokenizer.ggml.add_bos_token"] = add_bos
    if chat_template is not None:
        meta["tokenizer.chat_template"] = chat_template
    return meta


def spm_pieces(seed: int = 3) -> dict[str, float]:
    """Substrings of the corpus words (with their ▁) seen at least twice, random scores; plus
    a few pieces that span a ▁ so merges can cross word boundaries."""
    rng = random.Random(seed)
    text = (" " + CORPUS).replace(" ", SPACE)
    counts = Counter(text[i:i + n] for n in range(2, 6) for i in range(len(text) - n + 1))
    pieces = {p: -rng.uniform(1, 20) for p, c in sorted(counts.items()) if c >= 2 and "\n" not in p}
    for ch in sorted(set(text) - {"\n", "🙂", "🚀", "日", "語"}):
        pieces.setdefault(ch, -25.0)  # most single characters; the rest take byte fallback
    for p in ("e" + SPACE + "t", "s" + SPACE, SPACE * 2, SPACE * 3):
        pieces[p] = -0.5
    return pieces


def spm_meta(pieces: dict[str, float], *, add_space_prefix=True, user_defined=(),
             controls=("<start_of_turn>", "<end_of_turn>")) -> dict:
    """A SentencePiece-style mapping: <unk> <s> </s>, 256 byte tokens, `pieces` with their
    scores, then user-defined and control tokens."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for p, s in pieces.items():
        tokens.append(p)
        types.append(NORMAL)
        scores.append(float(s))
    for group, kind in ((user_defined, USER_DEFINED), (controls, CONTROL)):
        tokens += list(group)
        types += [kind] * len(group)
        scores += [0.0] * len(group)
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }


def llama_cpp_keys(arch: str) -> dict:
    """The hyper-parameters llama.cpp reads even when it loads only the vocabulary."""
    return {f"{arch}.block_count": 1, f"{arch}.context_length": 128,
            f"{arch}.embedding_length": 8, f"{arch}.feed_forward_length": 8,
            f"{arch}.attention.head_count": 1, f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}


def random_texts(seed: int, n: int, max_len: int = 40) -> list[str]:
    """Random strings over many scripts, digits, punctuation, symbols, emoji, whitespace kinds,
    combining marks and control characters."""
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " " * 8, "\n\t\r",
        ".,;:!?'\"()[]{}<>/\\|@#$%^&*-_+=~`", "àéîõüçñßøåÀÉÎÕÜÇÑ", "αβγδεζηθΑΒΓΔ",
        "абвгдежзАБВГ", "日本語中文字テキストひらがな", "한국어텍스트", "العربية", "हिन्दी", "٠١٢٣٤٥",
        "①²½Ⅷ", "€£¥©®™°±×÷", "🙂🚀👍🏽👩‍👧🇫🇷", "\u0301\u0308\u0303\u200d\u200b",
        "\u00a0\u3000\u2028\u0085", "\x00\x01\x1b\x7f", "'s 're 'LL n't",
    ]
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(1, max_len)
        out.append("".join(rng.choice(rng.choice(pools)) for _ in range(k)))
    return out


def write_gguf(path, meta: dict, *, arch: str = "qwen2", extra: dict | None = None) -> str:
    """A tensor-less GGUF holding `meta` (and `extra` arch keys), read back like a model file."""
    w = gguf.GGUFWriter(str(path), arch)
    for k, v in {**(extra or {}), **meta}.items():
        if k == "tokenizer.ggml.tokens" or k == "tokenizer.ggml.merges":
            w.add_array(k, v)
        elif k == "tokenizer.ggml.token_type":
            w.add_key_value(k, [int(x) for x in v], gguf.GGUFValueType.ARRAY,
                            sub_type=gguf.GGUFValueType.INT32)
        elif k == "tokenizer.ggml.scores":
            w.add_key_value(k, [float(x) for x in v], gguf.GGUFValueType.ARRAY,
                            sub_type=gguf.GGUFValueType.FLOAT32)
        elif isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def read_meta(path):
    """The file's metadata the way `ModelFile` exposes it (without needing a known arch)."""
    from strata.gguf.metadata import Metadata
    return Metadata.read(str(path))


# ------------------------------------------------------------------------- naive references
def reference_bpe(text: str, meta: dict, pattern: str) -> list[int]:
    """Byte-level BPE the slow way: per word, merge the lowest-ranked adjacent pair (leftmost
    on a tie) until none is in the merges list."""
    tokens = meta["tokenizer.ggml.tokens"]
    ids = {t: i for i, t in enumerate(tokens)}
    rank = {}
    for r, m in enumerate(meta["tokenizer.ggml.merges"]):
        a, b = m.split(" ")
        rank.setdefault((a, b), r)
    out = []
    for word in isolated_split(pattern, text):
        syms = list(to_byte_level(word))
        while True:
            cands = [(rank[syms[i], syms[i + 1]], i) for i in range(len(syms) - 1)
                     if (syms[i], syms[i + 1]) in rank]
            if not cands:
                break
            _, i = min(cands)
            syms[i:i + 2] = [syms[i] + syms[i + 1]]
        out += [ids[s] for s in syms]
    return out


def reference_spm(text: str, meta: dict, *, prefix_space: bool) -> list[int]:
    """SentencePiece-style BPE the slow way: merge the adjacent pair whose concatenation is the
    highest-scored token (leftmost on a tie); unknown characters as <0xNN> byte tokens."""
    tokens, scores = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"]
    ids = {t: i for i, t in enumerate(tokens)}
    if prefix_space:
        text = " " + text
    syms = list(text.replace(" ", SPACE))
    while True:
        best = None
        for i in range(len(syms) - 1):
            t = ids.get(syms[i] + syms[i + 1])
            if t is not None and (best is None or scores[t] > best[0]):
                best = (scores[t], i)
        if best is None:
            break
        i = best[1]
        syms[i:i + 2] = [syms[i] + syms[i + 1]]
    out = []
    for s in syms:
        if s in ids:
            out.append(ids[s])
        else:
            out += [ids[f"<0x{b:02X}>"] for b in s.encode("utf-8")]
    return out
