"""Test doubles for the serve layer: a character-level model whose answers are scripted, and
a batch engine that plays them back token by token (one-hot logits).

Token ids are Unicode code points below 256 (so text round-trips exactly); id 256 is the
end-of-turn token. The engine records every call so tests can check batching and cancellation.
"""

from __future__ import annotations

import json

import threading
from typing import Callable, Sequence

import numpy as np

from strata.engine.interrupt import checkpoint
from strata.engine.json_constraint import TokenBytes
from strata.engine.sampler import Sampler, SamplingParams
from strata.serve.errors import bad_request
from strata.serve.model import make_constraint
from strata.serve.job import Sampling

EOT = 256
N_VOCAB = 257
FIM_MARKS = "\x01\x02\x03"  # the fake vocabulary's fill-in-the-middle prefix, suffix, middle
TOKEN_BYTES = TokenBytes([chr(t).encode("utf-8") for t in range(EOT)] + [None])


def encode(text: str) -> list[int]:
    return [min(ord(c), 255) for c in text]


def render(messages: list[dict], tools: list[dict] | None) -> str:
    """A ChatML-like rendering, tools listed in the system part as Qwen's template does."""
    out = []
    if tools:
        names = ",".join(t["function"]["name"] for t in tools)
        out.append(f"<tools>{names}</tools>")
    for m in messages:
        calls = "".join(f"<tool_call>{c['function']['name']}</tool_call>"
                        for c in m.get("tool_calls", []))
        thought = f"[{m['reasoning_content']}]" if m.get("reasoning_content") else ""
        out.append(f"<{m['role']}>{thought}{m['content']}{calls}")
    return "".join(out) + "<assistant>"


class FakeText:
    def push(self, token: int) -> str:
        return chr(token)

    def flush(self) -> str:
        return ""


class FakeModel:
    """The `ServedModel` surface over the character vocabulary."""

    def __init__(self, *, max_context: int = 4096, name: str = "fake", tool_calls: bool = True):
        self.name = name
        self.aliases = ("fake-alias",)
        self.max_context = max_context
        self.n_vocab = N_VOCAB
        self.tool_calls_parsed = tool_calls
        self.xml_calls = False  # a test of Qwen3-Coder's call form sets it
        self.splits_thinking = False  # a test of the reasoning split sets it
        self.stop_token_ids = frozenset({EOT})
        self.rendered: list[str] = []
        self.fim = True

    def render_chat(self, messages: list[dict], tools: list[dict] | None,
                    extra: dict | None = None) -> str:
        if messages[-1]["role"] == "assistant":
            raise bad_request("the conversation must not end with an assistant turn", "messages")
        text = render(messages, tools)
        if extra:  # the variables a request set, where a test can see them
            text += "".join(f"<{k}={json.dumps(v)}>" for k, v in sorted(extra.items()))
        self.rendered.append(text)
        return text

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def encode_prompt(self, text: str, *, special: bool = True) -> list[int]:
        return encode(text)  # the character vocabulary has no BOS

    def encode_fim(self, prefix: str, suffix: str, param: str = "suffix") -> list[int]:
        """Fill-in-the-middle over the characters: FIM_MARKS stand for the three tokens (a
        test sets `fim` False for a model without them)."""
        if not self.fim:
            raise bad_request(f"{param}: no fill-in-the-middle tokens", param)
        pre, suf, mid = map(ord, FIM_MARKS)
        return [pre] + encode(prefix) + [suf] + encode(suffix) + [mid]

    def encode_infill(self, prefix: str, suffix: str, files, middle: str,
                      room: int) -> tuple[list[int], bool]:
        """The infill prompt over the characters: each other file as "#name\n" and its text,
        then `encode_fim`'s, then `middle`; the prefix's start cut where it does not fit."""
        head = [c for name, text in files for c in encode(f"#{name}\n{text}")]
        ids = head + self.encode_fim(prefix, suffix, "input_suffix") + encode(middle)
        over = len(ids) - room
        if over <= 0:
            return ids, False
        return head + self.encode_fim(prefix[over:], suffix, "input_suffix") + encode(middle), True

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return "".join("<eot>" if i == EOT else chr(i) for i in ids
                       if i != EOT or not skip_special)

    def sampler(self, sampling: Sampling) -> Callable[[np.ndarray], int]:
        constraint = make_constraint(sampling, lambda: (TOKEN_BYTES, frozenset({EOT})))
        if constraint is not None:  # the real constraint over the character vocabulary
            return Sampler(SamplingParams(temperature=0.0), constraint)
        return lambda logits: int(np.argmax(logits))

    def token_piece(self, token: int) -> tuple[str, bytes]:
        text = "" if token == EOT else chr(token)
        return text, text.encode("utf-8")

    def text_stream(self, after: int) -> FakeText:
        return FakeText()


class ScriptedEngine:
    """A `BatchEngine` whose slot answers `script(prompt_text)`, then the end-of-turn token.
    `gate`, when set, is a semaphore every decode step takes one permit from (so a test can
    hold sequences mid-flight and let them advance step by step)."""

    def __init__(self, script: Callable[[str], str], *, n_slots: int = 1,
                 max_context: int = 4096):
        self.script = script
        self.n_slots = n_slots
        self.max_context = max_context
        self._answer: dict[int, list[int]] = {}
        self._pos: dict[int, int] = {}
        self.prefills: list[str] = []  # prompt texts, in admission order
        self.decode_batches: list[tuple[int, ...]] = []  # slots of each decode step
        self.released: list[int] = []
        self.gate: threading.Semaphore | None = None
        self.fail_prefill_on: str | None = None  # a prompt substring that makes prefill raise
        # a prompt holding "LONG" is prefilled a character a chunk, with `checkpoint()` between
        # (`strata.engine.interrupt`); after its first chunk it sets `in_prompt` and waits for
        # `go_on` (a test cancels it there); `chunks_run` counts its chunks
        self.in_prompt, self.go_on = threading.Event(), threading.Event()
        self.chunks_run = 0

    def _logits(self, slot: int) -> np.ndarray:
        answer, pos = self._answer[slot], self._pos[slot]
        row = np.zeros(N_VOCAB, np.float32)  # [n_vocab] f32 one-hot
        row[answer[pos] if pos < len(answer) else EOT] = 1.0
        return row

    def prefill(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        text = "".join(chr(t) for t in tokens)
        if self.fail_prefill_on is not None and self.fail_prefill_on in text:
            raise RuntimeError("scripted prefill failure")
        if "LONG" in text:
            for i in range(len(text)):
                if i:
                    checkpoint()
                self.chunks_run += 1
                if i == 0:
                    self.in_prompt.set()
                    if not self.go_on.wait(10):
                        raise TimeoutError("the test never let the prompt go on")
        self.prefills.append(text)
        self._answer[slot] = encode(self.script(text))
        self._pos[slot] = 0
        return self._logits(slot)

    def decode(self, slots: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        if self.gate is not None:
            if not self.gate.acquire(timeout=10):
                raise TimeoutError("the test never released the decode gate")
        self.decode_batches.append(tuple(slots))
        rows = []
        for s in slots:
            self._pos[s] += 1
            rows.append(self._logits(s))
        return np.stack(rows)

    def release(self, slot: int) -> None:
        self.released.append(slot)
