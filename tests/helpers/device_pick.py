"""`generate` on a CUDA engine two ways, for the engines' simulator tests: each token picked
and fed on the device (`device_tokens`) and the host choosing from every step's logits
(`generation.DEVICE_PICK = False`)."""

from __future__ import annotations

import numpy as np


def check_device_generate(eng, prompt: list[int]) -> list[int]:
    """Greedy `generate` both ways: the same three tokens and the same n_past after. Then a stop
    at the second token takes back the step run ahead of it, and the sequence goes on from there
    (the stop token fed: the third token next). Returns the three tokens."""
    import strata.engine.generation as generation
    from strata.engine import Sampler, SamplingParams, generate

    greedy = SamplingParams(temperature=0)
    on_device = generate(eng, prompt, n_predict=3, sampler=Sampler(greedy))
    n_device = eng.n_past
    generation.DEVICE_PICK = False
    try:
        on_host = generate(eng, prompt, n_predict=3, sampler=Sampler(greedy))
    finally:
        generation.DEVICE_PICK = True
    toks = on_host.tokens
    assert on_device.tokens == toks and n_device == eng.n_past == len(prompt) + 2
    stopped = generate(eng, prompt, n_predict=5, sampler=Sampler(greedy), stop_ids={toks[1]})
    assert stopped.tokens == toks[:2] and stopped.stop_reason == "stop"
    assert eng.n_past == len(prompt) + 1
    assert int(np.argmax(eng.decode_step(toks[1]))) == toks[2]
    # greedy with penalties: the device runs the sampler (the argmax kernel would drop them) and
    # its window is the sequence's, prompt included, as the host's; a large negative frequency
    # penalty makes the prompt's tokens win, so the penalty, not the logits, decides
    penalised = SamplingParams(temperature=0, frequency_penalty=-30.0, presence_penalty=0.5,
                               repeat_penalty=1.25)
    on_device = generate(eng, prompt, n_predict=3, sampler=Sampler(penalised))
    generation.DEVICE_PICK = False
    try:
        on_host = generate(eng, prompt, n_predict=3, sampler=Sampler(penalised))
    finally:
        generation.DEVICE_PICK = True
    assert on_device.tokens == on_host.tokens != toks
    assert on_host.tokens[0] in prompt
    return toks


def check_nan_refused(eng, prompt: list[int], norm, want: list[int]) -> None:
    """With the output norm's weights (`norm`, the device array) NaN, every logit is NaN:
    `generate` on the device refuses the first token, as the host's `Sampler` does, and so does
    `decode_tokens`; with the weights put back, `generate` gives `want` again (the flag the
    refusal read is cleared)."""
    import pytest

    import strata.engine.generation as generation
    from strata.engine import Sampler, SamplingParams, generate

    greedy = SamplingParams(temperature=0)
    saved = norm.copy_to_host()
    norm.copy_to_device(np.full(saved.shape, np.nan, np.float32))
    try:
        for on_device in (True, False):
            generation.DEVICE_PICK = on_device
            with pytest.raises(ValueError, match="NaN"):
                generate(eng, prompt, n_predict=3, sampler=Sampler(greedy))
        generation.DEVICE_PICK = True
        eng.reset()
        eng.prefill(prompt)
        with pytest.raises(ValueError, match="NaN"):
            eng.decode_tokens(2)
    finally:
        generation.DEVICE_PICK = True
        norm.copy_to_device(saved)
    assert generate(eng, prompt, n_predict=3, sampler=Sampler(greedy)).tokens == want
