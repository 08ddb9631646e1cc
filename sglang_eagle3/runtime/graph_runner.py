"""CUDA-graph capture and replay for the fixed-shape forwards (decode, target verify, draft steps, prefill).

A ``GraphRunner`` owns one forward function and captures it once per (batch bucket, tokens per request):
static input buffers are filled with ``copy_`` before each replay, batches are padded to the next bucket,
and all graphs share one memory pool (captured largest first so smaller graphs reuse its blocks). The
function never knows it is being captured. Every call that cannot replay runs eagerly and is COUNTED with
its reason; the first fallback per reason logs a warning.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sglang_eagle3.progress import beat

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputSpec:
    """How one input is laid out and padded. ``per_token`` inputs have B*T leading rows, others B."""

    per_token: bool
    pad_value: float | int = 0
    pad_with_tokens_per_req: bool = False  # seq_lens: a padded row holds just its own T tokens (no NaNs)


def batch_buckets(max_bs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_bs (SGLang's default bucket shape)."""
    out = [b for b in (1, 2, 4) if b < max_bs]
    out += list(range(8, max_bs + 1, 8))
    if not out or out[-1] != max_bs:
        out.append(max_bs)
    return sorted(set(out))


class ForwardStats:
    """Counts of how each named forward ran: {"graph": n, "eager": n} plus eager reasons."""

    def __init__(self, warn: bool = True):
        self.warn = warn  # False on CPU, where graphs cannot exist and eager is not a fallback
        self.graph = Counter()
        self.eager = Counter()
        self.reasons: dict[str, Counter] = {}

    def record(self, name: str, graph: bool, reason: str | None = None) -> None:
        if graph:
            self.graph[name] += 1
            return
        self.eager[name] += 1
        bucket = self.reasons.setdefault(name, Counter())
        if reason not in bucket:
            logger.log(logging.WARNING if self.warn else logging.DEBUG,
                       "%s ran EAGER (not a CUDA graph replay): %s", name, reason)
        bucket[reason] += 1

    @contextlib.contextmanager
    def uncounted(self):
        """Forwards run inside the block (start-up timing: ModelRunner.time_rounds) leave the counts as they were."""
        saved = (Counter(self.graph), Counter(self.eager), {n: Counter(c) for n, c in self.reasons.items()})
        try:
            yield
        finally:
            self.graph, self.eager, self.reasons = saved

    def as_dict(self) -> dict:
        names = sorted(set(self.graph) | set(self.eager))
        return {n: {"graph": self.graph[n], "eager": self.eager[n], "eager_reasons": dict(self.reasons.get(n, {}))}
                for n in names}


def pool_bytes(pool) -> int:
    """Bytes of device memory the caching allocator holds for the graph memory pool ``pool`` (a
    torch.cuda.graph_pool_handle()): the sizes of its segments."""
    want = tuple(pool)
    return sum(seg["total_size"] for seg in torch.cuda.memory_snapshot()
               if tuple(seg.get("segment_pool_id", ())) == want)


@contextlib.contextmanager
def _gc_paused():
    """Python's garbage collector off for the block (after one collection now). A collection inside a capture
    can destroy an earlier engine's CUDA graphs (engines hold reference cycles: their runners' closures), and
    freeing their memory is not permitted while a stream captures: the capture is invalidated ("operation not
    permitted when stream is capturing", then "operation failed due to a previous error during capture"). Seen
    on the H200 creating the fourth engine of a test module. SGLang freezes the collector around its capture too."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class GraphRunner:
    def __init__(self, name: str, fn: Callable[..., tuple[torch.Tensor, ...]], specs: dict[str, InputSpec],
                 stats: ForwardStats, *, enabled: bool, disabled_reason: str = "", max_bs: int = 1,
                 tokens_per_req: tuple[int, ...] = (1,), pool=None,
                 eager_fn: Callable[..., tuple[torch.Tensor, ...]] | None = None,
                 replay_counts: Callable[[int], tuple[str, ...]] | None = None, max_tokens: int | None = None):
        """``eager_fn`` (default ``fn``) runs a call that cannot replay: a forward composed of other runners
        passes them there, so that each part still replays its own graph or is counted as eager. A replay at T
        tokens a request also counts once for each name in ``replay_counts(T)`` (the parts a composed graph
        replays within it). ``max_tokens``: (batch bucket, T) pairs with more tokens are not captured (prefill:
        long prompts one at a time, short ones batched)."""
        self.name, self.fn, self.specs, self.stats = name, fn, specs, stats
        self.eager_fn = eager_fn or fn
        self.replay_counts = replay_counts
        self.enabled = enabled
        self.disabled_reason = disabled_reason or "CUDA graphs disabled"
        self.max_bs = max_bs
        self.buckets = batch_buckets(max_bs) if enabled else []
        self.tokens_per_req = tuple(sorted(set(tokens_per_req)))
        self.max_tokens = max_tokens
        self.pool = pool
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict, tuple]] = {}
        self.capture_seconds = 0.0
        self.capture_bytes = 0

    # ---------------------------------------------------------------------------------------------
    def capture(self, make_inputs: Callable[[int, int], dict[str, torch.Tensor]]) -> None:
        """make_inputs(bs, T) -> valid example inputs (a padded batch of that shape) for warm-up/capture."""
        if not self.enabled:
            return
        t0 = time.perf_counter()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        held0 = pool_bytes(self.pool)
        stream = torch.cuda.Stream()
        # Autograd off, as for every replay's eager twin (the runner's forwards run under inference mode): the
        # layers take their inference paths (fused kernels writing straight into the KV cache) only when no
        # gradient graph is being recorded, so capturing with grad mode on would freeze the slower
        # training-path ops into every replay.
        shapes = [(bs, T) for T in sorted(self.tokens_per_req, reverse=True)
                  for bs in sorted(self.buckets, reverse=True) if self.max_tokens is None or bs * T <= self.max_tokens]
        with torch.no_grad(), _gc_paused():
            for i, (bs, T) in enumerate(shapes):
                beat("capturing %s's CUDA graphs: %d/%d (batch %d, %d tokens a request)", self.name, i + 1,
                     len(shapes), bs, T)
                static = make_inputs(bs, T)
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: lazy inits, autotuning and allocator growth stay out
                        self.fn(**static, tokens_per_req=T)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=stream):
                    out = self.fn(**static, tokens_per_req=T)
                self.graphs[(bs, T)] = (graph, static, out)
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - t0
        # What the shared pool grew by (a later runner whose graphs fit in memory the pool already holds adds 0).
        # Not the drop in free device memory: every capture starts with torch's empty_cache(), which hands the
        # allocator's cached blocks back and so hid the pool's growth (0.0 MiB reported for the prefill graphs).
        self.capture_bytes = pool_bytes(self.pool) - held0
        logger.info("%s: captured %d CUDA graphs (batch buckets %s x tokens/request %s) in %.2f s, %.1f MiB",
                    self.name, len(self.graphs), self.buckets, list(self.tokens_per_req), self.capture_seconds,
                    self.capture_bytes / 2**20)

    def _bucket(self, bs: int) -> int | None:
        for b in self.buckets:
            if b >= bs:
                return b
        return None

    def why_not(self, bs: int, T: int) -> str | None:
        """None if (bs, T) can replay a graph, else the reason it cannot."""
        if not self.enabled:
            return self.disabled_reason
        if T not in self.tokens_per_req:
            return f"tokens per request {T} not captured (captured {list(self.tokens_per_req)})"
        if self._bucket(bs) is None:
            return f"batch size {bs} above the largest captured bucket {self.buckets[-1]}"
        if self.max_tokens is not None and self._bucket(bs) * T > self.max_tokens:
            return f"batch bucket x tokens per request above the {self.max_tokens} tokens captured"
        return None

    def __call__(self, bs: int, T: int, **inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        reason = self.why_not(bs, T)
        if reason is not None:
            self.stats.record(self.name, graph=False, reason=reason)
            return self.eager_fn(**inputs, tokens_per_req=T)
        pb = self._bucket(bs)
        graph, static, out = self.graphs[(pb, T)]
        for name, spec in self.specs.items():
            src, dst = inputs[name], static[name]
            rows = bs * T if spec.per_token else bs
            if src.dim() > 1 and dst.shape[1] != src.shape[1]:
                # Page tables: the static one is as wide as the longest context; pad columns with page 0.
                dst[:rows].fill_(spec.pad_value)
                dst[:rows, : src.shape[1]].copy_(src)
            else:
                dst[:rows].copy_(src)
            if rows < dst.shape[0]:
                dst[rows:].fill_(T if spec.pad_with_tokens_per_req else spec.pad_value)
        graph.replay()
        self.stats.record(self.name, graph=True)
        for name in self.replay_counts(T) if self.replay_counts else ():
            self.stats.record(name, graph=True)
        return tuple(o[: bs * T] for o in out)
