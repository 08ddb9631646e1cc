"""Routing the benchmarks give a random-weight model's MoE layers instead of its own router's.

A random Kimi-K2.5 slice routes the tokens of one forward to nearly the same experts (its tokens' hidden states
are alike: a verify of 4 tokens sends its 32 (token, expert) pairs to ~10 experts a layer). A trained router
spreads them: DeepSeek-V3-style models (shared experts, load balancing) show little local routing consistency
(Liang et al., "Not All Models Suit Expert Offloading", arXiv 2505.16056), so a verify batch of one request's
consecutive tokens reads close to as many distinct experts as independent draws would. How many experts a step
reads sets both its MoE time and its bandwidth floor, so the benchmarks can draw the routing:

- ``uniform``: each token's top-k experts drawn uniformly without replacement, independently of the others.
- ``reuse:P`` (0 <= P <= 1): a request's first token as ``uniform``; each later token keeps each expert of the
  token before it with probability P and draws the rest uniformly from the experts it has not kept (P = 0 is
  ``uniform``, P = 1 one set of experts for the whole request).
- ``own``: the model's own router (no replacement).

The draws are made on the host before any graph is captured, one fixed routing per MoE layer and row count
(forwards of other row counts, prefills, keep the router's own), stored on the device: a step's forward launches
nothing more than with its own routing (the previous ``UniformRouting`` drew them in the step, a rand, a top-k and
a cast a MoE layer, timed with it: ~0.95 ms of the 61-layer step on an H100, docs/BENCHMARKS.md, fiftieth
session). Every replay then reads the same
experts; 60 layers of them (~5 GB at 32 experts a layer) pass through the 50 MB L2 between two reads of one, so
nothing is cached across replays.
"""

from __future__ import annotations

import torch


def parse_routing(text: str) -> float | None:
    """--routing's value -> the reuse probability (uniform: 0.0), or None for the model's own router."""
    t = text.strip().lower()
    if t == "own":
        return None
    if t == "uniform":
        return 0.0
    name, sep, value = t.partition(":")
    try:
        p = float(value) if name == "reuse" and sep else None
    except ValueError:
        p = None
    if p is None or not 0.0 <= p <= 1.0:
        raise ValueError(f"--routing {text!r}: expected own, uniform or reuse:P with 0 <= P <= 1")
    return p


def routing_label(reuse: float | None) -> str:
    """A result file's description of the routing parse_routing's value stands for."""
    if reuse is None:
        return "the random router's own"
    if reuse == 0.0:
        return "uniform (drawn before capture, one routing a layer and row count)"
    return (f"reuse {reuse:g} (each token keeps each expert of the token before it with probability {reuse:g}; "
            "drawn before capture, one routing a layer and row count)")


def draw_routing(num_experts: int, top_k: int, layers: int, requests: int, tokens: int, reuse: float,
                 generator: torch.Generator) -> torch.Tensor:
    """int32 [layers, requests * tokens, top_k] on the host: for each layer, ``requests`` requests of ``tokens``
    consecutive rows, each row top_k distinct experts drawn as the module doc says (a request's first uniformly;
    each later one keeps each expert of the row before with probability ``reuse`` and draws the rest uniformly
    from the experts it has not kept: uniform scores, the kept experts' raised above every other)."""
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be in 1..num_experts={num_experts}")
    if min(layers, requests, tokens) < 1:
        raise ValueError(f"layers={layers}, requests={requests} and tokens={tokens} must be positive")
    ids = torch.empty(layers, requests, tokens, top_k, dtype=torch.int64)
    for t in range(tokens):
        scores = torch.rand(layers, requests, num_experts, generator=generator)
        if t and reuse > 0.0:
            prev = ids[:, :, t - 1]
            keep = torch.rand(prev.shape, generator=generator) < reuse
            scores.scatter_(-1, prev, torch.where(keep, 2.0, scores.gather(-1, prev)))
        ids[:, :, t] = scores.topk(top_k, dim=-1).indices
    return ids.reshape(layers, requests * tokens, top_k).to(torch.int32)


class DrawnRouting:
    """Replaces the expert ids of every MoE layer's routing (sglang_eagle3.kernels.moe_topk, which the layers look
    up at call time) by routings drawn ahead (module doc); the routing weights stay the model's own (their values
    do not change what a step reads). ``shapes``: the (requests, tokens a request) forwards to draw for, before any
    graph is captured (a host-to-device copy cannot be captured); the first shape given for a row count (requests
    x tokens) decides how its rows split into requests: list the timed shapes first. A forward of any other row
    count (a prefill) keeps the router's own ids; ``own_rows`` lists those seen.

    Calls for one row count take the layers' routings in turn (a forward calls its MoE layers once each, in
    order), so a forward reads every layer's draw once whatever layer it starts the cycle at: the floor
    (distinct_experts) holds for every forward."""

    def __init__(self, num_experts: int, top_k: int, layers: int, reuse: float = 0.0, *, shapes=(),
                 seed: int = 0, device: torch.device | str = "cuda"):
        if not 0.0 <= reuse <= 1.0:
            raise ValueError(f"reuse={reuse} must be in [0, 1]")
        if layers < 1:
            raise ValueError(f"layers={layers} must be positive")
        self.E, self.k, self.layers, self.reuse = num_experts, top_k, layers, reuse
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self.pool: dict[int, torch.Tensor] = {}  # rows -> int32 [layers, rows, top_k] on the device
        self.calls: dict[int, int] = {}  # rows -> calls so far (the next layer's draw: calls % layers)
        self.own_rows: set[int] = set()
        for requests, tokens in shapes:
            self.prepare(requests * tokens, tokens)
        import sglang_eagle3.kernels as kernels_mod

        self.module, self.original = kernels_mod, kernels_mod.moe_topk

    def prepare(self, rows: int, tokens: int) -> torch.Tensor:
        """The draws for forwards of ``rows`` rows in requests of ``tokens`` rows (made now if not yet)."""
        if rows not in self.pool:
            if rows % tokens:
                raise ValueError(f"rows={rows} is not whole requests of {tokens} tokens")
            drawn = draw_routing(self.E, self.k, self.layers, rows // tokens, tokens, self.reuse, self.generator)
            self.pool[rows] = drawn.to(self.device)
        return self.pool[rows]

    def distinct_experts(self, rows: int) -> int:
        """Expert loads of one forward of ``rows`` rows: the distinct experts of each layer's draw, summed."""
        if rows not in self.pool:
            raise KeyError(f"no routing drawn for {rows} rows (drawn: {sorted(self.pool)})")
        return sum(len(set(ids.flatten().tolist())) for ids in self.pool[rows])

    def ids_for(self, rows: int, own: torch.Tensor) -> torch.Tensor:
        """The next layer's ids for a forward of ``rows`` rows; ``own`` (the router's) where none were drawn."""
        pool = self.pool.get(rows)
        if pool is None:
            self.own_rows.add(rows)
            return own
        i = self.calls.get(rows, 0)
        self.calls[rows] = i + 1
        return pool[i % self.layers]

    def __enter__(self):
        def routed(router_logits, *args, top_k, **kw):
            weights, own = self.original(router_logits, *args, top_k=top_k, **kw)
            if top_k != self.k:
                raise ValueError(f"DrawnRouting drew top_k={self.k}, the layer routes top_k={top_k}")
            return weights, self.ids_for(router_logits.shape[0], own)

        self.module.moe_topk = routed
        return self

    def __exit__(self, *exc):
        self.module.moe_topk = self.original
