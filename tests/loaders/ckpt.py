"""Tiny checkpoints in the layouts users download, each paired with a float32 reference model that holds the
dequantised weights, so a test can compare the loaded model's logits with the reference's.

The quantisers here are written from the format descriptions (compressed-tensors pack-quantized, DeepSeek-V3
block FP8); the dequantisation the references use is ``kernels.quant`` (not the loader's own code).
"""

from __future__ import annotations

import json
import math
import os
import re

import torch
from safetensors.torch import load_file, save_file

from sglang_eagle3.config import ModelConfig
from sglang_eagle3.kernels.quant import dequant_fp8_block, quantize_int4, unpack_int4
from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.loader import hf_state_dict, write_safetensors
from sglang_eagle3.testing import randomize, tiny_config

# Kimi's ignore list (the form Kimi-K2-Thinking / K3 configs publish; K2.5's is of the same kind): regexes
# for attention, shared experts and the dense MLP, the head, and the vision side.
KIMI_IGNORE = ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
               "re:.*vision_tower.*", "re:.*mm_projector.*"]


def kimi_quant_config(ignore=None, **weights) -> dict:
    w = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32, "dynamic": False,
         "observer": "minmax", "observer_kwargs": {}, "actorder": None, "block_structure": None, **weights}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "input_activations": None,
                                          "output_activations": None}},
            "ignore": KIMI_IGNORE if ignore is None else ignore, "kv_cache_scheme": None}


FP8_QUANT_CONFIG = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}


def int4_config(**overrides) -> ModelConfig:
    """Tiny DeepSeek-V3 shapes that INT4 (group 32) and TP=2 both divide: hidden 64, expert intermediate 64."""
    base = dict(vocab=96, hidden=64, layers=3, heads=2, q_lora=16, kv_lora=16, nope=8, rope=4, v=8, experts=4,
                top_k=2, n_group=2, topk_group=1, shared=1, dense=1, moe_inter=64, inter=96, max_pos=64)
    return tiny_config(**{**base, **overrides})


def fp8_config(**overrides) -> ModelConfig:
    """Shapes that straddle 128-blocks (144, 272) so that TP slices cut through blocks."""
    base = dict(vocab=96, hidden=144, layers=3, heads=2, q_lora=16, kv_lora=16, nope=8, rope=4, v=8, experts=4,
                top_k=2, n_group=2, topk_group=1, shared=1, dense=1, moe_inter=32, inter=272, max_pos=64)
    return tiny_config(**{**base, **overrides})


def plain_model(cfg: ModelConfig, seed: int, bf16_exact: bool = True, scale: float = 3.0) -> DeepseekV3ForCausalLM:
    """A float32 random model; with bf16_exact every value is representable in bf16 (checkpoints in bf16 are
    then lossless, as Kimi's and DeepSeek's are for their unquantised tensors)."""
    m = randomize(DeepseekV3ForCausalLM(cfg, dtype=torch.float32), seed, scale=scale)
    if bf16_exact:
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(p.bfloat16().float())
    return m


def kimi_wrapper_config(cfg: ModelConfig, quant: dict | None) -> dict:
    text = cfg.to_hf()
    text["model_type"] = "kimi_k2"
    out = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
           "vision_config": {"patch_size": 14, "hidden_size": 16}, "ignore_index": -100}
    if quant is not None:
        out["quantization_config"] = quant
    return out


VISION_TENSORS = {"vision_tower.patch_embed.proj.weight": (16, 3, 2, 2), "vision_tower.encoder.blocks.0.wqkv.weight":
                  (48, 16), "mm_projector.proj.0.weight": (64, 16)}


@torch.no_grad()
def write_kimi_int4(root: str, cfg: ModelConfig, *, seed: int = 0, n_shards: int = 3, quant: dict | None = None,
                    inner_model_prefix: bool = True, scale: float = 3.0) -> tuple[str, DeepseekV3ForCausalLM]:
    """Kimi-K2.5 layout: wrapper config with text_config, tensors under language_model. (or language_model.
    without the inner model. when inner_model_prefix=False), routed experts pack-quantized INT4 with bf16 scales
    and weight_shape, vision tensors beside them, n_shards shards + index. Returns (path, float32 reference)."""
    ref = plain_model(cfg, seed, scale=scale)
    packed = DeepseekV3ForCausalLM(cfg, dtype=torch.float32, int4_experts=True)
    ref_params = dict(ref.named_parameters())
    for name, p in packed.named_parameters():
        if name in ref_params:
            p.copy_(ref_params[name])
    for layer, rlayer in zip(packed.model.layers, ref.model.layers, strict=True):
        if not hasattr(layer.mlp, "experts"):
            continue
        ex, rex = layer.mlp.experts, rlayer.mlp.experts
        for which in ("w13", "w2"):
            w = getattr(rex, f"{which}_weight")
            q, scale = quantize_int4(w.bfloat16(), 32)  # bf16 scales, as Kimi ships them
            getattr(ex, f"{which}_weight_packed").copy_(q)
            getattr(ex, f"{which}_weight_scale").copy_(scale.float())
            w.copy_(unpack_int4(q, scale, 32))  # the reference holds exactly what the checkpoint encodes
    sd = {k: (v.bfloat16() if v.is_floating_point() and not k.endswith("e_score_correction_bias") else v)
          for k, v in hf_state_dict(packed).items()}
    if not inner_model_prefix:
        sd = {re.sub(r"^model\.", "", k): v for k, v in sd.items()}
    sd = {"language_model." + k: v for k, v in sd.items()}
    g = torch.Generator().manual_seed(seed + 7)
    sd.update({k: torch.randn(s, generator=g).bfloat16() for k, s in VISION_TENSORS.items()})
    path = os.path.join(root, "kimi")
    write_sharded(sd, path, kimi_wrapper_config(cfg, kimi_quant_config() if quant is None else quant), n_shards)
    return path, ref


def write_sharded(sd: dict[str, torch.Tensor], path: str, config: dict, n_shards: int) -> None:
    """n_shards shards of consecutive names (+ index), or one model.safetensors when n_shards == 1."""
    if n_shards == 1:
        write_safetensors({k: v.contiguous() for k, v in sd.items()}, path, config)
        return
    keys = list(sd)
    per = math.ceil(len(keys) / n_shards)
    write_shards(path, config, [{k: sd[k] for k in keys[i * per:(i + 1) * per]} for i in range(n_shards)])


def write_shards(path: str, config: dict, shards: list[dict[str, torch.Tensor]]) -> None:
    """Explicit shards, named as the Hub names them, with model.safetensors.index.json."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    wm = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({k: v.contiguous() for k, v in shard.items()}, os.path.join(path, fname))
        wm.update({k: fname for k in shard})
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f, indent=1)


def fp8_quantize(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """w float [N, K] -> (float8_e4m3fn [N, K], scale_inv float32 [ceil(N/b), ceil(K/b)]) with
    w ~= fp8 * scale_inv per block (scale_inv = block amax / 448)."""
    N, K = w.shape
    nb, kb = math.ceil(N / block), math.ceil(K / block)
    padded = torch.zeros(nb * block, kb * block)
    padded[:N, :K] = w.float()
    blocks = padded.view(nb, block, kb, block)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)  # [nb, kb]
    q = (blocks / scale[:, None, :, None]).view(nb * block, kb * block)[:N, :K].to(torch.float8_e4m3fn)
    return q, scale


_FP8_LINEAR = re.compile(r"\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj|gate_proj|up_proj|down_proj)"
                         r"\.weight$")


@torch.no_grad()
def write_deepseek_fp8(root: str, cfg: ModelConfig, *, seed: int = 0, scales_in_last_shard: bool = True,
                       mtp_layer: bool = True) -> tuple[str, DeepseekV3ForCausalLM]:
    """DeepSeek-V3 layout: every linear weight except lm_head in block FP8 with weight_scale_inv (embedding,
    norms, router and head in bf16), a multi-token-prediction layer L to be skipped, 3 shards with every scale
    in the last one (so each FP8 weight pairs with a scale from another shard)."""
    ref = plain_model(cfg, seed)
    sd = {}
    for k, v in hf_state_dict(ref).items():
        if _FP8_LINEAR.search(k):
            q, s = fp8_quantize(v)
            sd[k], sd[k + "_scale_inv"] = q, s
        elif k.endswith("e_score_correction_bias"):
            sd[k] = v
        else:
            sd[k] = v.bfloat16()
    _write_reference_weights(ref, {k: dequant_fp8_block(v, sd[k + "_scale_inv"]) for k, v in sd.items()
                                   if v.dtype == torch.float8_e4m3fn})
    if mtp_layer:
        L, H = cfg.num_hidden_layers, cfg.hidden_size
        sd.update({f"model.layers.{L}.enorm.weight": torch.ones(H).bfloat16(),
                   f"model.layers.{L}.eh_proj.weight": torch.zeros(H, 2 * H).bfloat16()})
    config = cfg.to_hf()
    config["quantization_config"] = dict(FP8_QUANT_CONFIG)
    if mtp_layer:
        config["num_nextn_predict_layers"] = 1  # as DeepSeek-V3's config.json declares its MTP layer
    path = os.path.join(root, "dsv3fp8")
    if scales_in_last_shard:
        weights = [k for k in sd if not k.endswith("_scale_inv")]
        half = len(weights) // 2
        write_shards(path, config, [{k: sd[k] for k in weights[:half]}, {k: sd[k] for k in weights[half:]},
                                    {k: v for k, v in sd.items() if k.endswith("_scale_inv")}])
    else:
        write_sharded(sd, path, config, 3)
    return path, ref


def _write_reference_weights(ref: DeepseekV3ForCausalLM, hf_weights: dict[str, torch.Tensor]) -> None:
    """Puts dequantised per-expert / per-module weights (HF names) into the reference model."""
    params = dict(ref.named_parameters())
    for k, v in hf_weights.items():
        m = re.match(r"^(.*\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$", k)
        if m:
            base, e, proj = m.group(1), int(m.group(2)), m.group(3)
            if proj == "down":
                params[f"{base}.w2_weight"][e].copy_(v)
            else:
                w13 = params[f"{base}.w13_weight"]
                half = w13.shape[1] // 2
                (w13[e, :half] if proj == "gate" else w13[e, half:]).copy_(v)
        else:
            params[k].copy_(v)


def edit_checkpoint(path: str, fn) -> None:
    """Rewrites every shard through fn(dict) -> dict, keeping the index consistent (tests of bad inputs)."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    wm = {}
    for f in files:
        sd = fn(load_file(os.path.join(path, f)), f)
        save_file(sd, os.path.join(path, f))
        wm.update({k: f for k in sd})
    if os.path.exists(index_path):
        with open(index_path, "w") as fh:
            json.dump({"metadata": {}, "weight_map": wm}, fh)


def edit_config(path: str, fn) -> None:
    """fn edits the config dict in place (its return value is ignored, so lambdas may use pop/update)."""
    cfg_path = os.path.join(path, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    fn(cfg)
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
