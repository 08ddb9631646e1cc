"""Fields a config.json leaves out. SGLang builds its model from transformers' config object (AutoConfig over the
same file; Kimi-K2.5's text_config as deepseek_v3), so each left-out field must parse here to the value that object
holds, read from transformers at test time, or be refused with a ConfigError naming the field, the default and why."""

from __future__ import annotations

import copy
import json

import pytest

from sglang_eagle3.config import ConfigError, DraftConfig, ModelConfig
from tests.test_config import DEEPSEEK_V3, EAGLE3_DRAFT, KIMI_K25

transformers = pytest.importorskip("transformers")
try:  # what transformers' strict config dataclasses raise for a value of the wrong type (None included)
    from huggingface_hub.errors import StrictDataclassError
except ImportError:  # older huggingface_hub: configs were not strict
    StrictDataclassError = ValueError


def _hf(tmp_path, cfg: dict):
    """What SGLang reads: AutoConfig over this config.json, the text model's part of it (Kimi: text_config)."""
    path = tmp_path / "hf"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    return transformers.AutoConfig.from_pretrained(str(path)).get_text_config()


def _target(layout: str, *left_out: str, **change) -> dict:
    """DeepSeek-V3's published config, or Kimi-K2.5's (the fields in text_config), less ``left_out``."""
    cfg = copy.deepcopy(DEEPSEEK_V3 if layout == "deepseek_v3" else KIMI_K25)
    text = cfg if layout == "deepseek_v3" else cfg["text_config"]
    for k in left_out:
        del text[k]
    text.update(change)
    return cfg


# The target fields parsed with a default (the rest are required, or the rope's: below).
TARGET_FIELDS = ["intermediate_size", "q_lora_rank", "n_shared_experts", "first_k_dense_replace", "n_group",
                 "topk_group", "norm_topk_prob", "routed_scaling_factor", "rms_norm_eps", "tie_word_embeddings",
                 "num_nextn_predict_layers"]
# Kimi writes n_group 1: transformers' topk_group 4 beside it selects more groups than there are (refused, below).
CASES = [(layout, f) for layout in ("deepseek_v3", "kimi_k25") for f in TARGET_FIELDS
         if (layout, f) != ("kimi_k25", "topk_group")]


@pytest.mark.parametrize("layout,field", CASES, ids=[f"{a}-{b}" for a, b in CASES])
def test_left_out_target_field_takes_transformers_default(tmp_path, layout, field):
    cfg = _target(layout, field)
    want = getattr(_hf(tmp_path, cfg), field)
    assert getattr(ModelConfig.from_hf(cfg), field) == want


def test_left_out_routing_builds_transformers_router(tmp_path):
    """A config without any routing field: transformers' class has no scoring_func / topk_method / moe_layer_freq, so
    its model decides them (sigmoid scores, noaux_tc, an MoE layer from first_k_dense_replace on). The router it builds
    from the config must route as ours, parsed from the same file, and its layers be MoE where ours are."""
    torch = pytest.importorskip("torch")
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf_model

    from sglang_eagle3.kernels.ref import ref_moe_topk

    tiny = {"model_type": "deepseek_v3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
            "moe_intermediate_size": 16, "num_hidden_layers": 5, "num_attention_heads": 2, "q_lora_rank": 16,
            "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
            "n_routed_experts": 16, "num_experts_per_tok": 4, "max_position_embeddings": 64}
    hf = _hf(tmp_path, tiny)
    ours = ModelConfig.from_hf(tiny)
    for name in ("scoring_func", "topk_method", "moe_layer_freq"):
        assert not hasattr(hf, name), name  # not transformers' fields: its model's routing below is what counts
    assert (ours.scoring_func, ours.topk_method, ours.moe_layer_freq) == ("sigmoid", "noaux_tc", 1)

    router = hf_model.DeepseekV3TopkRouter(hf)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=g))
        router.e_score_correction_bias.copy_(0.5 * torch.randn(router.e_score_correction_bias.shape, generator=g))
        logits, hf_weights, hf_ids = router(torch.randn(9, hf.hidden_size, generator=g))
    weights, ids = ref_moe_topk(logits, router.e_score_correction_bias, top_k=ours.num_experts_per_tok,
                                n_group=ours.n_group, topk_group=ours.topk_group, renormalize=ours.norm_topk_prob,
                                routed_scaling_factor=ours.routed_scaling_factor)
    hf_order, order = hf_ids.argsort(-1), ids.long().argsort(-1)
    assert torch.equal(hf_ids.gather(1, hf_order), ids.long().gather(1, order))
    torch.testing.assert_close(hf_weights.gather(1, hf_order), weights.gather(1, order), rtol=1e-6, atol=0)

    layers = [hf_model.DeepseekV3DecoderLayer(hf, i) for i in range(hf.num_hidden_layers)]
    assert [isinstance(layer.mlp, hf_model.DeepseekV3MoE) for layer in layers] == \
        [ours.is_moe_layer(i) for i in range(ours.num_hidden_layers)]


@pytest.mark.parametrize("left_out", [("rope_theta",), ("beta_fast",), ("beta_slow",), ("mscale", "mscale_all_dim"),
                                      ("mscale_all_dim",)], ids=lambda k: "+".join(k))
def test_left_out_rope_field_gives_transformers_rope(tmp_path, left_out):
    """Inverse frequencies, cos/sin magnitude and softmax scale as transformers computes them from its config."""
    torch = pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, yarn_apply_mscale

    from sglang_eagle3.layers.rotary import rope_inv_freq

    cfg = copy.deepcopy(DEEPSEEK_V3)
    for k in left_out:
        cfg.pop(k, None)
        cfg["rope_scaling"].pop(k, None)
    hf = _hf(tmp_path, cfg)
    ours = ModelConfig.from_hf(cfg)
    assert ours.rope.theta == hf.rope_parameters["rope_theta"]
    want_inv, want_scale = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    inv, scale = rope_inv_freq(ours.qk_rope_head_dim, ours.rope)
    torch.testing.assert_close(inv, want_inv.double(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(want_scale, rel=1e-12)
    assert ours.softmax_scale == pytest.approx(yarn_apply_mscale(hf.rope_parameters, ours.qk_head_dim ** -0.5),
                                               rel=1e-12)


@pytest.mark.parametrize("scaling", [{"mscale_all_dim": 1.0}, {"mscale": 0.707}], ids=["mscale-only-dim", "mscale"])
def test_one_of_mscale_pair_left_out_is_refused_where_references_part(tmp_path, scaling):
    """With one of mscale / mscale_all_dim left out, transformers scales cos/sin by yarn_get_mscale(factor) and
    DeepSeek's YaRN (SGLang's) by the ratio with 1 / 0 for the missing one: refused, naming both magnitudes."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = copy.deepcopy(DEEPSEEK_V3)
    for k in ("mscale", "mscale_all_dim"):
        del cfg["rope_scaling"][k]
    cfg["rope_scaling"].update(scaling)
    _, hf_scale = ROPE_INIT_FUNCTIONS["yarn"](_hf(tmp_path, cfg), "cpu")
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf(cfg)
    msg = str(e.value)
    assert "rope_scaling: mscale=" in msg and "mscale_all_dim=" in msg and f"{hf_scale:.6g} in transformers'" in msg


# ----------------------------------------------------------------------------------------------------------
# Defaults the model cannot build: refused, naming the field, the default and why
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,left_out,change,needle", [
    # Kimi's n_group 1 with transformers' topk_group: more groups kept than there are.
    ("kimi_k25", "topk_group", {}, "> n_group=1"),
    # transformers' 3 dense layers in a 2-layer model.
    ("deepseek_v3", "first_k_dense_replace", {"num_hidden_layers": 2}, "num_hidden_layers=2"),
    # transformers' 8 groups over 12 experts.
    ("deepseek_v3", "n_group", {"n_routed_experts": 12}, "n_routed_experts=12"),
], ids=["kimi-topk_group", "first_k_dense_replace", "n_group"])
def test_left_out_default_that_cannot_be_built_is_refused(tmp_path, layout, left_out, change, needle):
    cfg = _target(layout, left_out, **change)
    want = getattr(_hf(tmp_path, cfg), left_out)
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_hf(cfg)
    msg = str(e.value)
    assert needle in msg and f"{left_out}={want!r}: left out of the config, so transformers'" in msg, msg


@pytest.mark.parametrize("field", [f for f in TARGET_FIELDS if f not in ("q_lora_rank", "intermediate_size")]
                         + ["scoring_func", "topk_method", "moe_layer_freq"])
def test_null_field_is_refused(tmp_path, field):
    """null is not "left out": transformers keeps None (n_group, norm_topk_prob...: its model and SGLang then route
    otherwise, or fail) or refuses it. It used to parse as the default."""
    cfg = _target("deepseek_v3", **{field: None})
    try:
        assert getattr(_hf(tmp_path, cfg), field, None) is None
    except StrictDataclassError:  # transformers refuses None for this field
        pass
    with pytest.raises(ConfigError, match=rf"config: {field} is null"):
        ModelConfig.from_hf(cfg)


def test_null_q_lora_rank_is_a_plain_q_proj(tmp_path):
    """null q_lora_rank is DeepSeek-V2-Lite's plain q_proj, as transformers keeps it; left out it is the LoRA rank."""
    cfg = _target("deepseek_v3", q_lora_rank=None)
    assert ModelConfig.from_hf(cfg).q_lora_rank is _hf(tmp_path, cfg).q_lora_rank is None


@pytest.mark.parametrize("field", ["n_group", "norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace"])
def test_other_model_type_does_not_take_deepseek_v3_defaults(tmp_path, field):
    """A deepseek_v2 config's class defaults otherwise (greedy routing, no groups, no scaling...): left out there,
    DeepSeek-V3's default is not what SGLang builds, so it is refused."""
    cfg = {k: v for k, v in DEEPSEEK_V3.items() if k != field}
    cfg["model_type"] = "deepseek_v2"
    assert getattr(_hf(tmp_path, cfg), field) != getattr(transformers.DeepseekV3Config(), field)
    with pytest.raises(ConfigError, match=rf"{field} is missing and model_type='deepseek_v2'"):
        ModelConfig.from_hf(cfg)
    assert ModelConfig.from_hf({**DEEPSEEK_V3, "model_type": "deepseek_v2"}) == ModelConfig.from_hf(DEEPSEEK_V3)


# ----------------------------------------------------------------------------------------------------------
# EAGLE-3 drafts: transformers' LlamaConfig
# ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
                                   "rope_theta"])
def test_left_out_draft_field_takes_llama_default(tmp_path, field):
    cfg = {**EAGLE3_DRAFT, "head_dim": 128}
    del cfg[field]
    hf = _hf(tmp_path, cfg)
    want = hf.rope_parameters["rope_theta"] if field == "rope_theta" else getattr(hf, field)
    assert getattr(DraftConfig.from_hf(cfg), field) == want


def test_left_out_draft_fields_checked_as_llama_defaults(tmp_path):
    """hidden_act, biases and tied embeddings left out: transformers' defaults are what the draft layer builds."""
    cfg = {k: v for k, v in EAGLE3_DRAFT.items()}
    hf = _hf(tmp_path, cfg)
    assert (hf.hidden_act, hf.attention_bias, hf.mlp_bias, hf.tie_word_embeddings) == ("silu", False, False, False)
    for key, value in (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False),
                       ("tie_word_embeddings", False)):
        assert DraftConfig.from_hf({**cfg, key: value}) == DraftConfig.from_hf(cfg)


@pytest.mark.parametrize("value", ["__delete__", None])
def test_draft_without_num_hidden_layers_is_refused(tmp_path, value):
    """Left out, transformers' LlamaConfig takes a full model's layer count (SGLang's llama_eagle3 then refuses it); it
    used to parse as the one layer built here."""
    cfg = {k: v for k, v in EAGLE3_DRAFT.items() if k != "num_hidden_layers"}
    default = _hf(tmp_path, cfg).num_hidden_layers
    if value is None:
        cfg["num_hidden_layers"] = None
    with pytest.raises(ConfigError) as e:
        DraftConfig.from_hf(cfg)
    msg = str(e.value)
    assert "num_hidden_layers is" in msg and f"default of {default} decoder layers" in msg, msg
