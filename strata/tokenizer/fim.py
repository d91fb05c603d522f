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
# (repository name, file separator) spellings: Qwen2.5-Coder's, StarCoder2's
REPO_SPELLINGS = (("<|repo_name|>", "<|file_sep|>"), ("<reponame>", "<file_sep>"))
# tokens that end a middle besides the end-of-turn ones: a padding or a repository-format token
# written after it (llama.cpp's end-of-generation set holds these too)
END_SPELLINGS = frozenset({"<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<fim_pad>",
                           "<file_sep>", "<reponame>", "<filename>"})
KNOWN_SPELLINGS = END_SPELLINGS.union(*SPELLINGS, *REPO_SPELLINGS)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle ids; `ends`: the ids besides its end-of-turn ones that
    end a middle; `repo`, `file_sep`: the repository-level tokens (Qwen2.5-Coder's
    `<|repo_name|>`, `<|file_sep|>`) where it has both, for other files' text before the
    prefix (`infill`)."""

    prefix: int
    suffix: int
    middle: int
    ends: frozenset[int] = frozenset()
    repo: int | None = None
    file_sep: int | None = None

    def prompt(self, tok: Tokenizer, prefix: str, suffix: str) -> list[int]:
        """The prompt that asks for the text between `prefix` and `suffix`: each encoded as
        text (a special token's spelling in the code stays text), BOS first where the file
        adds one."""
        return self.infill(tok, _text(tok, prefix), _text(tok, suffix))

    def infill(self, tok: Tokenizer, prefix: list[int], suffix: list[int],
               files: list[tuple[list[int], list[int]]] = (), middle: list[int] = ()
               ) -> list[int]:
        """The prompt from encoded pieces: other files' (name, text) first (in the repository
        form where the vocabulary has it: <repo>project, then <file_sep>name, text each, and
        <file_sep> before the file being edited; else their texts as they are), then
        <prefix> prefix <suffix> suffix <middle> and `middle`, the text the answer continues."""
        out = [tok.bos_id] if tok.vocab.add_bos and tok.bos_id is not None else []
        if files and self.repo is not None and self.file_sep is not None:
            out += [self.repo] + _text(tok, f"{REPO_NAME}\n")
            for name, text in files:
                out += [self.file_sep] + name + _text(tok, "\n") + text
            out += [self.file_sep] + _text(tok, f"{CURRENT_FILE}\n")
        else:
            for _, text in files:
                out += text
        return out + [self.prefix, *prefix, self.suffix, *suffix, self.middle, *middle]

    def infill_within(self, tok: Tokenizer, prefix: list[int], suffix: list[int],
                      files: list[tuple[list[int], list[int]]], middle: list[int], room: int
                      ) -> tuple[list[int], bool]:
        """`infill`'s prompt cut to `room` tokens where it can be, and whether it was: other
        files go first (the earliest first), then the prefix loses its start and the suffix its
        end, three quarters of what is left kept for the prefix (the text nearest the insertion
        stays). Where even the tags and `middle` exceed the room, the prompt as it is: the
        caller's error."""
        files, cut = list(files), False
        ids = self.infill(tok, prefix, suffix, files, middle)
        while len(ids) > room and files:
            files.pop(0)
            cut = True
            ids = self.infill(tok, prefix, suffix, files, middle)
        left = len(prefix) + len(suffix) - (len(ids) - room)  # the code's tokens that fit
        if len(ids) > room and left >= 0:
            keep_suffix = min(len(suffix), max(left // 4, left - len(prefix)))
            keep_prefix = left - keep_suffix
            ids = self.infill(tok, prefix[len(prefix) - keep_prefix:], suffix[:keep_suffix],
                              files, middle)
            cut = True
        return ids, cut


# the repository-level form's names where the request gives none (llama.cpp's /infill gives
# neither the project's name nor the edited file's)
REPO_NAME = "project"
CURRENT_FILE = "current"


def _text(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_bos=False, parse_special=False)


def fim_tokens(tok: Tokenizer) -> FimTokens | None:
    """The vocabulary's fill-in-the-middle tokens, or None where it has not all three (one
    pass over the vocabulary for every spelling, where the file's keys name no ids)."""
    v = tok.vocab
    index = {t: i for i, t in enumerate(v.tokens) if t in KNOWN_SPELLINGS}

    def spelled(groups: tuple[tuple[str, ...], ...]) -> tuple[int, ...] | None:
        return next((tuple(index[t] for t in g) for g in groups if all(t in index for t in g)),
                    None)
    ids = (v.fim_pre_id, v.fim_suf_id, v.fim_mid_id)
    if None in ids:
        ids = spelled(SPELLINGS)
        if ids is None:
            return None
    ends = {i for i in (v.fim_pad_id, v.fim_rep_id, v.fim_sep_id) if i is not None}
    ends |= {index[t] for t in END_SPELLINGS if t in index}
    repo, sep = v.fim_rep_id, v.fim_sep_id
    if repo is None or sep is None:
        repo, sep = spelled(REPO_SPELLINGS) or (None, None)
    return FimTokens(*ids, ends=frozenset(ends), repo=repo, file_sep=sep)
