"""Each checkpoint layout loads into a model whose logits equal a float32 reference built from the
dequantised weights."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
import torch

from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.loader import hf_state_dict, load_target
from tests.loaders.ckpt import (
    edit_checkpoint,
    edit_config,
    fp8_config,
    int4_config,
    plain_model,
    write_deepseek_fp8,
    write_kimi_int4,
    write_sharded,
)


def assert_same_logits(model, ref, vocab: int, atol: float = 1e-5):
    ids = torch.randint(0, vocab, (2, 11), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, _ = model.forward_dense(ids)
        want, _ = ref.forward_dense(ids)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=atol, rtol=0)
    assert want.abs().max() > 1.0  # not trivially zero


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    cfg = int4_config()
    path, ref = write_kimi_int4(str(tmp_path_factory.mktemp("kimi")), cfg, seed=1)
    return cfg, path, ref


def test_kimi_int4_three_shards_match_dequantised_reference(kimi, caplog):
    cfg, path, ref = kimi
    report = {}
    with caplog.at_level(logging.INFO, logger="sglang_eagle3.models.loader"):
        model = load_target(path, dtype=torch.float32, report=report)
    assert report["shards"] == 3 and report["quantization"].startswith("routed experts INT4")
    assert any("vision tower" in r.message and "skipped 3" in r.message for r in caplog.records)
    assert any(re.search(r"target loaded from .*: \d+ tensors, .* parameters, .*B read from 3 shard", r.message)
               for r in caplog.records)
    assert_same_logits(model, ref, cfg.vocab_size)


def test_kimi_language_model_layers_variant(kimi, tmp_path):
    """Some exports write language_model.layers.* (no inner model.): same model."""
    cfg, _, ref = kimi
    path, _ = write_kimi_int4(str(tmp_path), cfg, seed=1, inner_model_prefix=False)
    names = json.load(open(os.path.join(path, "model.safetensors.index.json")))["weight_map"]
    assert any(n.startswith("language_model.layers.") for n in names)
    assert not any(n.startswith("language_model.model.") for n in names)
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)


@pytest.mark.parametrize("ignore_lm_head", ["lm_head", "re:.*lm_head.*", "language_model.lm_head"])
def test_kimi_ignore_entry_forms(kimi, tmp_path, ignore_lm_head):
    """The ignore list may name modules as the text model or the wrapper sees them; both match exactly."""
    cfg, _, ref = kimi
    path, _ = write_kimi_int4(str(tmp_path), cfg, seed=1)

    def set_ignore(c):
        c["quantization_config"]["ignore"][0] = ignore_lm_head

    edit_config(path, set_ignore)
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)


def test_kimi_int4_stays_packed(kimi):
    """Routed experts are held as int32 words + bf16 group scales: no bf16 (or wider) copy of any expert."""
    cfg, path, _ = kimi
    model = load_target(path, dtype=torch.bfloat16)
    E, H, I = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    per_layer = (E * 2 * I * H // 8 * 4 + E * 2 * I * H // 32 * 2  # w13 packed int32 + bf16 scales
                 + E * H * I // 8 * 4 + E * H * I // 32 * 2)  # w2
    bf16_experts = E * 3 * I * H * 2
    for i, layer in enumerate(model.model.layers):
        if i < cfg.first_k_dense_replace:
            continue
        ex = layer.mlp.experts
        tensors = dict(ex.named_parameters()) | dict(ex.named_buffers())
        assert set(tensors) == {"w13_weight_packed", "w13_weight_scale", "w2_weight_packed", "w2_weight_scale"}
        assert ex.w13_weight_packed.dtype == ex.w2_weight_packed.dtype == torch.int32
        assert ex.w13_weight_scale.dtype == ex.w2_weight_scale.dtype == torch.bfloat16
        held = sum(t.numel() * t.element_size() for t in tensors.values())
        assert held == per_layer
        assert held < bf16_experts * 0.32  # 4 bits + a 16-bit scale per 32 values = 0.3125 of bf16
    # Nothing else in the model has an expert-sized float tensor.
    for name, p in model.named_parameters():
        if p.is_floating_point():
            assert p.numel() < E * I * H, name


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    cfg = fp8_config()
    path, ref = write_deepseek_fp8(str(tmp_path_factory.mktemp("fp8")), cfg, seed=2)
    return cfg, path, ref


def test_deepseek_fp8_matches_dequantised_reference(fp8, caplog):
    cfg, path, ref = fp8
    with caplog.at_level(logging.INFO, logger="sglang_eagle3.models.loader"):
        model = load_target(path, dtype=torch.float32)
    assert any("multi-token-prediction" in r.message for r in caplog.records)
    assert_same_logits(model, ref, cfg.vocab_size)


def test_deepseek_fp8_scales_beside_weights(tmp_path):
    cfg = fp8_config()
    path, ref = write_deepseek_fp8(str(tmp_path), cfg, seed=2, scales_in_last_shard=False)
    assert_same_logits(load_target(path, dtype=torch.float32), ref, cfg.vocab_size)


@pytest.mark.parametrize("ckpt_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n_shards", [1, 4])
def test_plain_checkpoint(tmp_path, ckpt_dtype, n_shards):
    cfg = int4_config()
    ref = plain_model(cfg, seed=4)
    sd = {k: v.to(ckpt_dtype) for k, v in hf_state_dict(ref).items()}
    write_sharded(sd, str(tmp_path), cfg.to_hf(), n_shards)
    model = load_target(str(tmp_path), dtype=torch.float32)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p, dict(ref.named_parameters())[name], atol=0, rtol=0, msg=name)
    assert_same_logits(model, ref, cfg.vocab_size, atol=0)


def test_bf16_model_from_fp32_checkpoint(tmp_path):
    cfg = int4_config()
    ref = plain_model(cfg, seed=4)  # bf16-representable values: the bf16 model holds them exactly
    write_sharded(hf_state_dict(ref), str(tmp_path), cfg.to_hf(), 2)
    model = load_target(str(tmp_path), dtype=torch.bfloat16)
    assert model.model.layers[0].self_attn.kv_b_proj.weight.dtype == torch.bfloat16
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.float(), dict(ref.named_parameters())[name], atol=0, rtol=0, msg=name)


def test_transformers5_stacked_experts(tmp_path):
    """transformers >= 5 saves each layer's experts stacked: mlp.experts.gate_up_proj [E, 2I, H], down_proj."""
    cfg = int4_config()
    ref = plain_model(cfg, seed=5)
    sd = {}
    for k, v in ref.state_dict().items():
        sd[k.replace("w13_weight", "gate_up_proj").replace("w2_weight", "down_proj")] = v
    write_sharded(sd, str(tmp_path), cfg.to_hf(), 2)
    assert_same_logits(load_target(str(tmp_path), dtype=torch.float32), ref, cfg.vocab_size, atol=0)


def test_tied_embeddings(tmp_path):
    cfg = int4_config()
    ref = plain_model(cfg, seed=6)
    with torch.no_grad():
        ref.lm_head.weight.copy_(ref.model.embed_tokens.weight)
    hf = cfg.to_hf()
    hf["tie_word_embeddings"] = True
    sd = hf_state_dict(ref)
    del sd["lm_head.weight"]
    write_sharded(sd, str(tmp_path), hf, 1)
    model = load_target(str(tmp_path), dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert_same_logits(model, ref, cfg.vocab_size, atol=0)


def test_tied_embeddings_with_a_stored_head_warn(tmp_path, caplog):
    """transformers ties and ignores a stored head; so do we, but say so instead of dropping it silently."""
    cfg = int4_config()
    ref = plain_model(cfg, seed=6)
    hf = {**cfg.to_hf(), "tie_word_embeddings": True}
    write_sharded(hf_state_dict(ref), str(tmp_path), hf, 1)
    with caplog.at_level(logging.WARNING, logger="sglang_eagle3.models.loader"):
        model = load_target(str(tmp_path), dtype=torch.float32)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert any("stored lm_head.weight is not used" in r.message for r in caplog.records)


def test_model_built_on_requested_dtype_and_device(kimi):
    _, path, _ = kimi
    model = load_target(path, device="cpu", dtype=torch.bfloat16)
    assert isinstance(model, DeepseekV3ForCausalLM)
    assert model.model.embed_tokens.weight.device.type == "cpu"
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16


def test_edit_helper_keeps_checkpoint_loadable(tmp_path):
    """edit_checkpoint keeps the index consistent (the error tests rely on it)."""
    cfg = int4_config()
    write_sharded(hf_state_dict(plain_model(cfg, seed=0)), str(tmp_path), cfg.to_hf(), 2)
    edit_checkpoint(str(tmp_path), lambda sd, f: sd)
    load_target(str(tmp_path), dtype=torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["kimi", "fp8"])
def test_load_directly_onto_cuda(request, layout):
    """The model is built on the GPU and filled from the CPU memory maps: every parameter equals the CPU load,
    and it computes what the CPU-loaded model moved to the GPU computes (same kernels, same weights)."""
    cfg, path, _ = request.getfixturevalue(layout)
    cpu = load_target(path, dtype=torch.float32)
    gpu = load_target(path, device="cuda", dtype=torch.float32)
    cpu_params = dict(cpu.named_parameters())
    for name, p in gpu.named_parameters():
        assert p.is_cuda, name
        torch.testing.assert_close(p.cpu(), cpu_params[name], atol=0, rtol=0, msg=name)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(3)).cuda()
    with torch.no_grad():
        got, _ = gpu.forward_dense(ids)
        want, _ = cpu.cuda().forward_dense(ids)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
