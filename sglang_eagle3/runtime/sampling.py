"""Sampling parameters, the target's processed distribution, and lossless acceptance of draft tokens.

Speculation must not change what the user gets: for greedy, the output is the target's argmax chain; for
sampling, every emitted token is distributed exactly as the target's processed distribution p
(temperature, top_k, top_p, min_p applied). Draft tokens are proposed deterministically (the draft's argmax,
i.e. a one-hot proposal q), so the acceptance rule reduces to: accept d with probability p(d); on rejection
sample from p with d removed (renormalised). Emitted token ~ p(d)·δ_d + (1 - p(d))·p(·|≠d) = p.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class SamplingParamsError(ValueError):
    """An invalid sampling parameter; the message names the field and value."""


@dataclass
class SamplingParams:
    """SGLang's sampling_params names. temperature 0 (or top_k 1) is greedy."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None

    @staticmethod
    def from_dict(d: dict | None) -> SamplingParams:
        d = dict(d or {})
        known = set(SamplingParams.__dataclass_fields__)
        unknown = sorted(set(d) - known - {"n", "sampling_seed", "skip_special_tokens", "no_stop_trim"})
        if unknown:
            raise SamplingParamsError(f"unknown sampling parameter(s): {unknown} (known: {sorted(known)})")
        if "sampling_seed" in d and d.get("seed") is None:
            d["seed"] = d["sampling_seed"]
        if d.get("n", 1) != 1:
            raise SamplingParamsError(f"n={d['n']!r} is not supported (only n=1)")
        for k in ("n", "sampling_seed", "skip_special_tokens", "no_stop_trim"):
            d.pop(k, None)
        if isinstance(d.get("stop"), str):
            d["stop"] = [d["stop"]]
        if d.get("stop") is None:
            d["stop"] = []
        if d.get("stop_token_ids") is None:
            d["stop_token_ids"] = []
        p = SamplingParams(**d)
        p.validate()
        return p

    def validate(self) -> None:
        def bad(name, why):
            raise SamplingParamsError(f"{name}={getattr(self, name)!r} {why}")

        def is_num(v):
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) \
                or self.max_new_tokens < 0:
            bad("max_new_tokens", "must be an integer >= 0")
        if not is_num(self.temperature) or not self.temperature >= 0 or self.temperature == float("inf"):
            bad("temperature", "must be a finite number >= 0")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (off) or an integer >= 1")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be in [0, 1]")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            bad("stop", "must be a string or a list of strings")
        if not isinstance(self.stop_token_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            bad("stop_token_ids", "must be a list of integers")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            bad("seed", "must be an integer")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def processed_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """logits float32 [..., V] -> the target's processed distribution [..., V] (sampling params applied)."""
    probs = torch.softmax(logits.float() / max(p.temperature, 1e-6), dim=-1)
    if p.top_k > 0 and p.top_k < probs.shape[-1]:
        kth = probs.topk(p.top_k, dim=-1).values[..., -1:]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.amax(-1, keepdim=True), probs, torch.zeros_like(probs))
    if p.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        keep_sorted = (cum - sorted_p) < p.top_p * cum[..., -1:]
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs / probs.sum(-1, keepdim=True)


def sample_token(logits: torch.Tensor, p: SamplingParams, gen: torch.Generator | None) -> int:
    """One token from logits [V]."""
    if p.greedy:
        return int(logits.argmax())
    probs = processed_probs(logits, p)
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))


def accept_draft(target_logits: torch.Tensor, draft_ids: list[int], p: SamplingParams,
                 gen: torch.Generator | None) -> tuple[int, int]:
    """Chain verification for one request.

    target_logits [k+1, V]: row i is the target's distribution for the token after draft i-1
    (row 0 follows the last committed token). Returns (number of draft tokens accepted a, next token):
    the emitted tokens are draft_ids[:a] followed by the returned token.
    """
    k = len(draft_ids)
    if p.greedy:
        target = target_logits.argmax(-1).tolist()
        a = 0
        while a < k and draft_ids[a] == target[a]:
            a += 1
        return a, target[a]
    probs = processed_probs(target_logits, p).cpu()  # [k+1, V]
    for i, d in enumerate(draft_ids):
        u = torch.rand((), generator=gen)
        if u < probs[i, d]:
            continue
        residual = probs[i].clone()
        residual[d] = 0
        if residual.sum() <= 0:  # p was one-hot on d (cannot reject); keep d
            continue
        return i, int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
    return k, int(torch.multinomial(probs[k], 1, generator=gen))
