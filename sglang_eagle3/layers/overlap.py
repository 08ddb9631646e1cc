"""Work that overlaps the main stream of a decode/verify forward: a side CUDA stream, and L2 prefetch of the
weights a layer reads later.

At decode sizes most kernels of a layer are bound by their launch and memory latency, not by bandwidth (a
Kimi TP=8 rank's layer streams ~93 MB in ~90 us, a quarter of the H200's copy bandwidth). Two ways to use the
idle memory system, each one switch of ``Overlaps`` (env.OVERLAP picks them at start-up):

- ``shared_down``: the shared expert's down projection runs on the side stream while the main stream routes
  (moe_topk); they join before the routed experts' down kernel, which adds the shared output.
- ``mla_k_path``: with q's rope in the MLA kernel (launch fusion ``q_rope_attn``), MLA's k path (the kv_a
  norm of the latent and k's rope, into the cache) depends only on kv_a: it runs on the side stream beside
  q_b and W_UK, and joins before the attention kernel.
- ``rope_side``: MLA's rotary launch (q's and k's rope, the kv_a norm of the latent, the cache write) runs on the
  side stream beside W_UK (both read only q_b's and kv_a's outputs, different columns of q), and joins before the
  attention kernel: one launch fewer on the main stream's chain of a layer. Measured 1.6-3.2% slower on the H200
  (the fork and the join are full dependencies, which PDL does not overlap; docs/BENCHMARKS.md, twenty-seventh
  session), so off by default.
- ``prefetch_attn`` / ``prefetch_late``: when layer i starts, the side stream asks the L2 for the weights
  layer i reads after its first projection (q_b, kv_b (W_UK/W_UV) and o_proj; ``late`` adds the router and
  the shared expert), so they arrive while q_a/kv_a and attention run. ``prefetch_next`` instead fetches
  layer i+1's q_a/kv_a. Each layer joins the previous layer's prefetch before it forks its own.
- ``prefetch_mid`` / ``prefetch_mid_o``: the fork waits for the layer's q_a + kv_a launch (the layer's one
  bandwidth-bound launch before its attention), and the prefetch asks for what the main stream reads after
  the attention: o_proj and then the MoE layer's router + shared gate/up (``mid``), or o_proj alone (``mid_o``).
  The lines then stream in while q_b, the rotary, W_UK, MLA and W_UV run, each bound by its latency.
- ``prefetch_next_moe`` (with or without one of the above): the fork waits for the MoE layer's router + shared
  gate/up launch, and the prefetch asks for layer i+1's q_a/kv_a while the routing and the routed experts run.
These later forks go to a stream of the prefetcher's own, joined only at the forward's end: the main stream
gains no full dependency for them, and the side stream's joins (the shared expert's) do not wait for them.
A prefetch changes no value; whether it pays depends on the L2 holding the lines until they are read (50 MB
on an H200), which is what benchmarks/bench_verify_graph.py --overlap-variants or --env-variants measures.

Everything here works the same eagerly and inside CUDA-graph capture (a fork is an event the side stream
waits on, a join the reverse; every fork is joined before the forward returns), and does nothing off CUDA.
The model code does not know whether it is captured.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator

import torch

from sglang_eagle3 import env
from sglang_eagle3.kernels.prefetch import l2_prefetch, prefetch_table

PREFETCH_PLANS = ("prefetch_attn", "prefetch_late", "prefetch_next", "prefetch_mid", "prefetch_mid_o")
OVERLAPS = ("shared_down", "mla_k_path", "rope_side") + PREFETCH_PLANS + ("prefetch_next_moe",)
# Plans forked after the layer's q_a + kv_a launch (MLAAttention.after_kv_a), not at the layer's start.
MID_PLANS = ("prefetch_mid", "prefetch_mid_o")


@dataclasses.dataclass(frozen=True)
class Overlaps:
    """Which overlaps are on. ``prefetch`` is one of PREFETCH_PLANS or None; ``prefetch_next_moe`` goes with
    any of them."""

    shared_down: bool = False
    prefetch: str | None = None
    mla_k_path: bool = False
    rope_side: bool = False
    prefetch_next_moe: bool = False

    def __post_init__(self):
        assert self.prefetch is None or self.prefetch in PREFETCH_PLANS, (
            f"prefetch={self.prefetch!r} must be one of {PREFETCH_PLANS} or None")

    @classmethod
    def parse(cls, spec: str | None) -> Overlaps:
        """'' / 'none' -> none on; else a comma list of OVERLAPS (at most one prefetch plan)."""
        names = {n.strip() for n in (spec or "").split(",") if n.strip()} - {"none"}
        unknown = names - set(OVERLAPS)
        if unknown:
            raise ValueError(f"{env.OVERLAP.name}={spec!r}: unknown overlap(s) {sorted(unknown)}; known: "
                             f"{', '.join(OVERLAPS)} or none")
        plans = sorted(names & set(PREFETCH_PLANS))
        if len(plans) > 1:
            raise ValueError(f"{env.OVERLAP.name}={spec!r}: at most one prefetch plan, got {plans}")
        return cls(shared_down="shared_down" in names, prefetch=plans[0] if plans else None,
                   mla_k_path="mla_k_path" in names, rope_side="rope_side" in names,
                   prefetch_next_moe="prefetch_next_moe" in names)

    @classmethod
    def from_env(cls) -> Overlaps:
        raw = env.OVERLAP.raw()
        return cls.parse(env.DEFAULT_OVERLAP if raw is None else raw)


class SideStream:
    """One side CUDA stream per device, shared by the layers of a model (target and draft each own one).

    ``fork(x)`` runs its body on the side stream after everything already queued on x's current stream;
    ``join(x)`` makes the current stream wait for the side stream's work. Off CUDA both do nothing and the
    body runs inline. Tensors the side work reads or writes must stay referenced until after the join (the
    caching allocator would otherwise hand their memory to the main stream while the side stream uses it)."""

    def __init__(self):
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._pending: set[torch.device] = set()

    @contextlib.contextmanager
    def fork(self, like: torch.Tensor) -> Iterator[None]:
        if not like.is_cuda:
            yield
            return
        main = torch.cuda.current_stream(like.device)
        side = self._streams.get(like.device)
        if side is None:
            side = self._streams[like.device] = torch.cuda.Stream(like.device)
        side.wait_stream(main)
        self._pending.add(like.device)
        with torch.cuda.stream(side):
            yield

    def join(self, like: torch.Tensor) -> None:
        if like.is_cuda and like.device in self._pending:
            torch.cuda.current_stream(like.device).wait_stream(self._streams[like.device])
            self._pending.discard(like.device)


class WeightPrefetcher:
    """Issues the L2 prefetch of a prefetch plan: at the start of each decoder layer on the model's side stream,
    joined by the next layer; or later in the layer on a stream of its own (``late``), joined at ``finish``:
    MID_PLANS after the layer's q_a + kv_a launch and prefetch_next_moe after its MoE router launch (the model
    hands the layers the hooks ``hook`` and ``moe_hook`` return). See the module doc.

    The (address, bytes) table of each layer is built on first use and rebuilt when a weight's storage moved
    (a reload with ``.to()``), checked by comparing data pointers: host work in eager mode only, none in a
    replayed graph. Only the inference forward calls it (the model's aux/no-cache paths do not)."""

    def __init__(self, side: SideStream):
        self.side = side
        self.late = SideStream()
        self._tables: dict[tuple[str, int], tuple[tuple[int, ...], torch.Tensor]] = {}

    @staticmethod
    def plan_weights(layers, i: int, plan: str) -> list[torch.Tensor]:
        """The contiguous weight tensors plan ``plan`` fetches for layer i, in the order they are read."""
        if plan in ("prefetch_next", "prefetch_next_moe"):
            if i + 1 >= len(layers):
                return []
            attn = layers[i + 1].self_attn
            mods = [getattr(attn, "q_a_proj", None), attn.kv_a_proj_with_mqa]
        elif plan in MID_PLANS:
            mods = [layers[i].self_attn.o_proj]
            mlp = layers[i].mlp
            shared = getattr(mlp, "shared_experts", None)
            if plan == "prefetch_mid" and shared is not None:  # what the router + shared gate/up launch reads
                mods += [mlp.gate, shared.gate_proj, shared.up_proj]
        else:
            attn = layers[i].self_attn
            mods = [getattr(attn, "q_b_proj", None), attn.kv_b_proj, attn.o_proj]
            if plan == "prefetch_late":
                mlp = layers[i].mlp
                shared = getattr(mlp, "shared_experts", None)
                mods += [getattr(mlp, "gate", None)]
                mods += [shared.gate_proj, shared.up_proj, shared.down_proj] if shared is not None else []
        return [m.weight for m in mods if m is not None and m.weight.is_contiguous()]

    @staticmethod
    def _bulk_capable(like: torch.Tensor) -> bool:
        """Whether like's device has the bulk L2 prefetch (CUDA, compute capability 9 or more)."""
        return like.is_cuda and torch.cuda.get_device_capability(like.device)[0] >= 9

    def issue(self, layers, i: int, plan: str, like: torch.Tensor, stream: SideStream) -> None:
        """Forks the prefetch of plan's weights for layer i onto ``stream``, after the work queued on like's
        stream; no join (the caller's, or the stream's next one, covers it)."""
        weights = self.plan_weights(layers, i, plan)
        if not weights:
            return
        key = (plan, i)
        ptrs = tuple(w.data_ptr() for w in weights)
        cached = self._tables.get(key)
        if cached is None or cached[0] != ptrs:
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("prefetch table built during graph capture: the eager warm-up must run first")
            cached = self._tables[key] = (ptrs, prefetch_table(weights))
        with stream.fork(like):
            l2_prefetch(cached[1])

    def before_layer(self, layers, i: int, plan: str | None, like: torch.Tensor) -> None:
        """Joins the previous layer's prefetch and forks this layer's (nothing when plan is None, one of
        MID_PLANS, or off CUDA)."""
        if plan is None or plan in MID_PLANS or not self._bulk_capable(like):
            return
        self.side.join(like)
        self.issue(layers, i, plan, like, self.side)

    def mid_layer(self, layers, i: int, plan: str, like: torch.Tensor) -> None:
        """A later fork's prefetch for layer i (a MID_PLANS or prefetch_next_moe), on the late stream once the
        work queued on like's stream (the launch that made ``like``) is done."""
        if self._bulk_capable(like):
            self.issue(layers, i, plan, like, self.late)

    def hook(self, layers, i: int, plan: str | None):
        """Layer i's MLAAttention.after_kv_a for ``plan``: None unless plan is one of MID_PLANS."""
        return functools.partial(self.mid_layer, layers, i, plan) if plan in MID_PLANS else None

    def moe_hook(self, layers, i: int, on: bool):
        """Layer i's DeepseekMoE.after_router with prefetch_next_moe ``on`` (None off, or for the last layer)."""
        return functools.partial(self.mid_layer, layers, i, "prefetch_next_moe") if on and i + 1 < len(layers) \
            else None

    def finish(self, like: torch.Tensor) -> None:
        self.side.join(like)
        self.late.join(like)
