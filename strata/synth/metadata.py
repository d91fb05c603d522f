"""The key/value metadata of a synthetic model: llama.cpp's qwen3moe keys, the tokenizer, and
`strata.synth.*` keys describing how the file was made (the routing profile above all)."""

from __future__ import annotations

import gguf
from gguf import GGUFValueType

from strata.synth.config import SynthConfig
from strata.synth.mixes import FILE_TYPES
from strata.synth.routing import RoutingDesign
from strata.synth.vocab import CHAT_TEMPLATE, Vocab

ARCH = "qwen3moe"
KEY_PRESET = "strata.synth.preset"
KEY_MIX = "strata.synth.mix"
KEY_SEED = "strata.synth.seed"
KEY_SKEW = "strata.synth.skew"
KEY_EXPERT_RANK = "strata.synth.expert_rank"  # [n_layer * n_expert]: expert id, row-major by
#                                               (layer, rank); rank 0 is the most selected
KEY_EXPERT_SHARE = "strata.synth.expert_share"  # [n_expert]: intended share of selections by rank
KEY_ROUTING_DIMS = "strata.synth.routing_dims"  # hidden dims reserved for routing
KEY_HEADER_ONLY = "strata.synth.header_only"


def _arch_keys(w: gguf.GGUFWriter, cfg: SynthConfig) -> None:
    k = ARCH + "."
    for key, val in (("block_count", cfg.n_layer), ("context_length", cfg.n_ctx_train),
                     ("embedding_length", cfg.n_embd), ("attention.head_count", cfg.n_head),
                     ("attention.head_count_kv", cfg.n_head_kv),
                     ("attention.key_length", cfg.head_dim),
                     ("attention.value_length", cfg.head_dim), ("expert_count", cfg.n_expert),
                     ("expert_used_count", cfg.n_expert_used),
                     ("expert_feed_forward_length", cfg.n_ff_expert)):
        w.add_uint32(k + key, val)
    w.add_float32(k + "rope.freq_base", cfg.rope_freq_base)
    w.add_float32(k + "attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)


def _tokenizer_keys(w: gguf.GGUFWriter, vocab: Vocab) -> None:
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(list(vocab.tokens))
    w.add_token_types(list(vocab.token_types))
    w.add_token_merges(list(vocab.merges))
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_eot_token_id(vocab.eot_id)
    w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


def _array(w: gguf.GGUFWriter, key: str, values, sub: GGUFValueType) -> None:
    w.add_key_value(key, list(values), GGUFValueType.ARRAY, sub_type=sub)


def add_metadata(w: gguf.GGUFWriter, cfg: SynthConfig, *, mix: str, seed: int,
                 rd: RoutingDesign, vocab: Vocab, header_only: bool) -> None:
    """Every key of a synthetic model's header."""
    w.add_name(f"strata synthetic {cfg.name} {mix}")
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if mix in FILE_TYPES:
        w.add_file_type(FILE_TYPES[mix])
    _arch_keys(w, cfg)
    _tokenizer_keys(w, vocab)
    w.add_string(KEY_PRESET, cfg.name)
    w.add_string(KEY_MIX, mix)
    w.add_uint32(KEY_SEED, seed & 0xFFFFFFFF)
    w.add_float32(KEY_SKEW, rd.skew)
    _array(w, KEY_EXPERT_RANK, (int(e) for e in rd.ranks.ravel()), GGUFValueType.UINT32)
    _array(w, KEY_EXPERT_SHARE, (float(s) for s in rd.shares), GGUFValueType.FLOAT32)
    _array(w, KEY_ROUTING_DIMS, (int(d) for d in rd.dims), GGUFValueType.UINT32)
    w.add_bool(KEY_HEADER_ONLY, header_only)
