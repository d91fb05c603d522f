"""A chat held on one engine turn by turn (`strata generate --interactive`): each turn's prompt is
the whole conversation through the model's chat template, and only what the engine's KV does not
already hold is computed.

After a turn the engine holds the turn's prompt and the reply it generated, all but the reply's
last token (sampled, never fed). The next turn's prompt renders the reply back through the
template, which may tokenize it differently from how it was generated (a template that strips
the reply, or re-encodes it): `common_prefix` keeps only what matches, so a difference costs
recomputing from there, never a wrong token.
"""

from __future__ import annotations

from typing import Sequence

from strata.engine.engine import common_prefix


class Conversation:
    """Messages so far, and the tokens whose KV the engine holds for them (`kept`)."""

    def __init__(self, template, tokenizer, *, system: str | None = None,
                 can_rewind: bool = True) -> None:
        self.template, self.tokenizer = template, tokenizer
        self.system = system
        self.can_rewind = can_rewind  # the engine keeps positions (`Engine.rewind`)
        self.messages: list[dict] = []
        self.kept: list[int] = []
        self.clear()

    def clear(self) -> None:
        """Start over: no messages but the system prompt, nothing kept."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.kept = []

    def prompt(self, user: str) -> tuple[list[int], int]:
        """(the next turn's prompt tokens with `user` said, how many leading ones the engine
        keeps). The message is not added until `answered`: a turn that fails leaves the
        conversation as it was."""
        text = self.template.render(self.messages + [{"role": "user", "content": user}],
                                    add_generation_prompt=True)
        tokens = self.tokenizer.encode(text)
        reuse = common_prefix(self.kept, tokens) if self.can_rewind else 0
        return tokens, reuse

    def answered(self, user: str, prompt: Sequence[int], reply_tokens: Sequence[int],
                 reply_text: str) -> None:
        """Record a finished turn: `prompt` went in, `reply_tokens` came out (their last one
        sampled, not fed: the engine holds the prompt and the others)."""
        self.messages += [{"role": "user", "content": user},
                          {"role": "assistant", "content": reply_text}]
        self.kept = list(prompt) + list(reply_tokens[:-1])
