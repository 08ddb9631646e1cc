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
- ``trace:PATH``: a trace of a real checkpoint's routing (sglang_eagle3/runtime/routing_trace.py,
  ``SGLANG_EAGLE3_ROUTING_TRACE=PATH`` with ``disable_cuda_graph=True``): for each row count the first forward
  recorded with that many rows (a verify of one request: k + 1), every MoE layer's ids as recorded.
- ``own``: the model's own router (no replacement).

The draws are made on the host before any graph is captured, one fixed routing per MoE layer and row count
(forwards of other row counts, prefills, keep the router's own), stored on the device: a step's forward launches
nothing more than with its own routing (the previous ``UniformRouting`` drew them in the step, a rand, a top-k and
a cast a MoE layer, timed with it: ~0.95 ms of the 61-layer step on an H100, docs/BENCHMARKS.md, fiftieth
session). Every replay then reads the same experts; 60 layers of them (~5 GB at 32 experts a layer) pass through
the 50 MB L2 between two reads of one, so nothing is cached across replays.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's package, also when run as a script

from sglang_eagle3.runtime.routing_trace import read_trace  # noqa: E402


@dataclass(frozen=True)
class RoutingChoice:
    """A --routing value: ``kind`` own | uniform | reuse | trace, with reuse's P or the trace's path."""
    kind: str
    reuse: float = 0.0
    path: str | None = None

    @property
    def drawn(self) -> bool:
        """Whether the benchmark replaces the router's ids (anything but own)."""
        return self.kind != "own"

    def label(self) -> str:
        """A result file's description of this routing."""
        before = "before capture, one routing a layer and row count"
        return {"own": "the random router's own",
                "uniform": f"uniform (drawn {before})",
                "reuse": f"reuse {self.reuse:g} (each token keeps each expert of the token before it with probability "
                         f"{self.reuse:g}; drawn {before})",
                "trace": f"trace {self.path} (a recorded forward of each row count; set {before})"}[self.kind]


def parse_routing(text: str) -> RoutingChoice:
    """--routing's value: own, uniform, reuse:P (0 <= P <= 1) or trace:PATH."""
    t = text.strip()
    if t.lower() in ("own", "uniform"):
        return RoutingChoice(t.lower())
    name, sep, value = t.partition(":")
    if name.lower() == "trace" and sep and value:
        if not Path(value).is_file():
            raise ValueError(f"--routing {text!r}: no routing trace at {value} (SGLANG_EAGLE3_ROUTING_TRACE "
                             "writes one)")
        return RoutingChoice("trace", path=value)
    try:
        p = float(value) if name.lower() == "reuse" and sep else None
    except ValueError:
        p = None
    if p is None or not 0.0 <= p <= 1.0:
        raise ValueError(f"--routing {text!r}: expected own, uniform, reuse:P with 0 <= P <= 1, or trace:PATH")
    return RoutingChoice("uniform") if p == 0.0 else RoutingChoice("reuse", reuse=p)


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
    x tokens) decides how its rows split into requests: list the timed shapes first. With ``trace`` (a path:
    sglang_eagle3/runtime/routing_trace.py) a row count takes the trace's first forward of that many rows instead,
    and one the trace lacks is not drawn. A forward of a row count not drawn (a prefill) keeps the router's own ids;
    ``own_rows`` lists those seen.

    Calls for one row count take the layers' routings in turn (a forward calls its MoE layers once each, in
    order), so a forward reads every layer's draw once whatever layer it starts the cycle at: the floor
    (distinct_experts) holds for every forward."""

    def __init__(self, num_experts: int, top_k: int, layers: int, reuse: float = 0.0, *, trace: str | None = None,
                 shapes=(), seed: int = 0, device: torch.device | str = "cuda"):
        if not 0.0 <= reuse <= 1.0:
            raise ValueError(f"reuse={reuse} must be in [0, 1]")
        if layers < 1:
            raise ValueError(f"layers={layers} must be positive")
        self.E, self.k, self.layers, self.reuse = num_experts, top_k, layers, reuse
        self.device = torch.device(device)
        self.generator = torch.Generator().manual_seed(seed)
        self.traced: dict[int, torch.Tensor] | None = None  # rows -> the trace's first forward of that many
        if trace is not None:
            header, forwards = read_trace(trace)
            have = (header["num_experts"], header["top_k"], header["moe_layers"])
            if have != (num_experts, top_k, layers):
                raise ValueError(f"routing trace {trace}: {have[0]} experts, top_k {have[1]}, {have[2]} MoE layers; "
                                 f"this model has {num_experts}, {top_k}, {layers}")
            self.traced = {}
            for fw in forwards:
                self.traced.setdefault(fw["rows"], fw["ids"])
        self.pool: dict[int, torch.Tensor] = {}  # rows -> int32 [layers, rows, top_k] on the device
        self.calls: dict[int, int] = {}  # rows -> calls so far (the next layer's draw: calls % layers)
        self.own_rows: set[int] = set()
        for requests, tokens in shapes:
            self.prepare(requests * tokens, tokens)
        import sglang_eagle3.kernels as kernels_mod

        self.module, self.original = kernels_mod, kernels_mod.moe_topk

    def prepare(self, rows: int, tokens: int) -> torch.Tensor | None:
        """The draws for forwards of ``rows`` rows in requests of ``tokens`` rows (made now if not yet; None where a
        trace has no forward of that many rows)."""
        if rows not in self.pool:
            if rows % tokens:
                raise ValueError(f"rows={rows} is not whole requests of {tokens} tokens")
            if self.traced is not None:
                if rows not in self.traced:
                    return None
                drawn = self.traced[rows]
            else:
                drawn = draw_routing(self.E, self.k, self.layers, rows // tokens, tokens, self.reuse, self.generator)
            self.pool[rows] = drawn.to(device=self.device, dtype=torch.int32)
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


def drawn_routing(choice: RoutingChoice, num_experts: int, top_k: int, layers: int, shapes) -> DrawnRouting | None:
    """The DrawnRouting a --routing choice asks for (not entered), or None for the router's own."""
    if not choice.drawn:
        return None
    return DrawnRouting(num_experts, top_k, layers, choice.reuse, trace=choice.path, shapes=shapes)


def expected_overlap(num_experts: int, top_k: int, reuse: float) -> float:
    """Experts a token shares with the token before it under ``reuse:P`` (draw_routing's rule): K ~ Binomial(k, P)
    kept, the k - K others drawn from the E - K experts not kept, k - K of which are the earlier token's dropped
    ones. P = 0 gives independent draws' k^2 / E."""
    E, k = num_experts, top_k
    return sum(math.comb(k, j) * reuse ** j * (1 - reuse) ** (k - j) * (j + (k - j) ** 2 / (E - j))
               for j in range(k + 1))


def uniform_distinct(num_experts: int, top_k: int, tokens: int) -> float:
    """The distinct experts ``tokens`` independently, uniformly routed tokens read a layer on average: each expert is
    missed by a token with probability 1 - k / E, so E (1 - (1 - k / E)^T)."""
    return num_experts * (1 - (1 - top_k / num_experts) ** tokens)


def trace_stats(path: str) -> dict:
    """What a routing trace says about a request's consecutive tokens, by row count (each forward taken as one
    request's rows): forwards, distinct experts a layer (and what independent draws would give), the experts a token
    shares with the token before it, and the reuse P whose expected_overlap matches that (what --routing reuse:P
    would replay)."""
    header, forwards = read_trace(path)
    E, k = header["num_experts"], header["top_k"]
    by_rows: dict[int, list[torch.Tensor]] = {}
    for fw in forwards:
        by_rows.setdefault(fw["rows"], []).append(fw["ids"])
    rows_out = {}
    for n, fws in sorted(by_rows.items()):
        distinct = [len(set(layer.flatten().tolist())) for ids in fws for layer in ids]
        shared = [len(set(layer[r].tolist()) & set(layer[r - 1].tolist())) for ids in fws for layer in ids
                  for r in range(1, n)]
        row = {"forwards": len(fws), "distinct_experts_a_layer": round(sum(distinct) / len(distinct), 2),
               "uniform_distinct_a_layer": round(uniform_distinct(E, k, n), 2)}
        if shared:
            overlap = sum(shared) / len(shared)
            lo, hi = 0.0, 1.0  # expected_overlap rises with P: bisect for the P that gives the measured overlap
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if expected_overlap(E, k, mid) < overlap else (lo, mid)
            row.update(shared_with_previous=round(overlap, 3), reuse_estimate=round((lo + hi) / 2, 3))
        rows_out[n] = row
    return {"trace": str(path), "num_experts": E, "top_k": k, "moe_layers": header["moe_layers"], "rows": rows_out}


def main() -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description="python benchmarks/routing.py stats TRACE: what a routing trace "
                                 "(SGLANG_EAGLE3_ROUTING_TRACE) says about a request's consecutive tokens")
    ap.add_argument("command", choices=["stats"])
    ap.add_argument("trace")
    args = ap.parse_args()
    try:
        stats = trace_stats(args.trace)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
