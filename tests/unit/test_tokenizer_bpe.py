"""Byte-level BPE ("gpt2") vocabularies: round trips, a naive reference, special tokens,
padded vocabularies and malformed metadata."""

from __future__ import annotations

import random
import warnings

import pytest

from helpers.vocabmake import (
    BYTE_CHAR, CORPUS, PY_PATTERNS, byte_level_meta, read_meta, reference_bpe, to_byte_level,
    train_merges, write_gguf,
)
from strata.tokenizer import Tokenizer, TokenizerError, TokenizerWarning

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
          "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")

TEXTS = [
    "", " ", "a", "Hello world", "  leading and trailing  ", "The quick brown fox.",
    "line one\nline two\r\n\n\nthree\t\ttabs", "It's, they're, WE'LL, I'D", "x = 12345 + 6789",
    "naïve café crème brûlée", "日本語のテキストと中文文本", "emoji 🙂🚀👩‍👩‍👧 flags 🇫🇷",
    "combining: e\u0301 a\u0308 n\u0303", "def f(x):\n    return x  # comment\n",
    "zero\u200bwidth and nbsp\u00a0here", "\U0010ffff private \ue000 use", "\x00\x01\x7f controls",
]


@pytest.fixture(scope="module")
def merges():
    return train_merges(CORPUS * 3, 300)


@pytest.fixture(scope="module")
def meta(merges):
    return byte_level_meta(merges, chat_template=CHATML)


@pytest.fixture(scope="module")
def tok(meta):
    return Tokenizer.from_metadata(meta)


def test_reads_a_gguf_file(tmp_path, meta):
    path = write_gguf(tmp_path / "tok.gguf", meta)
    t = Tokenizer.from_metadata(read_meta(path))
    assert t.n_vocab == len(meta["tokenizer.ggml.tokens"])
    assert t.eos_id == meta["tokenizer.ggml.tokens"].index("<|im_end|>")
    text = "Hello <|im_start|>"
    assert t.encode(text) == Tokenizer.from_metadata(meta).encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(0 <= i < tok.n_vocab for i in ids)


@pytest.mark.parametrize("pre", ["qwen2", "llama-bpe", "gpt2"])
def test_matches_naive_reference(merges, pre):
    meta = byte_level_meta(merges, pre=pre)
    t = Tokenizer.from_metadata(meta)
    lines = [ln for ln in CORPUS.splitlines(keepends=True)] + [
        "aaaa bbbb 1234567 the the  the\n\n x", "She's   here,\tisn't she?\r\n", CORPUS]
    for text in lines:
        assert t.encode(text) == reference_bpe(text, meta, PY_PATTERNS[pre]), (pre, text)


def test_random_text_matches_reference_and_round_trips(merges):
    meta = byte_level_meta(merges)
    t = Tokenizer.from_metadata(meta)
    rng = random.Random(7)
    alphabet = list("abcdefghij ABC .,;'!?\n\t0123456789éü日本🙂") + ["  ", "the ", "'s"]
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        ids = t.encode(text)
        assert ids == reference_bpe(text, meta, PY_PATTERNS["qwen2"]), repr(text)
        assert t.decode(ids) == text


def test_merges_are_used(tok):
    # "the" appears often in the corpus: the trainer merged it into one token
    ids = tok.encode(" the")
    assert len(ids) == 1 and tok.token_text(ids[0]) == to_byte_level(" the")
    assert tok.token_bytes(ids[0]) == b" the"


def test_qwen2_splits_digits_one_by_one_llama3_in_threes(merges):
    qwen = Tokenizer.from_metadata(byte_level_meta(merges + [("1", "2")], pre="qwen2"))
    llama = Tokenizer.from_metadata(byte_level_meta(merges + [("1", "2"), ("12", "3")],
                                                    pre="llama-bpe"))
    assert [qwen.token_text(i) for i in qwen.encode("123")] == ["1", "2", "3"]
    assert [llama.token_text(i) for i in llama.encode("1234")] == ["123", "4"]


def test_llama3_takes_a_whole_word_token_before_merging():
    # "abc" is a token but no merge reaches it: llama-bpe (ignore_merges) still takes it whole
    tokens = [BYTE_CHAR[b] for b in range(256)] + ["abc"]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [1] * len(tokens), "tokenizer.ggml.merges": []}
    llama3 = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "llama-bpe"})
    qwen2 = Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": "qwen2"})
    assert llama3.encode("abc") == [256]
    assert qwen2.encode("abc") == [97, 98, 99]


def test_special_tokens_parsed_or_not(tok, meta):
    tokens = meta["tokenizer.ggml.tokens"]
    start, end = tokens.index("<|im_start|>"), tokens.index("<|im_end|>")
    text = "<|im_start|>user\nhi<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == start and end in ids
    assert tok.decode(ids) == text
    assert tok.decode(ids, skip_special=True) == "user\nhi\n"
    plain = tok.encode(text, parse_special=False)
    assert start not in plain and end not in plain
    assert tok.decode(plain) == text
    assert tok.is_special(start) and not tok.is_special(plain[0])


def test_special_next_to_text_and_repeated(tok, meta):
    tokens = meta["tokenizer.ggml.tokens"]
    eot = tokens.index("<|endoftext|>")
    ids = tok.encode("a<|endoftext|><|endoftext|>b<|endoftext")
    assert ids.count(eot) == 2
    assert tok.decode(ids) == "a<|endoftext|><|endoftext|>b<|endoftext"


def test_user_defined_tokens_are_cut_out_even_without_parse_special(merges):
    meta = byte_level_meta(merges, user_defined=("<tool>",))
    t = Tokenizer.from_metadata(meta)
    tool = meta["tokenizer.ggml.tokens"].index("<tool>")
    assert tool in t.encode("x<tool>y", parse_special=False)
    assert not t.is_special(tool)


def _special_spans(tok, text):
    spans, at = [], 0
    for frag in tok._split_all.split(text):
        n = len(tok.token_text(frag)) if isinstance(frag, int) else len(frag)
        if isinstance(frag, int):
            spans.append((at, at + n, tok.token_text(frag)))
        at += n
    return spans


def test_overlapping_specials_match_hf_added_tokens(merges):
    # leftmost-longest, as Hugging Face matches added tokens; checked against `tokenizers`
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import BPE
    specials = ("<ab", "b>cd>", "<a", "cd", "<ab>", "d><")
    t = Tokenizer.from_metadata(byte_level_meta(merges, specials=specials, eos=None))
    hf = HfTokenizer(BPE())
    hf.add_special_tokens(list(specials))
    rng = random.Random(3)
    for _ in range(300):
        text = "".join(rng.choice(["<", "a", "b", ">", "c", "d", "x"]) for _ in range(12))
        enc = hf.encode(text)
        expected = [(a, b, tk) for (a, b), tk in zip(enc.offsets, enc.tokens) if tk in specials]
        assert _special_spans(t, text) == expected, text
        assert t.decode(t.encode(text)) == text


def test_bos_and_eos_follow_metadata(merges):
    meta = byte_level_meta(merges, bos="<|endoftext|>", add_bos=True)
    meta["tokenizer.ggml.add_eos_token"] = True
    t = Tokenizer.from_metadata(meta)
    bos, eos = t.bos_id, t.eos_id
    assert t.encode("hi")[0] == bos and t.encode("hi")[-1] == eos
    assert t.encode("hi", add_bos=False) == t.encode("hi", add_bos=False, parse_special=False)
    assert bos not in t.encode("hi", add_bos=False) and eos not in t.encode("hi", add_bos=False)
    # a text that already starts with BOS (a chat template writing bos_token) gets no second one
    assert t.encode("<|endoftext|>hi")[:2].count(bos) == 1
    no_bos = Tokenizer.from_metadata(byte_level_meta(merges))
    assert no_bos.bos_id is None and no_bos.encode("hi") == no_bos.encode("hi", add_bos=False)
    with pytest.raises(TokenizerError, match="no BOS"):
        no_bos.encode("hi", add_bos=True)


def test_eot_ids(tok, meta):
    tokens = meta["tokenizer.ggml.tokens"]
    assert tok.eot_ids == {tokens.index("<|im_end|>"), tokens.index("<|endoftext|>")}
    assert tokens.index("<|im_start|>") not in tok.eot_ids


def test_padded_vocabulary_with_short_merges():
    # like `strata synth`: 256 bytes, a handful of merges, thousands of filler tokens, specials
    short = [("t", "h"), ("th", "e"), ("Ġ", "the")]
    meta = byte_level_meta(short, n_filler=20000)
    t = Tokenizer.from_metadata(meta)
    assert t.n_vocab == 256 + 3 + 20000 + 3
    ids = t.encode("the cat <|im_end|> [PAD5] the")
    assert t.decode(ids) == "the cat <|im_end|> [PAD5] the"
    assert all(i < 259 or i >= 256 + 3 + 20000 for i in ids)  # filler never produced
    assert [t.token_text(i) for i in t.encode(" the")] == ["Ġthe"]
    assert t.decode([259 + 5]) == "[PAD5]" and t.decode([259 + 5], skip_special=True) == ""
    no_merges = dict(meta)
    del no_merges["tokenizer.ggml.merges"]
    t2 = Tokenizer.from_metadata(no_merges)
    assert t2.encode("the") == [ord("t"), ord("h"), ord("e")]


def test_unknown_pre_warns_and_uses_gpt2(merges):
    with pytest.warns(TokenizerWarning, match="unknown tokenizer.ggml.pre 'martian'"):
        t = Tokenizer.from_metadata(byte_level_meta(merges, pre="martian"))
    g = Tokenizer.from_metadata(byte_level_meta(merges, pre="gpt2"))
    assert t.encode(CORPUS) == g.encode(CORPUS)


def test_bad_merges_are_skipped_with_a_warning(merges):
    meta = byte_level_meta(merges)
    meta["tokenizer.ggml.merges"] = ["nospace", "zz qq"] + meta["tokenizer.ggml.merges"]
    with pytest.warns(TokenizerWarning, match="2 of"):
        t = Tokenizer.from_metadata(meta)
    assert t.encode(CORPUS) == Tokenizer.from_metadata(byte_level_meta(merges)).encode(CORPUS)


@pytest.mark.parametrize("change, message", [
    ({"tokenizer.ggml.model": "bert"}, "'bert', which Strata does not support"),
    ({"tokenizer.ggml.model": None}, "tokenizer.ggml.model' is missing"),
    ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens' is missing"),
    ({"tokenizer.ggml.token_type": [1, 1]}, "token_type has 2 entries"),
    ({"tokenizer.ggml.eos_token_id": 10**6}, "eos_token_id is 1000000, outside"),
    ({"tokenizer.ggml.bos_token_id": "one"}, "bos_token_id' should be an integer"),
    ({"tokenizer.ggml.add_bos_token": "yes"}, "add_bos_token' should be a boolean"),
    ({"tokenizer.ggml.token_type": None, "tokenizer.ggml.tokens": ["a", "b"],
      "tokenizer.ggml.eos_token_id": None},
     "lacks 254 of the 256 byte tokens"),
])
def test_malformed_metadata_is_refused(meta, change, message):
    bad = {k: v for k, v in {**meta, **change}.items() if v is not None}
    with pytest.raises(TokenizerError, match=message):
        Tokenizer.from_metadata(bad)


def test_token_type_out_of_range_is_refused(meta):
    types = list(meta["tokenizer.ggml.token_type"])
    types[7] = 9
    with pytest.raises(TokenizerError, match=r"token_type\[7\] is 9"):
        Tokenizer.from_metadata({**meta, "tokenizer.ggml.token_type": types})


@pytest.mark.parametrize("bad", [-1, 10**9, 2.5, "3"])
def test_invalid_ids_name_the_id_and_vocab(tok, bad):
    with pytest.raises(ValueError, match=f"{tok.n_vocab}|not an integer") as e:
        tok.decode([0, bad])
    assert str(bad) in str(e.value)
    with pytest.raises(ValueError):
        tok.token_text(bad)
    with pytest.raises(ValueError):
        tok.is_special(bad)


def test_encode_needs_text(tok):
    with pytest.raises(TypeError, match="needs a str"):
        tok.encode(b"bytes")


def test_no_warning_for_a_clean_vocabulary(meta):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Tokenizer.from_metadata(meta)


def test_benchmark_runs_and_its_texts_round_trip(tmp_path, meta, tok):
    import json

    from strata.tokenizer import bench
    path = write_gguf(tmp_path / "tok.gguf", meta)
    out = tmp_path / "bench.json"
    assert bench.main([path, "--kb", "1", "--repeat", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["texts"]
    assert [r["text"] for r in rows] == ["prose", "code", "cjk"]
    for r, text in zip(rows, bench._texts(1000).values()):
        assert r["bytes"] == len(text.encode()) >= 1000
        assert r["tokens"] == len(tok.encode(text, add_bos=False))
        assert tok.decode(tok.encode(text)) == text
