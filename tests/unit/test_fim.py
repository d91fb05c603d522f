"""Fill-in-the-middle (`strata.tokenizer.fim`, `ServedModel.encode_fim`): the three tokens
found by the GGUF keys or by their spellings, the prompt in prefix-suffix-middle order as Qwen's
coder models document it (`<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>`), the
code's own text kept text, and the tokens that end a middle among a served model's stops."""

from __future__ import annotations

import pytest

from helpers.vocabmake import byte_level_meta
from strata.serve.errors import ApiError
from strata.serve.model import ServedModel
from strata.tokenizer import ChatTemplate, Tokenizer
from strata.tokenizer.errors import TokenizerError
from strata.tokenizer.fim import fim_tokens

QWEN_FIM = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
            "<|repo_name|>", "<|file_sep|>")
MERGES = [("d", "e"), ("de", "f"), ("Ġ", "f")]


def _tok(specials=(), **meta_kw) -> tuple[Tokenizer, dict]:
    meta = byte_level_meta(MERGES, specials=("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                             *specials), **meta_kw)
    return Tokenizer.from_metadata(meta), meta


def _served(tok, meta) -> ServedModel:
    meta = {**meta, "tokenizer.chat_template": "{% for m in messages %}{{ m.content }}"
                                               "{% endfor %}"}
    return ServedModel(name="coder", aliases=(), tokenizer=tok, max_context=256,
                       template=ChatTemplate.from_metadata(meta, tok))


def test_qwen_spellings_make_the_documented_prompt():
    tok, meta = _tok(QWEN_FIM)
    fim = fim_tokens(tok)
    ids = {t: meta["tokenizer.ggml.tokens"].index(t) for t in QWEN_FIM}
    assert (fim.prefix, fim.suffix, fim.middle) == (
        ids["<|fim_prefix|>"], ids["<|fim_suffix|>"], ids["<|fim_middle|>"])
    assert fim.ends == {ids["<|fim_pad|>"], ids["<|repo_name|>"], ids["<|file_sep|>"]}
    prefix, suffix = "def f(x):\n    ", "\n    return y <|im_end|>\n"
    prompt = fim.prompt(tok, prefix, suffix)
    assert tok.decode(prompt, skip_special=False) == (
        f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>")
    # the code's own "<|im_end|>" stays text: the only control tokens are the three
    assert [t for t in prompt if tok.is_special(t)] == [fim.prefix, fim.suffix, fim.middle]
    assert prompt[0] == fim.prefix  # no BOS where the file adds none (Qwen's)


def test_the_gguf_keys_come_first_and_bos_where_the_file_adds_it():
    tok, meta = _tok(("<PRE>", "<SUF>", "<MID>", "<EOT>"), bos="<|endoftext|>", add_bos=True)
    tokens = meta["tokenizer.ggml.tokens"]
    meta = {**meta, **{f"tokenizer.ggml.fim_{k}_token_id": tokens.index(t) for k, t in
                       (("pre", "<PRE>"), ("suf", "<SUF>"), ("mid", "<MID>"), ("pad", "<EOT>"))}}
    tok = Tokenizer.from_metadata(meta)
    fim = fim_tokens(tok)
    assert (fim.prefix, fim.suffix, fim.middle) == tuple(tokens.index(t) for t in
                                                         ("<PRE>", "<SUF>", "<MID>"))
    assert fim.ends == {tokens.index("<EOT>")}
    prompt = fim.prompt(tok, "a", "b")
    assert prompt == [tok.bos_id, fim.prefix, *tok.encode("a", add_bos=False), fim.suffix,
                      *tok.encode("b", add_bos=False), fim.middle]
    bad = {**meta, "tokenizer.ggml.fim_mid_token_id": len(tokens) + 5}
    with pytest.raises(TokenizerError, match="fim_mid_token_id"):
        Tokenizer.from_metadata(bad)


def test_a_vocabulary_without_all_three_has_none():
    assert fim_tokens(_tok()[0]) is None
    assert fim_tokens(_tok(("<|fim_prefix|>", "<|fim_suffix|>"))[0]) is None


def test_a_served_code_model_inserts_and_stops_at_a_middles_end():
    tok, meta = _tok(QWEN_FIM)
    served = _served(tok, meta)
    tokens = meta["tokenizer.ggml.tokens"]
    assert {tokens.index("<|fim_pad|>"), tokens.index("<|file_sep|>"),
            tokens.index("<|im_end|>")} <= served.stop_token_ids
    assert served.encode_fim("x = ", "\n") == served.fim.prompt(tok, "x = ", "\n")
    plain = _served(*_tok())
    assert plain.fim is None and plain.stop_token_ids == plain.tokenizer.eot_ids
    with pytest.raises(ApiError) as e:
        plain.encode_fim("x = ", "\n")
    assert e.value.status == 400 and e.value.param == "suffix"
    assert "fill-in-the-middle" in e.value.message


def test_the_start_up_lines_say_what_the_model_can_do():
    """`strata serve`'s start-up lines name XML tool calls and fill-in-the-middle where the
    model has them."""
    from types import SimpleNamespace

    from strata.serve.server import _plan_lines
    shape = SimpleNamespace(arch="qwen3moe", n_layer=2, n_expert=8, n_expert_used=2, n_vocab=300)
    config = SimpleNamespace(model="coder.gguf", batch_invariant=False)
    summary = {"backend": "cpu", "slots": 1, "max_context": 256, "tool_calls_parsed": True,
               "xml_calls": True, "fim": True, "splits_thinking": False, "prefix_cache": True}
    lines = _plan_lines(config, SimpleNamespace(shape=shape), summary, [])
    assert "tools    <tool_call> blocks (XML: <function=...>) parsed into tool calls" in lines
    assert any(line.startswith("insert   fill-in-the-middle") for line in lines)
    plain = _plan_lines(config, SimpleNamespace(shape=shape),
                        {**summary, "xml_calls": False, "fim": False}, [])
    assert "tools    <tool_call> blocks parsed into tool calls" in plain
    assert not any(line.startswith("insert") for line in plain)


def test_other_files_in_the_repository_form_and_the_cut_to_the_room():
    """llama.cpp's /infill prompt over Qwen's tokens: other files as <|repo_name|>project,
    then <|file_sep|>name and text each, and <|file_sep|> before the edited file; cut to the
    room, the files go first, then the prefix's start and the suffix's end (the text nearest
    the cursor stays)."""
    tok, meta = _tok(QWEN_FIM)
    served = _served(tok, meta)
    files = [("a.py", "A = 1\n"), ("b.py", "B = 2\n")]
    ids, cut = served.encode_infill("def f():\n    ", "\nf()\n", files, "return", 10_000)
    assert not cut and tok.decode(ids, skip_special=False) == (
        "<|repo_name|>project\n<|file_sep|>a.py\nA = 1\n<|file_sep|>b.py\nB = 2\n"
        "<|file_sep|>current\n<|fim_prefix|>def f():\n    <|fim_suffix|>\nf()\n"
        "<|fim_middle|>return")
    prefix, suffix = "x" * 40 + "END", "START" + "y" * 40
    whole, _ = served.encode_infill(prefix, suffix, [], "", 10_000)
    for room in (len(whole) - 1, len(whole) - 20, 12):
        ids, cut = served.encode_infill(prefix, suffix, files, "", room)
        text = tok.decode(ids, skip_special=False)
        assert cut and len(ids) <= room and "a.py" not in text
        assert text.index("<|fim_suffix|>") > text.index("<|fim_prefix|>")
        kept_prefix = text.split("<|fim_prefix|>")[1].split("<|fim_suffix|>")[0]
        kept_suffix = text.split("<|fim_suffix|>")[1].split("<|fim_middle|>")[0]
        assert prefix.endswith(kept_prefix) and suffix.startswith(kept_suffix)
    # only the files cut where that is enough
    bare, _ = served.encode_infill("p", "s", [], "", 10_000)
    ids, cut = served.encode_infill("p", "s", files, "", len(bare))
    assert cut and ids == bare
    # no repository tokens: the files' texts as they are
    plain_tok, plain_meta = _tok(QWEN_FIM[:4])
    plain = _served(plain_tok, plain_meta)
    assert plain.fim.repo is None
    ids, _ = plain.encode_infill("p", "s", files, "", 10_000)
    assert plain_tok.decode(ids, skip_special=False) == (
        "A = 1\nB = 2\n<|fim_prefix|>p<|fim_suffix|>s<|fim_middle|>")
