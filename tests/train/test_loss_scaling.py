"""Loss scaling for float16 autocast training (``--dtype float16`` of the trainers): without it, gradients below
float16's smallest subnormal (~6e-8) flush to zero in the backward pass and their updates are lost."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
from sglang_eagle3.models.eagle3 import Eagle3Draft
from sglang_eagle3.testing import randomize, tiny_config, tiny_draft_config
from sglang_eagle3.train import draft as draft_train
from sglang_eagle3.train import target as target_train
from sglang_eagle3.train.target import autocast, loss_scaler, optimizer_step

CPU = torch.device("cpu")


def _one_update(amp_dtype, scaler_dtype, loss_scale: float, seed: int) -> torch.Tensor:
    """The change one SGD step makes to a linear layer's weight, its loss scaled down by loss_scale so that the
    gradient reaching the float16 matmul's backward is below float16's range."""
    g = torch.Generator().manual_seed(seed)
    w = torch.nn.Parameter(torch.randn(24, 40, generator=g) * 0.1)
    x = torch.randn(7, 40, generator=g)
    opt = torch.optim.SGD([w], lr=1.0 / loss_scale)  # the update itself lands at the weights' scale
    with autocast(CPU, amp_dtype):
        y = F.linear(x, w)
    loss = y.float().square().sum() * loss_scale
    before = w.detach().clone()
    optimizer_step(loss, opt, [w], grad_clip=1e30, scaler=loss_scaler(CPU, scaler_dtype))
    return w.detach() - before


def test_float16_gradients_below_its_range_still_update_the_weights():
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    ref = _one_update(None, None, 1e-9, seed)  # float32 throughout
    assert ref.abs().max() > 1e-3
    scaled = _one_update(torch.float16, torch.float16, 1e-9, seed)
    torch.testing.assert_close(scaled, ref, rtol=2e-2, atol=2e-3 * ref.abs().max().item())
    # What the scaler is for: the same step unscaled loses the update (every gradient flushed to zero).
    assert _one_update(torch.float16, None, 1e-9, seed).abs().max() == 0


@pytest.mark.parametrize("amp_dtype,enabled", [(torch.float16, True), (torch.bfloat16, False), (None, False)])
def test_loss_scaling_only_for_float16(amp_dtype, enabled):
    assert loss_scaler(CPU, amp_dtype).is_enabled() is enabled


def test_a_step_with_inf_gradients_is_skipped_and_the_scale_halved():
    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = loss_scaler(CPU, torch.float16)
    scale0 = scaler.get_scale()
    optimizer_step((w * float("inf")).sum(), opt, [w], grad_clip=1.0, scaler=scaler)
    assert torch.equal(w.detach(), torch.ones(4)) and scaler.get_scale() == scale0 / 2


def _recording(monkeypatch, module):
    seen = []
    real = module.optimizer_step

    def step(loss, opt, params, grad_clip, scaler):
        seen.append(scaler.is_enabled())
        return real(loss, opt, params, grad_clip, scaler)

    monkeypatch.setattr(module, "optimizer_step", step)
    return seen


@pytest.mark.parametrize("amp_dtype", [torch.float16, torch.bfloat16])
def test_both_trainers_scale_float16_losses(monkeypatch, amp_dtype):
    cfg = tiny_config(vocab=96, hidden=64, layers=3)
    target = randomize(DeepseekV3ForCausalLM(cfg, dtype=torch.float32), 0)
    # The draft trainer.
    seen = _recording(monkeypatch, draft_train)
    dcfg = tiny_draft_config(cfg, draft_vocab=48, aux_ids=(0, 1, 2))
    draft = randomize(Eagle3Draft(dcfg, dtype=torch.float32), 1)
    seqs = torch.randint(0, 96, (4, 10))
    ids = torch.arange(48)
    tcfg = draft_train.DraftTrainConfig(steps=2, batch_size=2, warmup_steps=1, ttt_steps=2, log_every=1)
    res = draft_train.train_draft(target, draft, seqs, ids, (0, 1, 2), tcfg, CPU, amp_dtype)
    assert seen == [amp_dtype == torch.float16] * 2 and all(h["loss"] == h["loss"] for h in res.history)
    # The target trainer.
    seen = _recording(monkeypatch, target_train)
    stream = torch.randint(0, 96, (400,)).numpy()
    ttcfg = target_train.TargetTrainConfig(steps=2, batch_size=2, seq_len=12, warmup_steps=1, eval_every=2)
    target_train.train_target(target, stream, {}, ttcfg, CPU, amp_dtype)
    assert seen == [amp_dtype == torch.float16] * 2
