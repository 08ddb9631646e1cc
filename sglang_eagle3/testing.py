"""Tiny random checkpoints in the real on-disk layouts, for tests and benchmarks (no downloads here)."""

from __future__ import annotations

import math
import os

import torch

from sglang_eagle3.config import DraftConfig, ModelConfig, RopeConfig


def tiny_config(*, vocab=256, hidden=64, layers=4, heads=4, q_lora=32, kv_lora=32, nope=16, rope=8, v=16,
                experts=8, top_k=2, n_group=2, topk_group=1, shared=1, dense=1, moe_inter=32, inter=96,
                scaling=2.5, yarn=False, max_pos=512, eos=None) -> ModelConfig:
    rope_cfg = RopeConfig(theta=10000.0)
    if yarn:
        rope_cfg = RopeConfig(theta=50000.0, kind="yarn", factor=4.0, original_max_position_embeddings=128,
                              beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0)
    return ModelConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, moe_intermediate_size=moe_inter,
        num_hidden_layers=layers, num_attention_heads=heads, q_lora_rank=q_lora, kv_lora_rank=kv_lora,
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, n_routed_experts=experts,
        num_experts_per_tok=top_k, n_shared_experts=shared, first_k_dense_replace=dense, n_group=n_group,
        topk_group=topk_group, norm_topk_prob=True, routed_scaling_factor=scaling, scoring_func="sigmoid",
        topk_method="noaux_tc", rms_norm_eps=1e-6, max_position_embeddings=max_pos, rope=rope_cfg,
        eos_token_id=() if eos is None else (eos,))


def tiny_draft_config(target: ModelConfig, *, draft_vocab=None, heads=4, kv_heads=2, inter=96,
                      aux_ids=None) -> DraftConfig:
    return DraftConfig(hidden_size=target.hidden_size, intermediate_size=inter, num_attention_heads=heads,
                       num_key_value_heads=kv_heads, head_dim=target.hidden_size // heads,
                       vocab_size=target.vocab_size, draft_vocab_size=draft_vocab or target.vocab_size,
                       rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=target.max_position_embeddings,
                       aux_layer_ids=None if aux_ids is None else tuple(aux_ids))


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int, scale: float = 1.0) -> torch.nn.Module:
    """Fills parameters with N(0, scale/sqrt(fan_in)) (norm weights near 1, biases small), deterministically.

    ``scale`` > 1 makes logits peaked, which keeps greedy argmax far from ties in exactness tests."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dtype in (torch.int32, torch.int64, torch.bool):
            continue
        if name.endswith("norm.weight") or "layernorm" in name:
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        elif name.endswith("e_score_correction_bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1]
            p.copy_(torch.randn(p.shape, generator=g) * (scale / math.sqrt(fan_in)))
    return model


def verify_batch_on_cpu(model, *, T: int, bs: int, dtype: torch.dtype, backend: str, num_pages: int,
                        page_size: int, max_context: int, min_ctx: int, max_ctx: int, pages_per_req: int,
                        seed: int):
    """A CPU ModelRunner (graphs off) around ``model`` with random KV caches, and ``bs`` verify rows of T random
    tokens over random contexts in [min_ctx, max_ctx) on disjoint pages from 1 up (page 0 stays the dummy
    page padded rows write to): what tests feed ``runner.build`` to drive one verify forward."""
    from sglang_eagle3.runtime.model_runner import ModelRunner

    runner = ModelRunner(model, None, aux_layer_ids=(), num_pages=num_pages, page_size=page_size,
                         max_context=max_context, device=torch.device("cpu"), dtype=dtype, use_cuda_graph=False,
                         cuda_graph_max_bs=bs, verify_widths=(T,), attention_backend=backend, moe_backend=backend)
    g = torch.Generator().manual_seed(seed)
    for kv in runner.target_kv.layers:
        kv.copy_(torch.randn(kv.shape, generator=g))
    vocab = model.config.vocab_size
    rows = [(torch.randint(0, vocab, (T,), generator=g).tolist(),
             int(torch.randint(min_ctx, max_ctx, (1,), generator=g)),
             [1 + pages_per_req * b + i for i in range(pages_per_req)]) for b in range(bs)]
    return runner, rows


def random_d2t(draft, seed: int) -> None:
    """A random draft vocabulary (sorted subset of the target's), as d2t offsets and the t2d mask."""
    cfg = draft.config
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(cfg.vocab_size, generator=g)[: cfg.draft_vocab_size].sort().values
    draft.d2t.copy_(chosen - torch.arange(cfg.draft_vocab_size))
    draft.t2d.zero_()
    draft.t2d[chosen] = True


def write_tiny_pair(root: str, cfg: ModelConfig, dcfg: DraftConfig | None = None, *, seed: int = 0,
                    scale: float = 1.0, dtype=torch.float32, max_shard_bytes: int | None = None,
                    draft_naming: str = "midlayer") -> tuple[str, str | None]:
    """Writes a random target (and draft) in Hugging Face layout under root; returns their paths."""
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.models.eagle3 import Eagle3Draft
    from sglang_eagle3.models.loader import save_hf

    target = randomize(DeepseekV3ForCausalLM(cfg, dtype=dtype), seed, scale)
    tpath = os.path.join(root, "target")
    save_hf(target, tpath, max_shard_bytes=max_shard_bytes)
    if dcfg is None:
        return tpath, None
    draft = randomize(Eagle3Draft(dcfg, dtype=dtype), seed + 1, scale)
    if dcfg.draft_vocab_size != dcfg.vocab_size:
        random_d2t(draft, seed + 2)
    dpath = os.path.join(root, "draft")
    save_hf(draft, dpath)
    if draft_naming == "layers.0":
        from safetensors.torch import load_file, save_file

        f = os.path.join(dpath, "model.safetensors")
        sd = load_file(f)
        save_file({k.replace("midlayer.", "layers.0.", 1): v for k, v in sd.items()}, f)
    return tpath, dpath
