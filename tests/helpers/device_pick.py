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
    return toks
