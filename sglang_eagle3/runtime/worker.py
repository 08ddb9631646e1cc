"""One process's share of the engine: loads the target (and draft) slices for its TP rank, builds the model
runner and the scheduler. The in-process engine (tp_size=1) uses one directly; each TP worker process runs
one, all ranks stepping the same scheduler in lockstep (SPMD: identical inputs, identical sampling RNG, so
every rank makes the same decisions and only the collectives inside the forwards need to agree).
"""

from __future__ import annotations

import logging
import time

import torch

from sglang_eagle3 import env
from sglang_eagle3.config import ConfigError, resolve_aux_layer_ids
from sglang_eagle3.distributed.parallel_state import get_tp, tp_max_floats
from sglang_eagle3.progress import beat
from sglang_eagle3.runtime.adaptive import AdaptiveConfig, DraftLengthPolicy, RoundCosts
from sglang_eagle3.runtime.graph_runner import batch_buckets
from sglang_eagle3.runtime.model_runner import ModelRunner
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.routing_trace import RoutingTraceWriter
from sglang_eagle3.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def fit_kv_pages(plan: dict, target, draft, args, device: torch.device, dtype: torch.dtype) -> int:
    """The KV pools' pages on a GPU, measured once the weights are loaded: the plan's (max_total_tokens, or room
    for max_running_requests requests of context_length) if that fits under mem_fraction_static, else as many as
    fit, agreed on by every TP rank (the smallest). An explicit max_total_tokens that does not fit, or a device
    with room for no page, is a ConfigError naming the numbers: the alternative is an out-of-memory error deep in
    the pool's allocation, or later in a graph capture."""
    from sglang_eagle3.distributed.parallel_state import tp_min_int
    from sglang_eagle3.runtime.kv_cache import kv_bytes_per_token, pages_that_fit

    wanted = plan["num_pages"]
    scratch = target.mha_scratch_width(args.mha_prefill_tokens)
    per_page = kv_bytes_per_token(target.config, draft, dtype, scratch) * args.page_size
    free, total = torch.cuda.mem_get_info(device)
    fit = tp_min_int(pages_that_fit(free, total, args.mem_fraction_static, per_page), device)
    gib = 1 << 30
    numbers = (f"{free / gib:.1f} of {total / gib:.1f} GiB free after the weights, mem_fraction_static="
               f"{args.mem_fraction_static} keeps {(1 - args.mem_fraction_static) * total / gib:.1f} GiB for "
               f"activations and graphs, {per_page * 1024 / args.page_size / (1 << 20):.2f} MiB of KV cache per 1k "
               "tokens")
    if fit < 3:
        raise ConfigError(f"no room for a KV cache: {numbers}; raise mem_fraction_static or use more GPUs")
    if wanted <= fit:
        return wanted
    fit_tokens = (fit - 2) * args.page_size
    if args.max_total_tokens is not None:
        raise ConfigError(f"max_total_tokens={args.max_total_tokens} does not fit: {fit_tokens} tokens do ({numbers})")
    logger.warning("KV cache cut to %d tokens (max_running_requests=%d x context_length=%d would need %d): %s; "
                   "requests beyond it wait or are retracted", fit_tokens, args.max_running_requests,
                   plan["context_length"], (wanted - 2) * args.page_size, numbers)
    return fit


def adaptive_policy(runner: ModelRunner, candidates: tuple[int, ...], max_bs: int,
                    probe_rounds: int = AdaptiveConfig.probe_rounds) -> DraftLengthPolicy:
    """The adaptive draft length's policy (runtime/adaptive.py), its round costs timed now on every batch bucket
    (the graphs' where captured), for greedy and for sampled batches, and agreed on by the TP ranks (each entry the
    slowest rank's)."""
    t0 = time.perf_counter()
    change_nats = env.ADAPTIVE_CHANGE_NATS.number(AdaptiveConfig.change_nats)
    if not change_nats > 0:
        raise ConfigError(f"{env.ADAPTIVE_CHANGE_NATS.name}={change_nats:g}: the change test needs > 0 nats (inf: off)")
    config = AdaptiveConfig(candidates=candidates, probe_rounds=probe_rounds, change_nats=change_nats,
                            step_up=env.ADAPTIVE_STEP_UP.switch(default=AdaptiveConfig.step_up))
    buckets = runner.spec_round.buckets or batch_buckets(max_bs)
    catch_up = config.probe_rounds if config.rests else 0
    timed = runner.time_rounds(candidates, buckets, catch_up_tokens=catch_up)
    sampled = runner.time_rounds(candidates, buckets, catch_up_tokens=catch_up, sampled=True)
    keys = list(timed)  # (the same order on every rank: time_rounds' loops)
    agreed = tp_max_floats([timed[key] for key in keys] + [sampled[key] for key in keys], runner.device)
    costs = RoundCosts(dict(zip(keys, agreed[:len(keys)], strict=True)),
                       sampled=dict(zip(keys, agreed[len(keys):], strict=True)))
    logger.info("adaptive draft length among k=%s: round costs timed in %.2f s (ms by k and batch; decode: a plain "
                "decode step; catch_up: the resting draft's catch-up; sampled: the same with sampled requests): %s",
                list(candidates), time.perf_counter() - t0, costs.as_dict())
    return DraftLengthPolicy(config, costs)


class ModelWorker:
    """Owns this process's models, KV pools, graphs and scheduler. ``args`` is an EngineArgs; ``plan`` holds
    what the engine resolved once (context length, draft widths, eos ids)."""

    # The scheduler interface's failure (distributed/workers.py TPWorkerGroup sets it when a rank died): an error
    # in this process's step leaves the worker able to serve the next requests, so it stays None.
    failure: str | None = None

    def __init__(self, args, plan: dict, device: torch.device, detokenize=None, models=None, grammar=None):
        """``models``: an already built (target, draft) pair (benchmarks with random weights); else loaded.
        ``grammar``: the runtime.grammar.GrammarBackend that makes the matchers of requests with a grammar.

        Models this worker loaded are freed when its start fails after they loaded (the draft's load, the KV
        sizing, a graph capture): as for a failed load (models/loader.py release_storage), a kept traceback
        would otherwise pin the target's weights and the retry run out of memory. A caller's own ``models``
        stay the caller's."""
        from sglang_eagle3.models.loader import release_storage

        loaded: list = []
        try:
            self._start(args, plan, device, detokenize, models, grammar, loaded)
        except BaseException:
            release_storage(*loaded)
            raise

    def _start(self, args, plan, device, detokenize, models, grammar, loaded: list) -> None:
        from sglang_eagle3.models.loader import load_draft, load_target

        t0 = time.perf_counter()
        dtype = resolve_dtype(args.dtype, device)
        torch.manual_seed(args.random_seed)
        self.device, self.dtype = device, dtype
        if models is not None:
            target, draft = models
        else:
            target = load_target(args.model_path, device=device, dtype=dtype)
            loaded.append(target)
            draft = None
            if args.speculative:
                draft = load_draft(args.speculative_draft_model_path, target.config, device=device, dtype=dtype)
                loaded.append(draft)
        aux_ids = ()
        if draft is not None:
            aux_ids = resolve_aux_layer_ids(draft.config, target.config.num_hidden_layers,
                                            args.speculative_aux_layer_ids)
        self.kv_pages = plan["num_pages"]
        if device.type == "cuda":
            beat("sizing the KV cache")
            self.kv_pages = fit_kv_pages(plan, target, draft, args, device, dtype)
        use_graph = device.type == "cuda" and not args.disable_cuda_graph
        # A trace of the target's routing (runtime/routing_trace.py): eager forwards only, refused beside graphs
        # before anything is built.
        trace = env.ROUTING_TRACE.raw()
        if trace and use_graph:
            raise ConfigError(f"{env.ROUTING_TRACE.name}={trace!r} records eager forwards only (a graph's replays "
                              "run no Python): pass disable_cuda_graph=True (--disable-cuda-graph)")
        reason = ("disable_cuda_graph=True" if args.disable_cuda_graph
                  else "CUDA graphs need a CUDA device (running on CPU)")
        # A resting draft's catch-ups (runtime/adaptive.py) cover probe_rounds tokens a request; the runner captures
        # graphs for those over sampled requests where the draft can rest
        rests = args.speculative_adaptive and plan["num_steps"] and 0 in args.step_candidates()
        self.runner = ModelRunner(
            target, draft, aux_layer_ids=aux_ids, num_pages=self.kv_pages, page_size=args.page_size,
            max_context=plan["context_length"], device=device, dtype=dtype, use_cuda_graph=use_graph,
            cuda_graph_max_bs=min(args.cuda_graph_max_bs, args.max_running_requests),
            verify_widths=plan["verify_widths"], attention_backend=args.attention_backend,
            moe_backend=args.moe_runner_backend, prefill_tokens=args.cuda_graph_prefill_tokens,
            mha_prefill_tokens=args.mha_prefill_tokens,
            grammar_graphs=grammar is not None and (grammar.available or grammar.strict_thinking),
            graph_disabled_reason=reason,
            catch_up_tokens=args.speculative_adaptive_probe_rounds if rests and draft is not None else 0)
        self.routing_trace = None
        if trace:
            self.routing_trace = RoutingTraceWriter.attach(target, trace, get_tp().rank)
            logger.info("routing trace: every eager target forward's expert ids to %s", self.routing_trace.path)
        if use_graph:
            self.runner.capture_graphs()
        self.scheduler = Scheduler(self.runner, num_steps=plan["num_steps"], max_running=args.max_running_requests,
                                   max_context=plan["context_length"], eos_token_ids=tuple(plan["eos"]),
                                   detokenize=detokenize, seed=args.random_seed, grammar=grammar)
        self.scheduler.simulate_accept_length = args.speculative_simulate_accept_length
        self.scheduler.overlap = not args.disable_overlap_schedule
        if args.speculative_simulate_accept_length is not None:
            logger.warning("speculative_simulate_accept_length=%s: benchmarking mode, outputs are NOT the target's",
                           args.speculative_simulate_accept_length)
        if args.speculative_adaptive and plan["num_steps"]:
            self.scheduler.adaptive = adaptive_policy(self.runner, args.step_candidates(),
                                                      min(args.cuda_graph_max_bs, args.max_running_requests),
                                                      args.speculative_adaptive_probe_rounds)
        self.load_seconds = time.perf_counter() - t0

    # The engine drives every worker through these four calls (and info()).
    def add(self, req: Request) -> None:
        self.scheduler.add(req)

    def abort(self, rid: str) -> bool:
        return self.scheduler.abort(rid)

    def step(self) -> list[Request]:
        return self.scheduler.step()

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def set_num_steps(self, k: int) -> None:
        self.scheduler.num_steps = k

    def close(self) -> None:
        """Frees the models, KV cache and graphs (Engine.shutdown); the worker takes no more calls."""
        self.scheduler = self.runner = None
        if self.routing_trace is not None:
            self.routing_trace.close()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def info(self) -> dict:
        s = self.scheduler.stats
        steps = s.step_seconds
        return {
            "avg_spec_accept_length": s.avg_accept_length,
            "verify_forwards": s.verify_forwards,
            "accepted_tokens": s.accepted_tokens,
            "accept_length_hist": dict(s.accept_length_hist),
            "prompt_tokens": s.prompt_tokens,
            "generated_tokens": s.generated_tokens,
            "finished_requests": s.finished_requests,
            # Retractions (KV pool full: requests back to the waiting queue, to re-prefill): totals, and the latest
            # one's requests and age (seconds before this call, measured here: with TP no clock leaves the worker).
            "retracted_requests": s.retracted_requests,
            "retracted_input_tokens": s.retracted_input_tokens,
            "retracted_output_tokens": s.retracted_output_tokens,
            "last_retraction_requests": s.last_retraction_requests,
            "last_retraction_age_s": (None if s.last_retraction_time is None
                                      else time.perf_counter() - s.last_retraction_time),
            "recent_step_seconds": list(steps[-256:]),
            "forward_counts": self.runner.stats.as_dict(),
            "grammar_proposals": dict(self.runner.grammar_proposals),
            "cuda_graphs": self.runner.graph_report(),
            "kv_pages_free": self.runner.allocator.num_free,
            "kv_pages_total": self.runner.allocator.num_pages - 1,
            "running_requests": len(self.scheduler.running),
            "waiting_requests": len(self.scheduler.waiting),
            "load_seconds": round(self.load_seconds, 3),
            "speculative_num_steps": self.scheduler.num_steps,  # this round's k (an adaptive policy moves it)
            "adaptive": None if self.scheduler.adaptive is None else self.scheduler.adaptive.report(
                self.scheduler.num_steps, len(self.scheduler.running), self.scheduler.samples(self.scheduler.running)),
        }
