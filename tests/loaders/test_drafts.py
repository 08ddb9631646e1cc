"""EAGLE-3 drafts as published (midlayer.* or layers.0.*; with or without lm_head, d2t, t2d) and the
aux-layer wiring for DeepSeek-family targets."""

from __future__ import annotations

import logging
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang_eagle3.config import DraftConfig, ModelConfig, resolve_aux_layer_ids
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.models.loader import load_draft, load_target, save_hf
from sglang_eagle3.testing import random_d2t, randomize, tiny_draft_config
from tests.loaders.ckpt import int4_config

KIMI_TEXT = {  # Kimi-K2.5's text_config (REFERENCE.md): enough for ModelConfig, no weights needed
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2", "vocab_size": 163840, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "n_routed_experts": 384, "num_experts_per_tok": 8, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid",
    "topk_method": "noaux_tc", "max_position_embeddings": 262144, "rope_theta": 50000.0,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                     "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0},
}
KIMI_DRAFT = {  # the shape of published Kimi-K2.5 EAGLE-3 drafters' config.json
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
    "intermediate_size": 18432, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "vocab_size": 163840, "draft_vocab_size": 32000, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
    "max_position_embeddings": 131072, "num_hidden_layers": 1,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
}


def write_draft(path: str, dcfg: DraftConfig, *, seed: int, naming: str = "midlayer", head: bool = True,
                d2t: bool = True, t2d: bool = True, model_prefix: bool = False) -> Eagle3Draft:
    src = randomize(Eagle3Draft(dcfg, dtype=torch.float32, has_lm_head=head), seed, scale=3.0)
    if dcfg.draft_vocab_size != dcfg.vocab_size:
        random_d2t(src, seed + 1)
    save_hf(src, path)
    f = os.path.join(path, "model.safetensors")
    sd = load_file(f)
    if naming == "layers.0":
        sd = {k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}
    if model_prefix:
        sd = {("model." + k if k.startswith(("layers.", "midlayer.")) else k): v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if (d2t or k != "d2t") and (t2d or k != "t2d")}
    save_file(sd, f)
    return src


def draft_logits(draft: Eagle3Draft, target, hidden: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    head = draft.lm_head if draft.lm_head is not None else target.lm_head
    with torch.no_grad():
        logits, _, _ = draft.forward_dense(ids, hidden, target.model.embed_tokens.weight, lm_head=head)
    return logits


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from sglang_eagle3.models.loader import hf_state_dict
    from tests.loaders.ckpt import plain_model, write_sharded

    cfg = int4_config()
    path = str(tmp_path_factory.mktemp("target"))
    write_sharded(hf_state_dict(plain_model(cfg, seed=20)), path, cfg.to_hf(), 1)
    return cfg, load_target(path, dtype=torch.float32)


@pytest.mark.parametrize("naming,model_prefix", [("midlayer", False), ("layers.0", False), ("layers.0", True)])
def test_draft_namings_load_the_same_model(tmp_path, target, naming, model_prefix):
    cfg, tgt = target
    dcfg = tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96, aux_ids=[1, 2, 3])
    src = write_draft(str(tmp_path), dcfg, seed=3, naming=naming, model_prefix=model_prefix)
    draft = load_draft(str(tmp_path), cfg, dtype=torch.float32)
    want = dict(src.named_parameters()) | {"d2t": src.d2t, "t2d": src.t2d}
    got = dict(draft.named_parameters()) | {"d2t": draft.d2t, "t2d": draft.t2d}
    assert set(got) == set(want)
    for name, v in want.items():
        assert torch.equal(got[name], v), name
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 3 * cfg.hidden_size, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (2, 5), generator=g)
    torch.testing.assert_close(draft_logits(draft, tgt, hidden, ids), draft_logits(src, tgt, hidden, ids),
                               atol=0, rtol=0)


def test_draft_without_lm_head_uses_target_head(tmp_path, target, caplog):
    cfg, tgt = target
    dcfg = tiny_draft_config(cfg, heads=4, kv_heads=2, inter=96)  # full vocab: required without a head
    src = write_draft(str(tmp_path), dcfg, seed=5, head=False, d2t=False, t2d=False)
    assert "lm_head.weight" not in load_file(os.path.join(tmp_path, "model.safetensors"))
    report = {}
    with caplog.at_level(logging.INFO, logger="sglang_eagle3.models.loader"):
        draft = load_draft(str(tmp_path), cfg, dtype=torch.float32, report=report)
    assert draft.lm_head is None and report["has_lm_head"] is False
    assert any("no lm_head: uses the target head" in r.message for r in caplog.records)
    assert torch.equal(draft.d2t, torch.zeros(cfg.vocab_size, dtype=torch.int64)) and bool(draft.t2d.all())
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(1, 4, 3 * cfg.hidden_size, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (1, 4), generator=g)
    got = draft_logits(draft, tgt, hidden, ids)
    assert got.shape[-1] == cfg.vocab_size
    torch.testing.assert_close(got, draft_logits(src, tgt, hidden, ids), atol=0, rtol=0)


def test_missing_t2d_is_rebuilt_from_d2t(tmp_path, target):
    cfg, _ = target
    dcfg = tiny_draft_config(cfg, draft_vocab=40, heads=4, kv_heads=2, inter=96)
    src = write_draft(str(tmp_path), dcfg, seed=7, t2d=False)
    draft = load_draft(str(tmp_path), cfg, dtype=torch.float32)
    assert torch.equal(draft.t2d, src.t2d) and int(draft.t2d.sum()) == 40


def test_published_kimi_aux_ids_wire_as_sglang(caplog):
    """Kimi drafters write [2, 30, 58]; on the 61-layer target the DeepSeek rule uses them as given."""
    cfg = ModelConfig.from_hf({"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                               "text_config": KIMI_TEXT})
    assert cfg.num_hidden_layers == 61 and cfg.weight_prefix == "language_model."
    dcfg = DraftConfig.from_hf(KIMI_DRAFT)
    assert dcfg.aux_layer_ids == (2, 30, 58) and dcfg.draft_vocab_size == 32000
    assert resolve_aux_layer_ids(dcfg, cfg.num_hidden_layers) == (2, 30, 58)
    # SpecForge-style ids counted from 1: the first id is 1, so 1 is added to all.
    one_based = DraftConfig.from_hf({**KIMI_DRAFT, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}})
    assert resolve_aux_layer_ids(one_based, 61) == (2, 30, 58)
    # No ids written: SGLang's default [2, L//2, L-3].
    default = DraftConfig.from_hf({k: v for k, v in KIMI_DRAFT.items() if k != "eagle_config"})
    assert resolve_aux_layer_ids(default, 61) == (2, 30, 58)
    # An explicit override wins, as given.
    assert resolve_aux_layer_ids(dcfg, 61, override=(3, 31, 59)) == (3, 31, 59)


def test_load_draft_logs_resolved_aux_layers(tmp_path, target, caplog):
    cfg, _ = target
    dcfg = tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96, aux_ids=[0, 2, 3])
    write_draft(str(tmp_path), dcfg, seed=3)
    report = {}
    with caplog.at_level(logging.INFO, logger="sglang_eagle3.models.loader"):
        load_draft(str(tmp_path), cfg, dtype=torch.float32, report=report)
    # (the +1 of ids written from 1 is test_published_kimi_aux_ids_wire_as_sglang's; 3 = this target's layer count)
    assert report["aux_layer_ids"] == (0, 2, 3)
    assert any("aux ids as written [0, 2, 3] -> residual streams entering target layers [0, 2, 3]" in r.message
               for r in caplog.records)


def test_engine_aux_layer_override(make_pair):
    from sglang_eagle3.engine import Engine
    from tests.conftest import small_config, small_draft_config

    cfg = small_config()
    pair = make_pair(cfg, small_draft_config(cfg, draft_vocab=48, aux_ids=[0, 1, 2]), seed=11)
    common = dict(model_path=pair.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                  device="cpu", skip_tokenizer_init=True, max_running_requests=1, context_length=32)
    assert Engine(**common).aux_layer_ids == (0, 1, 2)
    eng = Engine(**common, speculative_aux_layer_ids=[1, 2, 3])
    assert eng.aux_layer_ids == (1, 2, 3)
    assert eng.runner.aux_layer_ids == (1, 2, 3)


@pytest.mark.parametrize("breakage,fragment", [
    ("vocab", "draft vocab_size=128 differs from the target's 96"),
    ("d2t", "no d2t tensor"),
])
def test_engine_checks_the_draft_before_loading_the_target(make_pair, tmp_path, monkeypatch, breakage, fragment):
    """A draft that cannot fit its target fails from its config and headers, before the target's weights load
    (for Kimi-K2.5 a load of minutes)."""
    from sglang_eagle3.config import ConfigError
    from sglang_eagle3.engine import Engine
    from sglang_eagle3.models import loader
    from tests.conftest import small_config, small_draft_config

    cfg = small_config()
    pair = make_pair(cfg, small_draft_config(cfg, draft_vocab=48), seed=11)
    draft = str(tmp_path / "draft")
    if breakage == "vocab":
        write_draft(draft, tiny_draft_config(int4_config(vocab=128), heads=4, kv_heads=2, inter=96), seed=1)
    else:
        write_draft(draft, small_draft_config(cfg, draft_vocab=48), seed=1, d2t=False)
    monkeypatch.setattr(loader, "load_target", lambda *a, **k: pytest.fail("the target loaded first"))
    with pytest.raises((ConfigError, loader.CheckpointError), match=fragment):
        Engine(model_path=pair.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
               device="cpu", skip_tokenizer_init=True, max_running_requests=1, context_length=32)


def test_plain_llama_architecture_loads_as_eagle3(tmp_path, target):
    """EAGLE's own EAGLE-3 drafts (yuhuili/EAGLE3-*) name their architecture LlamaForCausalLM; SGLang renames a
    draft's LlamaForCausalLM to LlamaForCausalLMEagle3, so such a draft loads as the same head."""
    from tests.loaders.ckpt import edit_config

    cfg, _ = target
    dcfg = tiny_draft_config(cfg, draft_vocab=48, heads=4, kv_heads=2, inter=96, aux_ids=[1, 2, 3])
    src = write_draft(str(tmp_path), dcfg, seed=5)
    edit_config(str(tmp_path), lambda c: c.update(architectures=["LlamaForCausalLM"]))
    draft = load_draft(str(tmp_path), cfg, dtype=torch.float32)
    want = dict(src.named_parameters()) | {"d2t": src.d2t}
    got = dict(draft.named_parameters()) | {"d2t": draft.d2t}
    assert want.keys() == got.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=0, msg=k)
