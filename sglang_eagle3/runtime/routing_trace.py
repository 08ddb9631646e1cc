"""A trace of the target's MoE routing: every MoE layer's expert ids of each eager target forward, so that the
benchmarks' random-weight slice can be timed at the routing a real checkpoint makes (benchmarks/routing.py,
``--routing trace:PATH``).

A random slice's router sends a verify's tokens to nearly the same experts, a trained one spreads them; how many
distinct experts a verify reads sets its MoE time and its bandwidth floor (docs/BENCHMARKS.md, fiftieth session).
With real weights, ``SGLANG_EAGLE3_ROUTING_TRACE=PATH`` (and ``disable_cuda_graph=True``: a replayed graph runs no
Python, so only eager forwards can be seen) writes PATH (``PATH.rank<r>`` on tensor-parallel rank r > 0, whose
routing is rank 0's): a header line, then one JSON line a forward with its row count (tokens of the forward: a
verify of one request, k + 1) and each MoE layer's ids [rows][top_k]. Start-up forwards (the adaptive policy's
timing) are recorded as well; a consumer picks forwards by their row count.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

FORMAT = "sglang_eagle3 routing trace"
VERSION = 1


class RoutingTraceWriter:
    """The observer each MoE block calls with its ids (layers/moe.py ``route_observer``): collects a forward's layers
    in order and writes the forward once its last MoE layer has routed."""

    def __init__(self, path: str | Path, blocks: list[torch.nn.Module], num_experts: int, top_k: int):
        if not blocks:
            raise ValueError("a routing trace needs a model with MoE layers; this one has none")
        self.path = Path(path)
        self.index = {id(b): i for i, b in enumerate(blocks)}
        self.layers: list[list | None] = [None] * len(blocks)
        self.file = open(self.path, "w", buffering=1)  # a line at a time: a crash keeps the forwards written
        self.file.write(json.dumps({"format": FORMAT, "version": VERSION, "num_experts": num_experts,
                                    "top_k": top_k, "moe_layers": len(blocks)}) + "\n")
        self.blocks = blocks

    @classmethod
    def attach(cls, target: torch.nn.Module, path: str, rank: int = 0) -> RoutingTraceWriter:
        """A writer observing every MoE block of ``target`` (a DeepseekV3ForCausalLM), writing ``path`` (rank 0) or
        ``path.rank<rank>``."""
        blocks = target.moe_blocks()
        cfg = target.config
        writer = cls(path if rank == 0 else f"{path}.rank{rank}", blocks, cfg.n_routed_experts,
                     cfg.num_experts_per_tok)
        for b in blocks:
            b.route_observer = writer
        return writer

    def __call__(self, block: torch.nn.Module, ids: torch.Tensor) -> None:
        if ids.is_cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("a routing trace records eager forwards only (a captured graph's replays run no "
                               "Python): run with disable_cuda_graph=True")
        i = self.index[id(block)]
        if i == 0:
            self.layers = [None] * len(self.layers)
        self.layers[i] = ids.tolist()
        if i == len(self.layers) - 1 and all(layer is not None for layer in self.layers):
            self.file.write(json.dumps({"rows": len(self.layers[0]), "ids": self.layers}) + "\n")

    def close(self) -> None:
        """Stops observing and closes the file."""
        for b in self.blocks:
            if b.route_observer is self:
                b.route_observer = None
        self.file.close()


def read_trace(path: str | Path) -> tuple[dict, list[dict]]:
    """(header, forwards) of a trace RoutingTraceWriter wrote; each forward {"rows": n, "ids": [layer][row][k]}.
    A file that is not one, or a forward that does not fit its header, is refused with the file and line named."""
    path = Path(path)
    lines = path.read_text().splitlines()
    try:
        header = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        header = {}
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a routing trace (its first line must be the {FORMAT!r} header; "
                         "SGLANG_EAGLE3_ROUTING_TRACE writes one)")
    if header.get("version") != VERSION:
        raise ValueError(f"{path}: routing trace version {header.get('version')!r}, this reader takes {VERSION}")
    E, k, L = header["num_experts"], header["top_k"], header["moe_layers"]
    forwards = []
    for n, line in enumerate(lines[1:], start=2):
        try:
            fw = json.loads(line)
            ids = torch.tensor(fw["ids"], dtype=torch.int64)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{n}: not a forward of a routing trace ({e})") from None
        if ids.shape != (L, fw.get("rows"), k) or (ids.numel() and (ids.min() < 0 or ids.max() >= E)):
            raise ValueError(f"{path}:{n}: a forward's ids of shape {tuple(ids.shape)} (rows {fw.get('rows')!r}) "
                             f"do not fit the header's {L} MoE layers x rows x top_k {k} over {E} experts")
        forwards.append({"rows": fw["rows"], "ids": ids})
    return header, forwards
