"""Fill-in-the-middle: the three tokens a code model was trained to complete the text between a
prefix and a suffix with (prefix, suffix, middle), the prompt they make, and the tokens that end
such an answer.

The ids come from the GGUF keys llama.cpp's converter writes for code models
(`tokenizer.ggml.fim_pre_token_id`, ...; `strata.tokenizer.vocab`), else from the spellings
of the families that use them, found in the vocabulary. The prompt is in prefix-suffix-middle
order, the order these models were trained on most: [BOS where the file adds one]
<prefix> prefix <suffix> suffix <middle>, the model then writing the middle.
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.tokenizer.tokenizer import Tokenizer

# (prefix, suffix, middle) spellings, tried in turn where the file names no ids
SPELLINGS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Codestral-style vocabularies
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>",
     "<\uff5cfim\u2581end\uff5c>"),  # DeepSeek-Coder
)
# tokens that end a middle besides the end-of-turn ones: a padding or a repository-format token
# written after it (llama.cpp's end-of-generation set holds these too)
END_SPELLINGS = frozenset({"<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<fim_pad>",
                           "<file_sep>", "<reponame>", "<filename>"})


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle ids; `ends`: the ids besides its end-of-turn ones that
    end a middle."""

    prefix: int
    suffix: int
    middle: int
    ends: frozenset[int] = frozenset()

    def prompt(self, tok: Tokenizer, prefix: str, suffix: str) -> list[int]:
        """The prompt that asks for the text between `prefix` and `suffix`: each encoded as
        text (a special token's spelling in the code stays text), BOS first where the file
        adds one."""
        bos = [tok.bos_id] if tok.vocab.add_bos and tok.bos_id is not None else []
        return (bos + [self.prefix] + tok.encode(prefix, add_bos=False, parse_special=False)
                + [self.suffix] + tok.encode(suffix, add_bos=False, parse_special=False)
                + [self.middle])


def fim_tokens(tok: Tokenizer) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens, or None where it has not all three."""
    v = tok.vocab
    ids = (v.fim_pre_id, v.fim_suf_id, v.fim_mid_id)
    if None in ids:
        index = {t: i for i, t in enumerate(v.tokens) if t.startswith("<")}
        ids = next((tuple(index[s] for s in spelled) for spelled in SPELLINGS
                    if all(s in index for s in spelled)), (None, None, None))
        if None in ids:
            return None
    ends = {i for i in (v.fim_pad_id, v.fim_rep_id, v.fim_sep_id) if i is not None}
    ends |= {i for i, t in enumerate(v.tokens) if t in END_SPELLINGS}
    return FimTokens(*ids, ends=frozenset(ends))
