"""Training-time MoE replacement: same function as the engine's MoE block, differentiable, restored after."""

from __future__ import annotations

import torch

from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.testing import randomize, tiny_config
from sglang_eagle3.train.modules import training_mode, update_routing_bias


def _model(seed=0):
    torch.manual_seed(seed)
    return randomize(DeepseekV3ForCausalLM(tiny_config(), dtype=torch.float32), seed)


def test_training_moe_matches_engine_moe():
    model = _model()
    moe = model.model.layers[1].mlp
    x = torch.randn(2, 37, model.config.hidden_size)
    ref = moe(x)
    with training_mode(model):
        out = moe(x)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_training_mode_is_differentiable_and_restored():
    model = _model()
    for p in model.parameters():
        p.requires_grad_(True)
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    with training_mode(model, dropout=0.1, track_load=True):
        logits, _ = model.forward_dense(ids)
        logits.logsumexp(-1).mean().backward()
        moe = model.model.layers[1].mlp
        assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0
        assert moe.experts.w13_weight.grad.abs().sum() > 0
        assert moe.experts.train_load.sum() == 2 * 16 * model.config.num_experts_per_tok
        before = moe.gate.e_score_correction_bias.clone()
        ratio = update_routing_bias(model, 1e-3)
        assert ratio is not None and ratio >= 1.0
        assert not torch.equal(before, moe.gate.e_score_correction_bias)
    for layer in model.model.layers:
        assert "forward" not in vars(layer.mlp)  # the class method is back
        assert not layer.mlp._forward_hooks and not layer.self_attn.o_proj._forward_hooks
