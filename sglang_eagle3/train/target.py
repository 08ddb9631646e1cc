"""Pretraining loop for a small DeepSeek-V3-architecture target (the embedded model).

Next-token cross-entropy over random windows of a token stream, AdamW with warmup + cosine decay, bf16
autocast on fp32 master weights, DeepSeek-V3's bias-based expert balancing, residual dropout, and the
best-validation weights kept (the corpus is small: about a million tokens).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3.train.data import WindowSampler
from sglang_eagle3.train.modules import training_mode, update_routing_bias

logger = logging.getLogger(__name__)


class CosineSchedule:
    """Linear warm-up then cosine decay to lr * min_lr_ratio; shared by the target and draft trainers' configs
    (which hold lr, min_lr_ratio, warmup_steps, steps, batch_size and time_limit_s)."""

    def check_schedule(self) -> None:
        """Raises ValueError naming the field: checked in ``__post_init__``, so also under ``python -O``."""
        for name in ("steps", "batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{type(self).__name__}: {name}={value!r} must be a positive integer")
        if not (isinstance(self.lr, (int, float)) and 0 < self.lr < math.inf):
            raise ValueError(f"{type(self).__name__}: lr={self.lr!r} must be a finite number > 0")
        if not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"{type(self).__name__}: warmup_steps={self.warmup_steps!r} must lie in "
                             f"[0, steps={self.steps})")
        if self.time_limit_s is not None and not self.time_limit_s > 0:
            raise ValueError(f"{type(self).__name__}: time_limit_s={self.time_limit_s!r} must be > 0 (or None)")

    def lr_at(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        t = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


@dataclass(frozen=True)
class TargetTrainConfig(CosineSchedule):
    steps: int = 3000
    batch_size: int = 64
    seq_len: int = 512
    lr: float = 2e-3
    min_lr_ratio: float = 0.05  # cosine decays to lr * this
    warmup_steps: int = 200
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    dropout: float = 0.1  # on both residual branches of every layer
    bias_update_rate: float = 1e-3  # DeepSeek-V3's gamma for the routing-bias update
    eval_every: int = 250
    eval_windows: int = 64
    seed: int = 0
    # With a time limit, the step count is cut after a few timed steps so that the whole cosine schedule fits
    # (see fit_steps_to_time); past the limit training also stops, as a safety net.
    time_limit_s: float | None = None

    def __post_init__(self):
        self.check_schedule()
        if not isinstance(self.seq_len, int) or self.seq_len < 2:
            raise ValueError(f"TargetTrainConfig: seq_len={self.seq_len!r} must be an integer >= 2")


def schedule_step(cfg, opt, step: int, start: float, probe_t0: float):
    """Per-step bookkeeping shared by the trainers: times steps PROBE_FROM..PROBE_TO, then fits the step count
    to the time limit (fit_steps_to_time), and sets the learning rate. Returns (cfg, probe_t0)."""
    if step == PROBE_FROM:
        probe_t0 = time.perf_counter()
    if step == PROBE_TO:
        now = time.perf_counter()
        cfg = fit_steps_to_time(cfg, step, now - start, (now - probe_t0) / (PROBE_TO - PROBE_FROM))
    for group in opt.param_groups:
        group["lr"] = cfg.lr_at(step)
    return cfg, probe_t0


def fit_steps_to_time(cfg, step: int, elapsed_s: float, step_s: float, safety: float = 0.85):
    """cfg with ``steps`` lowered so that the remaining steps, at ``step_s`` each, end within the time limit
    (``safety`` leaves room for evaluations); unchanged when the configured steps already fit."""
    if cfg.time_limit_s is None or step_s <= 0:
        return cfg
    fit = step + int(safety * (cfg.time_limit_s - elapsed_s) / step_s)
    if fit >= cfg.steps:
        return cfg
    fit = max(fit, cfg.warmup_steps + 1, step + 1)
    logger.warning("%s: %d steps do not fit in %.0f s at %.1f ms/step; training %d steps instead",
                   type(cfg).__name__, cfg.steps, cfg.time_limit_s, 1e3 * step_s, fit)
    return replace(cfg, steps=fit)


# Steps timed before fit_steps_to_time decides (the first ones pay for allocator warm-up).
PROBE_FROM, PROBE_TO = 5, 25


@dataclass
class TargetTrainResult:
    steps_done: int
    steps_planned: int  # after fit_steps_to_time: pass this as ``steps`` to reproduce the run
    wall_s: float
    final_train_loss: float
    best_step: int
    best_val: dict[str, float]
    history: list[dict] = field(default_factory=list)


@torch.no_grad()
def init_target_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """GPT-style init: normal(0, std) for matrices, the residual-branch outputs scaled by 1/sqrt(2L),
    ones for norms, zeros for the routing bias. Covers every parameter (the engine's model allocates them
    with torch.empty)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    n_layers = len(model.model.layers)
    out_std = std / math.sqrt(2 * n_layers)
    for name, p in model.named_parameters():
        if name.endswith("e_score_correction_bias"):
            p.zero_()
        elif p.dim() == 1:  # RMSNorm weights
            p.fill_(1.0)
        else:
            s = out_std if name.endswith(("o_proj.weight", "down_proj.weight", "w2_weight")) else std
            p.copy_(torch.randn(p.shape, generator=gen) * s)


def trainable_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """Every parameter but the routing bias (moved by the balancing rule, not by gradients). The engine's
    layers create parameters with requires_grad=False; this turns it on for the ones we train."""
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(not name.endswith("e_score_correction_bias"))
        if p.requires_grad:
            params.append((name, p))
    return params


def make_optimizer(named: list[tuple[str, nn.Parameter]], lr: float, weight_decay: float, betas,
                   device: torch.device) -> torch.optim.Optimizer:
    # No decay on norms (1-D); decay on matrices and embeddings.
    decay = [p for n, p in named if p.dim() > 1]
    no_decay = [p for n, p in named if p.dim() <= 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, fused=device.type == "cuda")


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None or dtype == torch.float32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def loss_scaler(device: torch.device, amp_dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """Loss scaling for float16 autocast (off, a pass-through, for bfloat16 / float32): float16 keeps ~5 bits less
    exponent than bfloat16, so activation gradients under ~6e-8 flush to zero and a draft's small late-step
    gradients are lost without it. The scale grows while steps stay finite and halves (the step skipped) on inf."""
    return torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)


def optimizer_step(loss: torch.Tensor, opt: torch.optim.Optimizer, params: list[nn.Parameter], grad_clip: float,
                   scaler: torch.amp.GradScaler) -> torch.Tensor:
    """backward, clip (on unscaled gradients) and step; the gradients' norm before clipping."""
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(opt)
    scaler.update()
    return grad_norm


@torch.no_grad()
def evaluate_loss(model: nn.Module, windows: torch.Tensor, batch_size: int, device: torch.device) -> float:
    """Mean next-token cross-entropy over windows [N, S], in the weights' own dtype.

    NOTE: no autocast here: with autograd off the engine's layers take their inference path, which expects
    activations in the weights' dtype (bf16 activations against fp32 master weights fail there)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch_size):
        ids = windows[i:i + batch_size].to(device)
        with autocast(device, None):
            logits, _ = model.forward_dense(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten(), reduction="sum")
        total += loss.item()
        count += ids[:, 1:].numel()
    model.train(was_training)
    return total / max(1, count)


def train_target(model: nn.Module, train_stream, val_windows: dict[str, torch.Tensor], cfg: TargetTrainConfig,
                 device: torch.device, amp_dtype: torch.dtype | None = torch.bfloat16,
                 progress=None) -> TargetTrainResult:
    """Trains ``model`` (fp32 weights on ``device``) in place; on return it holds the weights with the best
    loss on the first validation set. ``progress(step, dict)`` is called at every evaluation."""
    torch.manual_seed(cfg.seed)
    sampler = WindowSampler(train_stream, cfg.seq_len + 1, cfg.batch_size, cfg.seed)
    named = trainable_parameters(model)
    opt = make_optimizer(named, cfg.lr, cfg.weight_decay, cfg.betas, device)
    scaler = loss_scaler(device, amp_dtype)
    primary = next(iter(val_windows)) if val_windows else None
    best_val, best_step, best_state = math.inf, -1, None
    history: list[dict] = []
    start = time.perf_counter()
    running, n_running, step, probe_t0 = 0.0, 0, -1, 0.0
    model.train()
    with training_mode(model, dropout=cfg.dropout, track_load=cfg.bias_update_rate > 0):
        while step + 1 < cfg.steps:
            step += 1
            cfg, probe_t0 = schedule_step(cfg, opt, step, start, probe_t0)
            ids = sampler.sample(device)  # [B, S+1]
            with autocast(device, amp_dtype):
                logits, _ = model.forward_dense(ids[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
            grad_norm = optimizer_step(loss, opt, [p for _, p in named], cfg.grad_clip, scaler)
            balance = update_routing_bias(model, cfg.bias_update_rate) if cfg.bias_update_rate > 0 else None
            running += loss.item()
            n_running += 1
            last = step == cfg.steps - 1
            over_time = cfg.time_limit_s is not None and time.perf_counter() - start > cfg.time_limit_s
            if (step + 1) % cfg.eval_every == 0 or last or over_time:
                record = {"step": step + 1, "train_loss": running / n_running, "lr": cfg.lr_at(step),
                          "grad_norm": float(grad_norm), "max_load_ratio": balance,
                          "elapsed_s": time.perf_counter() - start}
                for name, windows in val_windows.items():
                    record[f"val_{name}"] = evaluate_loss(model, windows, cfg.batch_size, device)
                history.append(record)
                if progress is not None:
                    progress(step + 1, record)
                logger.info("target step %d: %s", step + 1, record)
                if primary is not None and record[f"val_{primary}"] < best_val:
                    best_val, best_step = record[f"val_{primary}"], step + 1
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
                running, n_running = 0.0, 0
            if over_time and not last:
                logger.warning("target training stopped at step %d of %d: time limit %.0f s reached",
                               step + 1, cfg.steps, cfg.time_limit_s)
                break
    wall = time.perf_counter() - start
    if best_state is not None:
        model.load_state_dict(best_state)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    best = next((h for h in history if h["step"] == best_step), history[-1] if history else {})
    return TargetTrainResult(
        steps_done=step + 1, steps_planned=cfg.steps, wall_s=wall,
        final_train_loss=history[-1]["train_loss"] if history else math.nan,
        best_step=best_step, best_val={k[4:]: v for k, v in best.items() if k.startswith("val_")},
        history=history)
