"""SynthConfig: the presets carry the shapes of the foundation issue, and bad shapes are refused."""

from __future__ import annotations

import dataclasses

import pytest

from strata.errors import StrataError
from strata.synth import PRESETS, SynthConfig, SynthError, preset


def test_qwen3_30b_a3b_shape():
    c = PRESETS["qwen3-30b-a3b"]
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == (48, 2048, 32, 4, 128)
    assert (c.n_expert, c.n_expert_used, c.n_ff_expert) == (128, 8, 768)
    assert (c.n_vocab, c.n_ctx_train, c.rope_freq_base, c.rms_norm_eps) == (151936, 40960, 1e6,
                                                                          1e-6)


def test_qwen3_235b_a22b_shape():
    c = PRESETS["qwen3-235b-a22b"]
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim) == (94, 4096, 64, 4, 128)
    assert (c.n_expert, c.n_expert_used, c.n_ff_expert, c.n_vocab) == (128, 8, 1536, 151936)


def test_tiny_avoids_easy_shapes():
    c = PRESETS["tiny"]
    assert c.n_head // c.n_head_kv > 1 and c.n_head_kv > 1  # several kv heads, groups > 1
    assert c.n_expert_used > 2 and c.n_vocab >= 512
    assert c.q_dim != c.n_embd
    assert c.n_ff_expert & (c.n_ff_expert - 1)  # not a power of two
    assert c.n_vocab & (c.n_vocab - 1)


def test_with_layers_changes_depth_only():
    c = PRESETS["qwen3-30b-a3b"]
    s = c.with_layers(3)
    assert s.n_layer == 3 and dataclasses.replace(s, n_layer=48) == c


@pytest.mark.parametrize("change, words", [
    (dict(n_head_kv=5), "must divide n_head"),
    (dict(n_expert_used=9), "exceeds n_expert"),
    (dict(n_embd=250), "multiple of 32"),
    (dict(n_ff_expert=100), "multiple of 32"),
    (dict(head_dim=33, n_head=32), "even"),
    (dict(n_vocab=300), "at least 512"),
    (dict(n_layer=0), "positive integer"),
    (dict(rms_norm_eps=0.0), "positive"),
])
def test_bad_shapes_are_refused(change, words):
    with pytest.raises(SynthError, match=words):
        dataclasses.replace(PRESETS["tiny"], **change)


def test_frozen_and_user_facing_errors():
    c = PRESETS["tiny"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.n_layer = 2  # type: ignore[misc]
    with pytest.raises(StrataError, match="known: tiny"):
        preset("qwen9")
    assert isinstance(preset("tiny"), SynthConfig)
