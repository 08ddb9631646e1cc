"""Configs: the shapes users' config.json files come in parse to the same frozen config, derived sizes are
right, and every inconsistent field fails with a ConfigError naming the field and its value."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig, RopeConfig, resolve_aux_layer_ids
from sglang_eagle3.testing import tiny_config, tiny_draft_config

# config.json of deepseek-ai/DeepSeek-V3 (fields the model reads; values as published).
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4,
    "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
    "rms_norm_eps": 1e-6, "max_position_embeddings": 163840, "rope_theta": 10000, "moe_layer_freq": 1,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "num_nextn_predict_layers": 1,
}

# Kimi-K2.5's outer config: the language model (DeepSeek-V3 architecture) under text_config, INT4 experts.
KIMI_K25 = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": {**DEEPSEEK_V3, "vocab_size": 163840, "num_attention_heads": 64, "n_routed_experts": 384,
                    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "routed_scaling_factor": 2.827,
                    "max_position_embeddings": 262144, "rope_theta": 50000.0, "eos_token_id": 163586,
                    "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 64.0, "mscale": 1.0,
                                     "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                     "type": "yarn"}},
    "vision_config": {"hidden_size": 1152},
    "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
                            "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int",
                                                                      "symmetric": True, "group_size": 32}}}},
}

EAGLE3_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
    "intermediate_size": 18432, "num_attention_heads": 56, "num_key_value_heads": 8, "vocab_size": 163840,
    "draft_vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 8192,
    "num_hidden_layers": 1, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]},
}


def test_deepseek_v3_derived_sizes():
    cfg = ModelConfig.from_hf(DEEPSEEK_V3)
    assert cfg.qk_head_dim == 192 and cfg.kv_cache_dim == 576
    assert cfg.rope == RopeConfig(theta=10000.0, kind="yarn", factor=40.0, original_max_position_embeddings=4096,
                                  beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    m = 0.1 * 1.0 * math.log(40) + 1.0
    assert cfg.softmax_scale == pytest.approx(192 ** -0.5 * m * m, rel=1e-12)
    assert [cfg.is_moe_layer(i) for i in (0, 2, 3, 60)] == [False, False, True, True]
    assert cfg.eos_token_id == (1,) and cfg.weight_prefix == "" and cfg.quantization is None


def test_rope_parameters_form_equals_rope_scaling_form():
    """transformers >= 5 writes rope_parameters (theta inside, rope_type); older configs rope_theta +
    rope_scaling with "type". Both mean the same rope."""
    new = {k: v for k, v in DEEPSEEK_V3.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40, "beta_fast": 32,
                              "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                              "original_max_position_embeddings": 4096}
    assert ModelConfig.from_hf(new) == ModelConfig.from_hf(DEEPSEEK_V3)
    plain = {k: v for k, v in DEEPSEEK_V3.items() if k != "rope_scaling"}
    assert ModelConfig.from_hf(plain).rope == RopeConfig(theta=10000.0)
    plain["rope_parameters"] = {"rope_type": "default", "rope_theta": 5e5}
    assert ModelConfig.from_hf(plain).rope == RopeConfig(theta=5e5)


def test_kimi_k25_nested_config():
    cfg = ModelConfig.from_hf(KIMI_K25)
    assert cfg.weight_prefix == "language_model."
    assert cfg.architecture == "KimiK25ForConditionalGeneration"
    assert (cfg.vocab_size, cfg.n_routed_experts, cfg.n_group, cfg.num_attention_heads) == (163840, 384, 1, 64)
    assert cfg.routed_scaling_factor == 2.827 and cfg.rope.factor == 64.0 and cfg.rope.theta == 50000.0
    assert cfg.quantization["quant_method"] == "compressed-tensors"  # top-level quantization_config kept
    assert cfg.eos_token_id == (163586,)


def test_v2_lite_shape_without_q_lora():
    """DeepSeek-V2-Lite's MLA shape: no q_lora (plain q_proj), one dense layer, ungrouped routing."""
    v2 = {**DEEPSEEK_V3, "q_lora_rank": None, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
          "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2, "num_hidden_layers": 27,
          "hidden_size": 2048, "num_attention_heads": 16, "eos_token_id": [100001, 100002]}
    cfg = ModelConfig.from_hf(v2)
    assert cfg.q_lora_rank is None and cfg.n_group == 1 and cfg.eos_token_id == (100001, 100002)
    # NOTE: the published V2-Lite config routes with softmax scores / greedy top-k; only noaux_tc is supported,
    # and that must fail loudly rather than silently route differently.
    with pytest.raises(ConfigError, match="scoring_func='softmax'"):
        ModelConfig.from_hf({**v2, "scoring_func": "softmax", "topk_method": "greedy"})


@pytest.mark.parametrize("cfg", [
    tiny_config(), tiny_config(q_lora=None, n_group=1, dense=0), tiny_config(yarn=True, eos=5),
    dataclasses.replace(tiny_config(), tie_word_embeddings=True),
], ids=["default", "noqlora", "yarn-eos", "tied"])
def test_to_hf_round_trip(cfg):
    hf = json.loads(json.dumps(cfg.to_hf()))  # through JSON, as on disk
    assert ModelConfig.from_hf(hf) == cfg


def test_configs_are_frozen():
    cfg = tiny_config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.hidden_size = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_draft_config(cfg).hidden_size = 3  # type: ignore[misc]


# ----------------------------------------------------------------------------------------------------------
# Every inconsistency names its field and value
# ----------------------------------------------------------------------------------------------------------
BAD_TARGET = [
    # (change to DEEPSEEK_V3, substrings the message must contain)
    ({"kv_lora_rank": None}, ["kv_lora_rank", "is null"]),
    ({"n_routed_experts": "__delete__"}, ["n_routed_experts", "missing"]),
    ({"hidden_size": 0}, ["hidden_size", "0"]),
    ({"num_hidden_layers": -2}, ["num_hidden_layers", "-2"]),
    ({"qk_rope_head_dim": 63}, ["qk_rope_head_dim", "63"]),
    ({"q_lora_rank": 0}, ["q_lora_rank", "0"]),
    ({"num_experts_per_tok": 300}, ["num_experts_per_tok=300", "n_routed_experts=256"]),
    ({"n_group": 7}, ["n_routed_experts=256", "n_group=7"]),
    ({"topk_group": 9}, ["topk_group=9", "n_group=8"]),
    ({"n_group": 256, "topk_group": 4}, ["grouped routing", "1"]),
    ({"topk_group": 1, "num_experts_per_tok": 40}, ["num_experts_per_tok=40"]),
    ({"first_k_dense_replace": 62}, ["first_k_dense_replace=62", "61"]),
    ({"intermediate_size": None}, ["intermediate_size", "0"]),
    ({"scoring_func": "softmax"}, ["scoring_func", "softmax"]),
    ({"topk_method": "greedy"}, ["topk_method", "greedy"]),
    ({"moe_layer_freq": 2}, ["moe_layer_freq=2"]),
    ({"n_shared_experts": -1}, ["n_shared_experts", "-1"]),
    ({"rope_scaling": {"type": "linear", "factor": 2.0}}, ["linear"]),
    ({"rope_theta": 0, "rope_scaling": None}, ["rope_theta", "0"]),
    ({"rope_scaling": {"type": "yarn", "factor": -1.0}}, ["factor", "-1.0"]),
    ({"vocab_size": 1.5}, ["vocab_size", "1.5"]),
    ({"max_position_embeddings": True}, ["max_position_embeddings", "True"]),
    # Values of the wrong type: each names its field and value (they used to escape as bare ValueError /
    # TypeError / AttributeError, or coerce: bool("false") is True).
    ({"rms_norm_eps": "1e-6"}, ["rms_norm_eps", "'1e-6'"]),
    ({"rms_norm_eps": -1e-6}, ["rms_norm_eps", "-1e-06"]),
    ({"routed_scaling_factor": "2.5"}, ["routed_scaling_factor", "'2.5'"]),
    ({"routed_scaling_factor": float("nan")}, ["routed_scaling_factor", "nan"]),
    ({"routed_scaling_factor": 0}, ["routed_scaling_factor", "0"]),
    ({"first_k_dense_replace": "1"}, ["first_k_dense_replace", "'1'"]),
    ({"n_shared_experts": "1"}, ["n_shared_experts", "'1'"]),
    ({"norm_topk_prob": "false"}, ["norm_topk_prob", "'false'"]),
    ({"tie_word_embeddings": 0}, ["tie_word_embeddings", "0"]),
    ({"n_group": 0}, ["n_group", "0"]),
    ({"topk_group": 0}, ["topk_group", "0"]),
    ({"eos_token_id": "</s>"}, ["eos_token_id", "'</s>'"]),
    ({"eos_token_id": [1, "2"]}, ["eos_token_id", "'2'"]),
    ({"bos_token_id": 0.5}, ["bos_token_id", "0.5"]),
    ({"rope_scaling": "yarn"}, ["rope_scaling", "'yarn'"]),
    ({"rope_scaling": {"type": "yarn", "factor": "40"}}, ["rope_scaling", "factor", "'40'"]),
    ({"rope_theta": "10000", "rope_scaling": None}, ["rope_theta", "'10000'"]),
    ({"quantization_config": ["fp8"]}, ["quantization_config", "['fp8']"]),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, ["LlamaForCausalLMEagle3", "speculative_draft_model_path"]),
    # Another model's config is named by its architecture, not by the first DeepSeek field it lacks.
    ({"architectures": ["LlamaForCausalLM"], "kv_lora_rank": "__delete__"}, ["LlamaForCausalLM", "DeepseekV3"]),
    ({"architectures": ["Qwen3MoeForCausalLM"]}, ["Qwen3MoeForCausalLM", "KimiK25ForConditionalGeneration"]),
    ({"architectures": ["DeepseekV32ForCausalLM"]}, ["DeepseekV32ForCausalLM"]),
    ({"hidden_act": "gelu"}, ["hidden_act='gelu'", "'silu'"]),
    ({"attention_bias": True}, ["attention_bias=True"]),
    ({"num_nextn_predict_layers": -1}, ["num_nextn_predict_layers", "-1"]),
]


@pytest.mark.parametrize("change,needles", BAD_TARGET, ids=lambda x: str(x)[:40] if isinstance(x, dict) else "")
def test_bad_target_config_names_field_and_value(change, needles):
    cfg = copy.deepcopy(DEEPSEEK_V3)
    for k, v in change.items():
        if v == "__delete__":
            del cfg[k]
        else:
            cfg[k] = v
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf(cfg)
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


def test_bad_nested_config_names_text_config():
    bad = copy.deepcopy(KIMI_K25)
    del bad["text_config"]["kv_lora_rank"]
    with pytest.raises(ConfigError, match=r"text_config.*kv_lora_rank"):
        ModelConfig.from_hf(bad)
    bad["text_config"] = None
    with pytest.raises(ConfigError, match=r"required field 'text_config' is null"):
        ModelConfig.from_hf(bad)


def test_config_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ModelConfig.from_path(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_path(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object, got list"):
        ModelConfig.from_path(str(tmp_path))
    # model_path pointed at a weights file instead of its directory.
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00\xff\xfe{}")
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a UTF-8 JSON file.*directory"):
        ModelConfig.from_path(str(weights))
    (tmp_path / "config.json").write_text(json.dumps(DEEPSEEK_V3))
    assert ModelConfig.from_path(str(tmp_path)) == ModelConfig.from_hf(DEEPSEEK_V3)


# ----------------------------------------------------------------------------------------------------------
# EAGLE-3 drafts
# ----------------------------------------------------------------------------------------------------------
def test_eagle3_draft_config():
    d = DraftConfig.from_hf(EAGLE3_DRAFT)
    assert (d.head_dim, d.num_key_value_heads, d.draft_vocab_size) == (128, 8, 32000)
    assert d.aux_layer_ids == (1, 29, 57)
    assert d.target_hidden_size is None
    # Defaults: full vocabulary, MHA, no aux ids.
    minimal = {k: v for k, v in EAGLE3_DRAFT.items()
               if k not in ("draft_vocab_size", "num_key_value_heads", "eagle_config")}
    m = DraftConfig.from_hf(minimal)
    assert (m.draft_vocab_size, m.num_key_value_heads, m.aux_layer_ids) == (163840, 56, None)
    assert DraftConfig.from_hf(json.loads(json.dumps(d.to_hf()))) == d


BAD_DRAFT = [
    ({"architectures": ["Qwen2ForCausalLM"]}, ["Qwen2ForCausalLM", "EAGLE-3"]),  # (LlamaForCausalLM: as SGLang)
    ({"num_key_value_heads": 5}, ["num_attention_heads=56", "num_key_value_heads=5"]),
    ({"draft_vocab_size": 200000}, ["draft_vocab_size=200000", "163840"]),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}, ["3 ids", "[1, 2]"]),
    ({"hidden_size": None}, ["hidden_size", "is null"]),
    ({"intermediate_size": 0}, ["intermediate_size", "0"]),
    # Fields that would change the maths of the one Llama layer we build: refused, not ignored.
    ({"hidden_act": "gelu"}, ["hidden_act='gelu'", "'silu'"]),
    ({"attention_bias": True}, ["attention_bias=True"]),
    ({"mlp_bias": True}, ["mlp_bias=True"]),
    ({"num_hidden_layers": 2}, ["num_hidden_layers=2"]),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ["rope_scaling", "'llama3'"]),
    ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, ["rope_scaling", "'yarn'"]),
    # Wrong types name the field and value.
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": ["1", "29", "57"]}}, ["layer_ids", "'1'"]),
    ({"max_position_embeddings": "x"}, ["max_position_embeddings", "'x'"]),
    ({"rms_norm_eps": "1e-5"}, ["rms_norm_eps", "'1e-5'"]),
    ({"rope_theta": -1.0}, ["rope_theta", "-1.0"]),
    ({"target_hidden_size": 0}, ["target_hidden_size", "0"]),
]


def test_draft_config_accepts_published_fields():
    """SpecForge's Kimi-K2.5 draft config writes these explicitly (null rope_scaling, silu, no biases)."""
    published = {**EAGLE3_DRAFT, "rope_scaling": None, "hidden_act": "silu", "attention_bias": False,
                 "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
    assert DraftConfig.from_hf(published) == DraftConfig.from_hf(EAGLE3_DRAFT)



@pytest.mark.parametrize("change,needles", BAD_DRAFT, ids=[str(c)[:40] for c, _ in BAD_DRAFT])
def test_bad_draft_config_names_field_and_value(change, needles):
    with pytest.raises(ConfigError) as e:
        DraftConfig.from_hf({**EAGLE3_DRAFT, **change})
    for needle in needles:
        assert needle in str(e.value), (needle, str(e.value))


@pytest.mark.parametrize("ids,why", [((2, 30, 30), "repeat a layer"), ((58, 30, 2), "are not ascending")])
def test_aux_layer_ids_sglang_would_run_otherwise_are_refused(ids, why):
    """SGLang 0.5.23 captures each listed layer once, in layer order (deepseek_v2's capture loop into
    AuxHiddenStatePacker): a repeated id fails its first forward, descending ids reach fc permuted."""
    d = DraftConfig.from_hf({**EAGLE3_DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids)}})
    for draft, override in ((d, None), (DraftConfig.from_hf(EAGLE3_DRAFT), ids)):
        with pytest.raises(ConfigError, match=f"{re.escape(str(list(ids)))} {why}"):
            resolve_aux_layer_ids(draft, 61, override)


def test_aux_layer_ids_resolution():
    d = DraftConfig.from_hf({k: v for k, v in EAGLE3_DRAFT.items() if k != "eagle_config"})
    assert resolve_aux_layer_ids(d, 61) == (2, 30, 58)  # SGLang's default [2, L//2, L-3]
    assert resolve_aux_layer_ids(d, 7) == (2, 3, 4)
    # SpecForge-style ids counting from 1: shifted by one (SGLang's deepseek rule).
    assert resolve_aux_layer_ids(DraftConfig.from_hf(EAGLE3_DRAFT), 61) == (2, 30, 58)
    as_given = {**EAGLE3_DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 30, 61]}}
    assert resolve_aux_layer_ids(DraftConfig.from_hf(as_given), 61) == (0, 30, 61)  # 61 = final pre-norm state
    assert resolve_aux_layer_ids(d, 61, override=(5, 6, 7)) == (5, 6, 7)  # an explicit override is used as given


@pytest.mark.parametrize("ids,layers,override", [
    ((0, 30, 62), 61, None), ((-1, 3, 4), 61, None), (None, 61, (1, 2, 99)), (None, 4, (0, 1)),
])
def test_aux_layer_ids_out_of_range(ids, layers, override):
    d = {k: v for k, v in EAGLE3_DRAFT.items() if k != "eagle_config"}
    if ids is not None:
        d["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids)}
    with pytest.raises(ConfigError) as e:
        resolve_aux_layer_ids(DraftConfig.from_hf(d), layers, override)
    bad = [i for i in (override or ids) if not 0 <= i <= layers]
    msg = str(e.value)
    assert (str(bad[0]) in msg and str(layers) in msg) if bad else "3 ids" in msg, msg


def test_env_overrides_restore(monkeypatch):
    """env.overrides sets and unsets for its block and puts every variable back, also when the block raises."""
    import os

    import pytest

    from sglang_eagle3 import env

    monkeypatch.setenv("SGLANG_EAGLE3_PDL", "0")
    monkeypatch.delenv("SGLANG_EAGLE3_PDL_SKIP", raising=False)
    monkeypatch.setenv("SGLANG_EAGLE3_OVERLAP", "none")
    with pytest.raises(RuntimeError):
        with env.overrides({"SGLANG_EAGLE3_PDL": "1", "SGLANG_EAGLE3_PDL_SKIP": "moe", "SGLANG_EAGLE3_OVERLAP": None}):
            assert os.environ["SGLANG_EAGLE3_PDL"] == "1" and os.environ["SGLANG_EAGLE3_PDL_SKIP"] == "moe"
            assert "SGLANG_EAGLE3_OVERLAP" not in os.environ
            raise RuntimeError("inside the block")
    assert os.environ["SGLANG_EAGLE3_PDL"] == "0" and os.environ["SGLANG_EAGLE3_OVERLAP"] == "none"
    assert "SGLANG_EAGLE3_PDL_SKIP" not in os.environ
