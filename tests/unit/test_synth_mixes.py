"""Per-tensor types of each mix, checked against llama.cpp's quantizer rules written out here
as explicit expectations (layer by layer for the 48-layer shape)."""

from __future__ import annotations

import dataclasses

import pytest

from strata.synth import MIXES, PRESETS, SynthError
from strata.synth.mixes import fallback, tensor_type, use_more_bits

Q30 = PRESETS["qwen3-30b-a3b"]
TINY = PRESETS["tiny"]
# llama.cpp's use_more_bits for 48 layers: the first 6, the last 6, and every third in between
MORE_BITS_48 = set(range(6)) | set(range(42, 48)) | {i for i in range(6, 42) if (i - 6) % 3 == 2}


def test_use_more_bits_pattern():
    assert {i for i in range(48) if use_more_bits(i, 48)} == MORE_BITS_48
    assert len(MORE_BITS_48) == 24


def test_q4_k_m_on_qwen3_30b():
    assert tensor_type("Q4_K_M", "token_embd", -1, Q30) == "Q4_K"
    assert tensor_type("Q4_K_M", "output", -1, Q30) == "Q6_K"
    for i in range(48):
        big = "Q6_K" if i in MORE_BITS_48 else "Q4_K"
        assert tensor_type("Q4_K_M", "attn_v", i, Q30) == big
        assert tensor_type("Q4_K_M", "ffn_down_exps", i, Q30) == big
        for role in ("attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps"):
            assert tensor_type("Q4_K_M", role, i, Q30) == "Q4_K"


def test_iq_file_types_on_qwen3_30b():
    assert tensor_type("IQ4_XS", "attn_v", 0, Q30) == "Q5_K"  # n_head / n_head_kv = 8 >= 4
    assert [tensor_type("IQ4_XS", "ffn_down_exps", i, Q30) for i in (5, 6)] == ["Q5_K", "IQ4_XS"]
    assert tensor_type("IQ3_S", "attn_v", 3, Q30) == "Q4_K"
    assert tensor_type("IQ3_S", "ffn_down_exps", 3, Q30) == "IQ3_S"
    assert tensor_type("IQ3_S", "output", -1, Q30) == "Q6_K"
    assert tensor_type("Q4_0", "output", -1, Q30) == "Q6_K"
    assert tensor_type("Q8_0", "output", -1, Q30) == "Q8_0"


def test_eight_expert_rules_and_fallbacks_on_tiny():
    # tiny has exactly 8 experts (llama.cpp's Mixtral rule) and ffn rows of 192 (not 256-blocks)
    assert tensor_type("Q4_K_M", "attn_k", 1, TINY) == "Q8_0"
    assert tensor_type("Q4_K_M", "attn_v", 1, TINY) == "Q8_0"
    assert tensor_type("Q4_K_M", "attn_output", 1, TINY) == "Q5_K"
    assert tensor_type("Q4_0", "attn_output", 1, TINY) == "Q4_0"
    downs = [tensor_type("Q4_K_M", "ffn_down_exps", i, TINY) for i in range(4)]
    assert downs == ["Q8_0" if use_more_bits(i, 4) else "Q5_0" for i in range(4)]
    assert tensor_type("IQ4_XS", "ffn_down_exps", 2, TINY) == "IQ4_NL"
    assert tensor_type("IQ3_S", "ffn_down_exps", 2, TINY) == "IQ4_NL"


@pytest.mark.parametrize("t, row, want", [
    ("Q4_K", 192, "Q5_0"), ("Q5_K", 192, "Q5_1"), ("Q6_K", 192, "Q8_0"),
    ("IQ4_XS", 96, "IQ4_NL"), ("IQ3_S", 96, "IQ4_NL"), ("Q4_K", 16, "F16"), ("Q4_K", 512, "Q4_K"),
])
def test_fallback_table(t, row, want):
    assert fallback(t, row) == want


def test_output_of_odd_width_is_q8_0():
    odd = dataclasses.replace(Q30, n_embd=2080)  # 2080 % 256 != 0
    assert tensor_type("Q4_K_M", "output", -1, odd) == "Q8_0"
    assert tensor_type("Q4_K_M", "token_embd", -1, odd) == "Q5_0"


def test_custom_mixes_cover_their_formats_in_tiny():
    roles = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_exps", "ffn_up_exps",
             "ffn_down_exps")
    iq = {tensor_type("IQ_MIX", r, 0, TINY) for r in roles + ("token_embd", "output")}
    assert iq == {"IQ4_NL", "IQ3_S", "IQ4_XS"}
    experts = {tensor_type("IQ_MIX", r, 0, TINY) for r in roles[4:]}
    assert experts == {"IQ4_NL", "IQ3_S", "IQ4_XS"}
    legacy = {tensor_type("LEGACY_MIX", r, 0, TINY) for r in roles + ("token_embd", "output")}
    assert legacy == {"Q5_0", "Q4_0", "F16", "Q8_0"}


@pytest.mark.parametrize("mix", MIXES)
def test_norms_and_router_stay_f32(mix):
    for role in ("attn_norm", "attn_q_norm", "attn_k_norm", "ffn_norm", "ffn_gate_inp",
                 "output_norm"):
        assert tensor_type(mix, role, 0, TINY) == "F32"


def test_f16_mix_and_unknown_mix():
    assert tensor_type("F16", "ffn_down_exps", 0, TINY) == "F16"
    with pytest.raises(SynthError, match="unknown quantization mix 'Q3_K_L'"):
        tensor_type("Q3_K_L", "attn_q", 0, TINY)
