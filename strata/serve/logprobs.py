"""Log-probabilities in the OpenAI shapes: a chat choice's `logprobs.content` entries, and the
legacy completion's parallel lists (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`);
and in llama.cpp's server's (`completion_probabilities`, each entry with its token id).

The worker reports token ids and numbers (`TokenLogprob`); the text of each token is looked up
here, on the HTTP side (`token_piece`: the token's bytes, shown as text with a replacement
character where a token holds part of a UTF-8 character, as OpenAI's `bytes` field exists for).
"""

from __future__ import annotations

from typing import Protocol, Sequence

from strata.serve.job import TokenLogprob


class PieceModel(Protocol):
    def token_piece(self, token: int) -> tuple[str, bytes]: ...


def _one(model: PieceModel, token: int, logprob: float) -> dict:
    text, data = model.token_piece(token)
    return {"token": text, "logprob": logprob, "bytes": list(data)}


def chat_content(model: PieceModel, entries: Sequence[TokenLogprob]) -> list[dict]:
    """`choices[].logprobs.content`: one object per token, its alternatives under
    `top_logprobs` (an empty list where none were asked for)."""
    return [{**_one(model, e.token, e.logprob),
             "top_logprobs": [_one(model, t, lp) for t, lp in e.top]} for e in entries]


def llama_probs(model: PieceModel, entries: Sequence[TokenLogprob]) -> list[dict]:
    """llama.cpp's `completion_probabilities` (its `n_probs`): per token its `id`, `token`,
    `bytes` and `logprob`, the most likely tokens at its position under `top_logprobs` in the
    same shape."""
    def one(token: int, logprob: float) -> dict:
        return {"id": token, **_one(model, token, logprob)}
    return [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
            for e in entries]


def chat_logprobs(model: PieceModel, entries: Sequence[TokenLogprob] | None) -> dict | None:
    """A chat choice's (or chunk's) `logprobs`; None where the request asked for none."""
    if entries is None:
        return None
    return {"content": chat_content(model, entries), "refusal": None}


class CompletionLogprobs:
    """The legacy completion's `logprobs` for successive pieces of one choice's text: each
    token's `text_offset` counts on from the text before it (across the chunks of a stream)."""

    def __init__(self, model: PieceModel, offset: int = 0):
        self.model = model
        self.offset = offset

    def take(self, entries: Sequence[TokenLogprob]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [],
                                "text_offset": []}
        for e in entries:
            text, _ = self.model.token_piece(e.token)
            out["tokens"].append(text)
            out["token_logprobs"].append(e.logprob)
            # keyed by text, as the legacy API is: two tokens that print alike share a key
            top: dict[str, float] = {}
            for t, lp in e.top:  # most likely first: that one keeps a shared key
                top.setdefault(self.model.token_piece(t)[0], lp)
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out
