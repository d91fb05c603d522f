"""A chat held turn by turn on one engine (`strata.engine.conversation`, `generate(reuse=...)`):
a turn computes only what its prompt adds to what the engine holds, and gives the tokens of the
whole conversation computed afresh; what cannot be reused is refused, not guessed."""

from __future__ import annotations

import numpy as np
import pytest

from helpers.engine_models import model_path
from strata.engine import Sampler, SamplingParams, generate
from strata.engine.conversation import Conversation
from strata.gguf import open_model
from strata.tokenizer import ChatTemplate, Tokenizer

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def chat(tmp_models):
    from strata.engine.cpu import CpuEngine

    mf = open_model(model_path(tmp_models, "Q8_0"))
    tok = Tokenizer.from_metadata(mf.metadata)
    return mf, tok, ChatTemplate.from_metadata(mf.metadata, tok), CpuEngine(mf, max_context=256)


def _turn(engine, tok, prompt, reuse, n=6):
    return generate(engine, prompt, n_predict=n, sampler=Sampler(GREEDY), stop_ids=tok.eot_ids,
                    text=tok.stream_decoder(after=prompt[-1]), keep_logits=True, reuse=reuse)


def test_a_second_turn_reuses_the_first_and_equals_it_computed_afresh(chat):
    mf, tok, template, engine = chat
    from strata.engine.cpu import CpuEngine

    conv = Conversation(template, tok, system="Be brief.")
    p1, r1 = conv.prompt("Hello there")
    assert r1 == 0 and p1 == tok.encode(template.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        add_generation_prompt=True))
    g1 = _turn(engine, tok, p1, r1)
    conv.answered("Hello there", p1, g1.tokens, g1.text)
    assert conv.kept == p1 + g1.tokens[:-1] and engine.n_past == len(conv.kept)
    assert [m["role"] for m in conv.messages] == ["system", "user", "assistant"]

    p2, r2 = conv.prompt("And then?")
    assert 0 < r2 <= len(conv.kept) and p2[:r2] == conv.kept[:r2]
    g2 = _turn(engine, tok, p2, r2)
    assert g2.reused_tokens == r2 and g2.prompt_tokens == len(p2)
    fresh = _turn(CpuEngine(mf, max_context=256), tok, p2, 0)
    assert g2.tokens == fresh.tokens
    np.testing.assert_allclose(g2.logits, fresh.logits, rtol=0, atol=1e-4)

    conv.clear()
    assert conv.messages == [{"role": "system", "content": "Be brief."}] and conv.kept == []
    assert conv.prompt("Hello there") == (p1, 0)


def test_reuse_is_refused_where_it_cannot_hold(chat):
    _, tok, _, engine = chat
    prompt = [1, 2, 3]
    with pytest.raises(ValueError, match="fewer than the prompt's 3"):
        _turn(engine, tok, prompt, 3)
    engine.reset()
    with pytest.raises(ValueError, match="cannot keep 2 positions of a 0-position"):
        _turn(engine, tok, prompt, 2)

    class NoRewind:
        backend = "scripted"
    with pytest.raises(ValueError, match="scripted engine cannot keep"):
        generate(NoRewind(), prompt, n_predict=1, sampler=Sampler(GREEDY), reuse=1)
    # an engine that keeps nothing reuses nothing: the conversation computes every token
    conv = Conversation(chat[2], tok, can_rewind=False)
    conv.kept = [1, 2, 3]
    assert conv.prompt("hi")[1] == 0
