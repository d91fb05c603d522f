"""`strata.bench.chat_turns` over a fake engine that keeps a released row's KV as the CUDA batch
engine does: the turns' prompts are the whole history, both runs are fed the same prompts, the
run with reuse reports the tokens the engine found (everything before the turn's new tokens,
less the answer's last token, which no step fed), and bad arguments are refused."""

from __future__ import annotations

import numpy as np
import pytest

from strata.bench import chat_turns

N_VOCAB = 50


class KeepingEngine:
    """One slot; logits one-hot at a function of the fed tokens; `release(slot, tokens)` keeps
    what the row's KV holds of them, and a prefill reuses the longest common prefix (at most
    all but the prompt's last token, as the CUDA engine computes at least one)."""

    n_slots = 1
    keeps_prefix = True

    def __init__(self, max_context: int = 512):
        self.max_context = max_context
        self.n_vocab = N_VOCAB
        self.fed: list[int] = []
        self.kept: list[int] | None = None
        self.n_reused = 0
        self.prefills: list[tuple[int, int]] = []  # (prompt length, reused)

    def _logits(self) -> np.ndarray:
        out = np.zeros(N_VOCAB, np.float32)
        out[(7 * sum(self.fed[-3:]) + len(self.fed)) % N_VOCAB] = 1.0
        return out

    def prefill(self, slot, tokens, reuse=True):
        tokens = [int(t) for t in tokens]
        common = 0
        if self.kept is not None and reuse:
            while (common < min(len(self.kept), len(tokens) - 1)
                   and self.kept[common] == tokens[common]):
                common += 1
        self.n_reused, self.fed, self.kept = common, tokens, None
        self.prefills.append((len(tokens), common))
        return self._logits()

    def decode(self, slots, tokens):
        self.fed.append(int(tokens[0]))
        return self._logits()[None, :]

    def release(self, slot, tokens=None):
        n = len(self.fed)
        self.kept = [int(t) for t in tokens[:n]] if tokens is not None and len(tokens) >= n \
            else None


def test_turns_feed_the_history_and_report_the_reused_tokens():
    engine = KeepingEngine()
    res = chat_turns.measure(engine, system=20, turns=3, user=5, answer=4, seed=3)
    rows, whole, reuse = res["turns"], res["whole"], res["reuse"]
    assert [r["prompt_tokens"] for r in rows] == [25, 34, 43]  # + 4 answer + 5 user a turn
    assert [r["prompt_tokens"] for r in reuse] == [r["prompt_tokens"] for r in whole]
    # turn 1 finds nothing (the warm-up's tokens differ); then all but the new user tokens and
    # the previous answer's last token (sampled, never fed)
    assert [r["cached_tokens"] for r in rows] == [0, 25 + 3, 34 + 3]
    assert [r["cached_tokens"] for r in whole] == [0, 0, 0]
    # the fake's logits depend only on the tokens: both runs answer alike
    assert all(r["answer_tokens_equal_before_first_difference"] == 4 for r in rows)
    assert all(w["answer"] == r["answer"] and len(w["answer"]) == 4
               for w, r in zip(whole, reuse))
    assert all(r["ttft_whole_ms"] > 0 and r["ttft_reuse_ms"] > 0 for r in rows)
    text = chat_turns.table(rows)
    assert text.splitlines()[2].split()[:3] == ["2", "34", "28"]


def test_a_turn_past_the_context_is_refused_before_it_is_submitted():
    engine = KeepingEngine(max_context=36)
    with pytest.raises(ValueError, match="turn 2: 34 prompt tokens \\+ 4 answer tokens exceed"):
        chat_turns.run_turns(engine, list(range(1, 21)), [[1] * 5, [2] * 5], 4,
                             prefix_cache=True)


@pytest.mark.parametrize("argv, msg", [
    (["--turns", "0"], "need --turns >= 1"),
    (["--answer-tokens", "1"], "need --turns >= 1"),
    (["--user-tokens", "-1"], "--user-tokens must be >= 0"),
    (["--system-tokens", "4096", "--max-context", "2048"], "needs 4608 tokens of context"),
    (["--backend", "cpu", "--gpu-mem", "8GiB"], "applies to --backend cuda only"),
])
def test_bad_arguments_are_refused_by_name(argv, msg, capsys):
    with pytest.raises(SystemExit):
        chat_turns.main(["-m", "unused.gguf"] + argv)
    assert msg in capsys.readouterr().err
