"""EAGLE-3 draft training with training-time test (TTT), the draft vocabulary, greedy data generation and
an accept-length simulation.

Indexing (REFERENCE.md's wiring): draft input at index i pairs the target's aux hidden state at position i
with token i+1 and predicts token i+2. Training unrolls ``ttt_steps`` steps the way the engine drafts: step
k at index i sits at position i+k, takes the previous step's output hidden state at index i (its own
prediction, not the target's), and attends to the step-0 keys of positions <= i (made from target hidden
states, as the engine's draft cache holds them after each verify) plus the keys of its own steps 1..k at
index i. This is the mask EAGLE-3 and SpecForge use.

The token fed at step k >= 1 is the sequence's token i+1+k. That is the draft's own proposal whenever the
chain is still being accepted, which is the only case in which step k's output is ever used; so step k's
loss at index i counts only where tokens i+2 .. i+1+k are the target's greedy choices (always true on text
the target generated itself; on plain corpus text it masks the positions where the target would have
diverged). Labels are the target's own distribution (soft cross-entropy over the draft vocabulary, as
SpecForge does); accuracy is against the target's argmax over its full vocabulary, which is what verify
compares.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from sglang_eagle3.train.modules import reference_kernels, training_mode
from sglang_eagle3.train.target import (
    CosineSchedule,
    autocast,
    loss_scaler,
    make_optimizer,
    optimizer_step,
    schedule_step,
)

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------------------------
# Draft vocabulary
# ------------------------------------------------------------------------------------------------------
def build_draft_vocab(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """The ``draft_vocab_size`` most frequent target tokens, in ascending id order (as SpecForge orders them).

    Returns (draft_ids int64 [Vd], d2t int64 [Vd] with target = draft + d2t[draft], t2d bool [V]).
    Ties (and tokens never seen) are broken by the lower id, so the result is deterministic.
    """
    V = token_counts.numel()
    if not 0 < draft_vocab_size <= V:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in [1, vocab={V}]")
    counts = token_counts.double().cpu()
    # Stable sort by descending count keeps ascending ids among equal counts.
    order = torch.sort(-counts, stable=True).indices[:draft_vocab_size]
    draft_ids = torch.sort(order).values
    d2t = draft_ids - torch.arange(draft_vocab_size)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    return draft_ids, d2t, t2d


def vocab_coverage(token_counts: torch.Tensor, draft_ids: torch.Tensor) -> float:
    """Fraction of counted tokens that the draft vocabulary can propose."""
    total = token_counts.sum().item()
    return token_counts[draft_ids].sum().item() / total if total else 1.0


# ------------------------------------------------------------------------------------------------------
# Greedy generation with the target (dense forward, no KV cache: fine for small targets)
# ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def generate_greedy(target: nn.Module, prompts: list[list[int]], new_tokens: int, batch_size: int,
                    device: torch.device, amp_dtype: torch.dtype | None = None,
                    eos_id: int | None = None, progress=None,
                    progress_interval_s: float | None = None) -> list[list[int]]:
    """Greedy continuations of ``new_tokens`` tokens (cut after the first ``eos_id`` when given).

    Prompts of different lengths share a batch right-padded: with causal attention a pad never influences
    the positions before it, so each row reads its logits at its own last position.

    ``progress(done, total)`` counts generated tokens (``total`` = prompts x ``new_tokens``): called after every
    batch and, with ``progress_interval_s``, also within a batch once that many seconds have passed (a batch of a
    large target can take minutes).
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"generate_greedy: batch_size={batch_size!r} must be a positive integer")
    if not isinstance(new_tokens, int) or new_tokens < 0:
        raise ValueError(f"generate_greedy: new_tokens={new_tokens!r} must be an integer >= 0")
    out: list[list[int]] = []
    total = len(prompts) * new_tokens
    last_report = time.perf_counter()
    with training_mode(target):
        for start in range(0, len(prompts), batch_size):
            chunk = prompts[start:start + batch_size]
            lens = torch.tensor([len(p) for p in chunk], device=device)
            buf = torch.zeros(len(chunk), int(lens.max()) + new_tokens, dtype=torch.long, device=device)
            for r, p in enumerate(chunk):
                buf[r, :len(p)] = torch.tensor(p, dtype=torch.long)
            rows = torch.arange(len(chunk), device=device)
            for t in range(new_tokens):
                with autocast(device, amp_dtype):
                    logits, _ = target.forward_dense(buf[:, :int(lens.max())])
                nxt = logits[rows, lens - 1].argmax(-1)  # [b]
                buf[rows, lens] = nxt
                lens = lens + 1
                if (progress is not None and progress_interval_s is not None and t + 1 < new_tokens
                        and time.perf_counter() - last_report >= progress_interval_s):
                    progress(start * new_tokens + (t + 1) * len(chunk), total)
                    last_report = time.perf_counter()
            for r, p in enumerate(chunk):
                seq = buf[r, :len(p) + new_tokens].tolist()
                if eos_id is not None and eos_id in seq[len(p):]:
                    seq = seq[:seq.index(eos_id, len(p)) + 1]
                out.append(seq)
            if progress is not None:
                progress((start + len(chunk)) * new_tokens, total)
                last_report = time.perf_counter()
    return out


def target_features(target: nn.Module, ids: torch.Tensor, aux_layer_ids: tuple[int, ...],
                    amp_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits float32 [B, S, V], fc input cat(aux) [B, S, 3H]) from one dense target forward."""
    with torch.no_grad(), autocast(ids.device, amp_dtype):
        logits, aux = target.forward_dense(ids, aux_layer_ids)
    return logits.float(), torch.cat(aux, dim=-1)


# ------------------------------------------------------------------------------------------------------
# One draft step with the TTT attention
# ------------------------------------------------------------------------------------------------------
def _attend(attn: nn.Module, q: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """q [B, S, h, D]; keys[0] = step 0's (k, v) [B, S, kv, D] seen causally; keys[j >= 1] seen only at the
    same index (the query's own chain). Returns [B, S, h, D]."""
    S = q.shape[1]
    rep = attn.num_heads // attn.num_kv_heads
    k0, v0 = (t.repeat_interleave(rep, dim=2) for t in keys[0])
    scores = torch.einsum("bshd,bthd->bhst", q, k0).float() * attn.scale  # [B, h, S, S]
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    own = [(q * k.repeat_interleave(rep, dim=2)).sum(-1).float().transpose(1, 2) * attn.scale
           for k, _ in keys[1:]]  # each [B, h, S]
    if own:
        scores = torch.cat([scores, torch.stack(own, dim=-1)], dim=-1)  # [B, h, S, S + steps]
    probs = scores.softmax(-1)
    o = torch.einsum("bhst,bthd->bshd", probs[..., :S].to(v0.dtype), v0)
    for j, (_, v) in enumerate(keys[1:]):
        p = probs[..., S + j].transpose(1, 2).unsqueeze(-1)  # [B, S, h, 1]
        o = o + p.to(v.dtype) * v.repeat_interleave(rep, dim=2)
    return o


def draft_step(draft: nn.Module, embed_weight: torch.Tensor, tokens: torch.Tensor, hidden: torch.Tensor,
               positions: torch.Tensor, keys: list[tuple[torch.Tensor, torch.Tensor]]):
    """One unrolled step of the draft over [B, S].

    hidden: [B, S, 3H] (target aux, step 0) or [B, S, H] (previous step's output). Returns
    (draft logits float32 [B, S, Vd], pre-norm output hidden [B, S, H], keys with this step's (k, v) added).
    Same computation as ``Eagle3Draft.forward_dense`` with the TTT mask (tests/train check this).
    """
    layer = draft.midlayer
    attn = layer.self_attn
    embeds = F.embedding(tokens, embed_weight)
    if hidden.shape[-1] != draft.config.hidden_size:
        hidden = draft.fc(hidden)  # [B, S, 3H] -> [B, S, H]
    residual = hidden
    x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)  # [B, S, 2H]
    q = attn.q_proj(x).unflatten(-1, (attn.num_heads, attn.head_dim))
    k = attn.k_proj(x).unflatten(-1, (attn.num_kv_heads, attn.head_dim))
    v = attn.v_proj(x).unflatten(-1, (attn.num_kv_heads, attn.head_dim))
    q, k = attn.rotary.rotate(q, positions), attn.rotary.rotate(k, positions)
    keys = keys + [(k, v)]
    h = attn.o_proj(_attend(attn, q, keys).flatten(-2)) + residual
    out = h + layer.mlp(layer.post_attention_layernorm(h))
    return draft.lm_head(draft.norm(out)).float(), out, keys


def _shift(x: torch.Tensor, k: int, fill=0) -> torch.Tensor:
    """x[:, k:] padded back to length with ``fill`` (index i of the result holds x[:, i + k])."""
    if k == 0:
        return x
    pad = torch.full_like(x[:, :k], fill)
    return torch.cat([x[:, k:], pad], dim=1)


def ttt_loss(draft: nn.Module, embed_weight: torch.Tensor, tokens: torch.Tensor, fc_in: torch.Tensor,
             target_logits: torch.Tensor, draft_ids: torch.Tensor, steps: int, decay: float,
             loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float], list[float]]:
    """Training-time-test loss over [B, S] sequences.

    fc_in [B, S, 3H] and target_logits [B, S, V] come from one target forward over ``tokens``; loss_mask
    [B, S] (optional) marks positions whose *label* token may be learned from. Returns (weighted loss,
    per-step losses, per-step accuracies).
    """
    B, S = tokens.shape
    n = S - 1  # index i: hidden at i, token i+1, label = target's output at position i+1 (token i+2)
    labels = target_logits[:, 1:]  # [B, n, V]
    top = labels.argmax(-1)  # [B, n]
    soft = labels[..., draft_ids].softmax(-1)  # [B, n, Vd]
    greedy = tokens[:, 1:] == target_logits[:, :-1].argmax(-1)  # [B, n]: token j+1 is the target's choice
    valid = torch.ones(B, n, dtype=torch.bool, device=tokens.device)
    # learnable[i]: the label of index i (token i+2) may be learned from; shifted by k for step k.
    learnable = torch.ones_like(valid) if loss_mask is None else _shift(loss_mask[:, 1:].bool(), 1, False)
    positions = torch.arange(n, device=tokens.device).expand(B, n)
    hidden, keys = fc_in[:, :n], []
    total = torch.zeros((), device=tokens.device)
    step_losses, step_accs = [], []
    weight_sum = 0.0
    for k in range(steps):
        if k > 0:  # step k's chain fed tokens i+2 .. i+1+k: all must be the target's greedy choices
            valid = valid & _shift(greedy, k, False)
        step_valid = valid & _shift(learnable, k, False)  # also False for i >= n - k (no label)
        logits, hidden, keys = draft_step(draft, embed_weight, _shift(tokens[:, 1:], k), hidden, positions + k,
                                          keys)
        if not step_valid.any():
            break
        logp = logits.log_softmax(-1)
        ce = -(_shift(soft, k) * logp).sum(-1)  # [B, n]
        loss_k = ce[step_valid].mean()
        pred = logits.argmax(-1)
        acc_k = ((pred + draft.d2t[pred]) == _shift(top, k))[step_valid].float().mean()
        w = decay ** k
        total = total + w * loss_k
        weight_sum += w
        step_losses.append(loss_k.detach())
        step_accs.append(acc_k.detach())
    return total / max(weight_sum, 1e-9), [x.item() for x in step_losses], [x.item() for x in step_accs]


# ------------------------------------------------------------------------------------------------------
# Accept-length simulation (greedy chain, topk=1)
# ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def chain_proposals(draft: nn.Module, embed_weight: torch.Tensor, tokens: torch.Tensor, fc_in: torch.Tensor,
                    steps: int) -> torch.Tensor:
    """For every index i of [B, S] sequences, the chain of ``steps`` target ids the draft proposes after
    the target verified tokens 0..i+1 (it feeds its own predictions back): [B, S-1, steps]."""
    B, S = tokens.shape
    n = S - 1
    positions = torch.arange(n, device=tokens.device).expand(B, n)
    tok, hidden, keys, out = tokens[:, 1:], fc_in[:, :n], [], []
    for k in range(steps):
        logits, hidden, keys = draft_step(draft, embed_weight, tok, hidden, positions + k, keys)
        pred = logits.argmax(-1)
        tok = pred + draft.d2t[pred]
        out.append(tok)
    return torch.stack(out, dim=-1)


def simulate_accept(seq: list[int], prompt_len: int, proposals: torch.Tensor, k: int) -> tuple[int, int]:
    """Greedy speculative decoding of ``seq`` (prompt + the target's greedy continuation) with ``k`` draft
    tokens per round. The prefill makes the first token; each verify forward then yields the accepted
    drafts plus one token of its own. Returns (tokens produced by verify forwards, verify forwards)."""
    L = len(seq)
    props = proposals.tolist()
    last, produced, rounds = prompt_len, 0, 0  # ``last``: index of the newest verified token
    while last < L - 1:
        chain = props[last - 1][:k]  # the draft's index last-1 pairs hidden last-1 with token ``last``
        a = 0
        while a < k and last + 1 + a < L and chain[a] == seq[last + 1 + a]:
            a += 1
        step = min(a + 1, L - 1 - last)
        last += step
        produced += step
        rounds += 1
    return produced, rounds


@torch.no_grad()
def accept_lengths(target: nn.Module, draft: nn.Module, sequences: list[list[int]], prompt_lens: list[int],
                   ks: tuple[int, ...], aux_layer_ids: tuple[int, ...], device: torch.device,
                   amp_dtype: torch.dtype | None = None, batch_size: int = 16) -> dict[int, float]:
    """Average accept length (completion tokens / verify forwards, SGLang's definition) for each k in ks,
    over sequences made by ``generate_greedy``; ``prompt_lens`` gives each sequence's prompt length."""
    embed = target.model.embed_tokens.weight
    produced = dict.fromkeys(ks, 0)
    rounds = dict.fromkeys(ks, 0)
    with training_mode(target), reference_kernels(draft):
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start:start + batch_size]
            width = max(len(s) for s in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long, device=device)
            for r, s in enumerate(chunk):
                ids[r, :len(s)] = torch.tensor(s, dtype=torch.long)
            _, fc_in = target_features(target, ids, aux_layer_ids, amp_dtype)
            with autocast(device, amp_dtype):
                props = chain_proposals(draft, embed, ids, fc_in, max(ks)).cpu()  # [b, S-1, K]
            for r, s in enumerate(chunk):
                for k in ks:
                    p, n = simulate_accept(s, prompt_lens[start + r], props[r], k)
                    produced[k] += p
                    rounds[k] += n
    return {k: produced[k] / max(1, rounds[k]) for k in ks}


# ------------------------------------------------------------------------------------------------------
# Training loop
# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DraftTrainConfig(CosineSchedule):
    steps: int = 2000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 100
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 0.5
    ttt_steps: int = 5  # unrolled steps (SpecForge's ttt_length defaults to 7)
    step_decay: float = 0.8  # loss weight of step k is decay**k (EAGLE-3)
    log_every: int = 100
    log_interval_s: float | None = None  # also log (and record) when this many seconds passed since the last
    seed: int = 0
    time_limit_s: float | None = None  # see TargetTrainConfig.time_limit_s

    def __post_init__(self):
        self.check_schedule()
        if not isinstance(self.ttt_steps, int) or self.ttt_steps < 1:
            raise ValueError(f"DraftTrainConfig: ttt_steps={self.ttt_steps!r} must be a positive integer")
        if self.log_interval_s is not None and not self.log_interval_s > 0:
            raise ValueError(f"DraftTrainConfig: log_interval_s={self.log_interval_s!r} must be > 0 (or None)")


@dataclass
class DraftTrainResult:
    steps_done: int
    steps_planned: int  # after fit_steps_to_time: pass this as ``steps`` to reproduce the run
    wall_s: float
    final_loss: float
    final_step_losses: list[float]
    final_step_accs: list[float]
    history: list[dict] = field(default_factory=list)
    interrupted: bool = False  # stopped early by ``should_stop`` (Ctrl-C)


@torch.no_grad()
def init_draft_weights(draft: nn.Module, target: nn.Module, draft_ids: torch.Tensor, d2t: torch.Tensor,
                       t2d: torch.Tensor, seed: int, std: float = 0.02) -> None:
    """Random init (normal(0, std), norms at one), except lm_head, which starts as the target's head rows
    of the draft vocabulary: the draft then begins by reading its hidden state the way the target does."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    for p in draft.parameters():
        if p.dim() == 1:
            p.fill_(1.0)
        else:
            p.copy_(torch.randn(p.shape, generator=gen) * std)
    if draft.lm_head is not None:
        draft.lm_head.weight.copy_(target.lm_head.weight[draft_ids.to(target.lm_head.weight.device)])
    draft.d2t.copy_(d2t)
    draft.t2d.copy_(t2d)


def train_draft(target: nn.Module, draft: nn.Module, sequences: torch.Tensor, draft_ids: torch.Tensor,
                aux_layer_ids: tuple[int, ...], cfg: DraftTrainConfig, device: torch.device,
                amp_dtype: torch.dtype | None = torch.bfloat16, loss_mask: torch.Tensor | None = None,
                progress=None, should_stop=None) -> DraftTrainResult:
    """Trains ``draft`` (fp32 weights on ``device``) in place on token sequences [N, S] with a frozen
    ``target``. Each step runs the target once over the batch for its logits and aux hidden states.

    ``progress(step, record)`` is called with each history record (every ``log_every`` steps, or
    ``log_interval_s`` seconds, and at the end); ``should_stop()``, checked after every step, ends training
    early (``interrupted`` in the result), between steps so the weights are whole."""
    if sequences.dim() != 2 or len(sequences) == 0 or sequences.shape[1] < 2:
        raise ValueError(f"train_draft needs token sequences [N >= 1, S >= 2], got {list(sequences.shape)}")
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    embed = target.model.embed_tokens.weight.detach()
    draft_ids = draft_ids.to(device)
    named = [(n, p) for n, p in draft.named_parameters()]
    for _, p in named:
        p.requires_grad_(True)
    opt = make_optimizer(named, cfg.lr, cfg.weight_decay, cfg.betas, device)
    scaler = loss_scaler(device, amp_dtype)
    draft.train()
    target.eval()
    history: list[dict] = []
    start = time.perf_counter()
    acc_loss, acc_steps, acc_n, step, probe_t0 = 0.0, None, 0, -1, 0.0
    last_log_t, interrupted = start, False
    step_losses: list[float] = []
    step_accs: list[float] = []
    with training_mode(target), reference_kernels(draft):
        while step + 1 < cfg.steps:
            step += 1
            cfg, probe_t0 = schedule_step(cfg, opt, step, start, probe_t0)
            rows = torch.randint(0, len(sequences), (cfg.batch_size,), generator=gen)
            ids = sequences[rows].to(device)
            mask = loss_mask[rows].to(device) if loss_mask is not None else None
            logits_t, fc_in = target_features(target, ids, aux_layer_ids, amp_dtype)
            with autocast(device, amp_dtype):
                loss, step_losses, step_accs = ttt_loss(draft, embed, ids, fc_in, logits_t, draft_ids,
                                                        cfg.ttt_steps, cfg.step_decay, mask)
            optimizer_step(loss, opt, [p for _, p in named], cfg.grad_clip, scaler)
            acc_loss += loss.item()
            acc_steps = step_accs if acc_steps is None else [a + b for a, b in zip(acc_steps, step_accs, strict=False)]
            acc_n += 1
            last = step == cfg.steps - 1
            now = time.perf_counter()
            over_time = cfg.time_limit_s is not None and now - start > cfg.time_limit_s
            interrupted = should_stop is not None and should_stop() and not last
            due = cfg.log_interval_s is not None and now - last_log_t >= cfg.log_interval_s
            if (step + 1) % cfg.log_every == 0 or last or over_time or interrupted or due:
                step_s = (now - last_log_t) / acc_n  # recent steps, not the first ones' warm-up
                record = {"step": step + 1, "steps": cfg.steps, "loss": acc_loss / acc_n, "lr": cfg.lr_at(step),
                          "acc": [a / acc_n for a in acc_steps], "step_losses": step_losses,
                          "elapsed_s": now - start, "tokens_per_s": ids.numel() / step_s,
                          "eta_s": step_s * (cfg.steps - step - 1)}
                history.append(record)
                if progress is not None:
                    progress(step + 1, record)
                logger.info("draft step %d: %s", step + 1, record)
                acc_loss, acc_steps, acc_n, last_log_t = 0.0, None, 0, now
            if interrupted:
                logger.info("draft training stopped at step %d of %d: interrupted", step + 1, cfg.steps)
                break
            if over_time and not last:
                logger.warning("draft training stopped at step %d of %d: time limit %.0f s reached",
                               step + 1, cfg.steps, cfg.time_limit_s)
                break
    for p in draft.parameters():
        p.requires_grad_(False)
    draft.eval()
    return DraftTrainResult(steps_done=step + 1, steps_planned=cfg.steps, wall_s=time.perf_counter() - start,
                            final_loss=history[-1]["loss"] if history else math.nan,
                            final_step_losses=step_losses, final_step_accs=history[-1]["acc"] if history else [],
                            history=history, interrupted=interrupted)
