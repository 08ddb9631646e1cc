"""End-to-end tokens/s, baseline vs EAGLE-3, through the public Engine (CPU or GPU, graphs on where CUDA).

Two workloads:
  default        the embedded trained pair (or --model-path/--draft-path) on held-out prompts from a text the
                 models were not trained on (World English Bible, benchmarks/data/heldout_prompts.txt):
                 single-stream, greedy (or --sampling); accept length measured, for each k in --ks.
  --kimi-slice   a Kimi-K2.5-shaped TP=8 rank slice (61 layers, INT4 experts, random weights; collectives
                 skipped) with a Kimi-shaped random EAGLE-3 draft, on one GPU; random drafts never agree, so
                 the accept length is pinned (--simulate-accept 2.5 3.0 3.5, as SGLang's SGLANG_SIMULATE_ACC_LEN)
                 and the output is NOT lossless in that mode. Reports one rank's compute, no all-reduce cost,
                 unless --comm-gpus N: then each of N GPUs holds the same slice and the all-reduces run over
                 the N with NCCL (TP=8's message sizes, an N-GPU all-reduce; the lm_head all-gather skipped).
                 --adaptive --accept-phases 1 3 --repeat 4: an adaptive run whose pinned accept length changes
                 before every pass (1, 3, 1, 3), so each pass times how the policy follows the change.
The embedded workload runs tensor-parallel with --tp-size N (real sharding, N GPUs).
Prefill runs as CUDA graphs by default (the engine's cuda_graph_prefill_tokens); --prefill-graphs none default
--repeat-variants 2 times the Kimi slice with and without them, alternating in one process.
--sampling greedy temperature=0.7,top_p=0.95 runs each configuration greedy and sampled (variants, alternating).

Tokens/s here = completion tokens / wall time of Engine.generate (prefill included), single stream; with
--repeat N the median of N timed passes per configuration (every pass is in the JSON: between runs of the same
code the Kimi slice moved 3-7%, so a single run is no level to compare against).

    python benchmarks/bench_e2e.py --out benchmarks/results/cpu/e2e_embedded.json
    python benchmarks/bench_e2e.py --kimi-slice --out benchmarks/results/h200/e2e_kimi_slice.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's package, also when run from another tree's copy

import sglang_eagle3  # noqa: E402
from benchmarks.routing import drawn_routing, parse_routing  # noqa: E402
from sglang_eagle3.bench.harness import git_commit  # noqa: E402


def _provenance(device: str) -> dict:
    return {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(),
            "package": os.path.dirname(sglang_eagle3.__file__),  # what ran (GIT_COMMIT: what was sent)
            "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
            "cpu_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _timed_generate(engine, prompts, params, input_ids=False, repeat=1, concurrency=1, before_pass=None) -> dict:
    """Warm up, then time the prompts one request at a time (or ``concurrency`` at a time, each group one batch
    that runs to its end), ``repeat`` times over: tok_per_s is the median pass, and every pass is kept
    (``tok_per_s_runs``) so one run is never read as a level. ``before_pass(i)``: called before pass i, untimed."""
    kw = {"input_ids": prompts} if input_ids else {"prompt": prompts}
    engine.generate(**{k: v[:1] for k, v in kw.items()}, sampling_params={**params, "max_new_tokens": 8})  # warm
    passes = []
    for i in range(repeat):
        if before_pass is not None:
            before_pass(i)
        tokens = verify = 0
        sizes = []  # requests each generate call returned
        t0 = time.perf_counter()
        for i in range(0, len(prompts), concurrency):
            if concurrency == 1:  # single stream: one request at a time
                outs = [engine.generate(**{k: v[i] for k, v in kw.items()}, sampling_params=params)]
            else:
                outs = engine.generate(**{k: v[i:i + concurrency] for k, v in kw.items()}, sampling_params=params)
            sizes.append(len(outs))
            tokens += sum(o["meta_info"]["completion_tokens"] for o in outs)
            verify += sum(o["meta_info"]["spec_verify_ct"] for o in outs)
        passes.append((tokens, verify, time.perf_counter() - t0))
    tps = [t / w for t, _, w in passes]
    tokens, verify = sum(t for t, _, _ in passes), sum(v for _, v, _ in passes)
    return {"tok_per_s": statistics.median(tps), "tok_per_s_runs": [round(x, 2) for x in tps],
            "requests_per_call": sizes,
            "tokens": tokens, "wall_s": sum(w for _, _, w in passes), "verify_forwards": verify,
            "accept_length": tokens / verify if verify else None}


def _rate(r: dict) -> str:
    """'91.7 tok/s', or with several passes '91.7 tok/s (median of 3: 90.0-94.6)'."""
    runs = r["tok_per_s_runs"]
    spread = f" (median of {len(runs)}: {min(runs):.1f}-{max(runs):.1f})" if len(runs) > 1 else ""
    return f"{r['tok_per_s']:.1f} tok/s{spread}"


def sampling_params(spec: str) -> dict:
    """--sampling value -> sampling params: "greedy", or comma-separated NAME=VALUE (temperature, top_p, top_k,
    min_p, seed, the penalties: frequency_penalty, presence_penalty, repetition_penalty, min_new_tokens, and a
    grammar: json_schema or regex, a value without commas, e.g. json_schema=$$ANY$$ (any JSON); temperature=0 with a
    penalty or a grammar: greedy over the processed logits)."""
    if spec == "greedy":
        return {"temperature": 0}
    kinds = {"temperature": float, "top_p": float, "min_p": float, "top_k": int, "seed": int,
             "frequency_penalty": float, "presence_penalty": float, "repetition_penalty": float, "min_new_tokens": int,
             "json_schema": str, "regex": str}
    out = {}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        if name not in kinds or not value:
            raise SystemExit(f"--sampling: {item!r} is not NAME=VALUE with NAME one of {sorted(kinds)} (or: greedy)")
        out[name] = kinds[name](value)
    return out


def embedded(a) -> dict:
    from sglang_eagle3 import env
    from sglang_eagle3.engine import EMBEDDED_DIR

    target = a.model_path or os.path.join(EMBEDDED_DIR, "target")
    draft = a.draft_path or os.path.join(EMBEDDED_DIR, "draft")
    with open(a.prompts) as f:
        prompts = [ln.strip() for ln in f if ln.strip()][: a.num_prompts]
    common = dict(device=a.device, log_level="warning", disable_cuda_graph=a.disable_cuda_graph, tp_size=a.tp_size)
    # A single stream runs batch 1 only: an engine sized for one request captures (and an adaptive one times) no
    # batch bucket it would never use (the embedded adaptive engine's start-up on the CPU box: 41 s for buckets 1-16).
    common["max_running_requests"] = max(a.concurrency, 32) if a.concurrency > 1 else 1
    if len(a.prefill_graphs) != 1:
        raise SystemExit("--prefill-graphs takes one variant for the embedded workload (several: --kimi-slice)")
    buckets = prefill_tokens(a.prefill_graphs[0])
    if buckets is not None:
        common["cuda_graph_prefill_tokens"] = buckets
    out = {"workload": {"model": target, "draft": draft, "prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
                        "sampling": a.sampling, "single_stream": a.concurrency == 1, "concurrency": a.concurrency,
                        "tp_size": a.tp_size}, "runs": []}
    # Each variant (--env-variants x --overlap-schedule x --sampling) runs the baseline and every k in turn, the
    # variants alternating (--repeat-variants); the names carry the variant when there are several. An environment
    # setting holds while its engines are built and run (TP workers are spawned with it).
    from benchmarks.bench_verify_graph import parse_env_variant

    variants = [(e, o, smp) for _ in range(a.repeat_variants) for e in a.env_variants for o in a.overlap_schedule
                for smp in a.sampling]
    first_ids = {}
    for env_set, overlap, smp in variants:
        with env.overrides(parse_env_variant(env_set)):
            _embedded_variant(a, out, target, draft, prompts, common, first_ids, env_set, overlap, smp)
    return out


def _embedded_variant(a, out, target, draft, prompts, common, first_ids, env_set, overlap, smp) -> None:
    """embedded()'s baseline and every k for one variant, appended to out["runs"]."""
    from sglang_eagle3 import Engine

    tag = ", ".join(([env_set or "environment as is"] if len(a.env_variants) > 1 else [])
                    + ([f"overlap schedule {overlap}"] if len(a.overlap_schedule) > 1 else [])
                    + ([f"sampling {smp}"] if len(a.sampling) > 1 else []))
    tag = f"[{tag}]" if tag else ""
    params = {"max_new_tokens": a.max_new_tokens, **sampling_params(smp)}
    kw = dict(common, disable_overlap_schedule=overlap == "off")
    base_engine = Engine(model_path=target, **kw)
    base = _timed_generate(base_engine, prompts, params, repeat=a.repeat, concurrency=a.concurrency)
    base_ids = [base_engine.generate(p, params)["output_ids"] for p in prompts[:4]]
    base_engine.shutdown()  # TP workers hold the GPUs until then
    first_ids.setdefault(smp, base_ids)
    out["runs"].append({"name": "baseline" + tag, "identical_across_variants": base_ids == first_ids[smp],
                        **base})
    print(f"baseline{tag}: {_rate(base)}", flush=True)
    runs = ([] if a.adaptive_only else [(k, False, None) for k in a.ks]) + (
        [(a.k, True, n) for n in a.adaptive_probe_rounds] if a.adaptive else [])
    for k, adaptive, probe in runs:
        eng = Engine(model_path=target, speculative_algorithm="EAGLE3", speculative_draft_model_path=draft,
                     speculative_num_steps=k, speculative_adaptive=adaptive,
                     **kw, **({} if probe is None else {"speculative_adaptive_probe_rounds": probe}))
        r = _timed_generate(eng, prompts, params, repeat=a.repeat, concurrency=a.concurrency)
        lossless = [eng.generate(p, params)["output_ids"] for p in prompts[:4]] == base_ids
        info = eng.get_server_info()
        name = f"eagle3_adaptive_from_k{k}" if adaptive else f"eagle3_k{k}"
        name += _probe_tag(a, probe)
        r.update(name=name + tag, speedup=r["tok_per_s"] / base["tok_per_s"], lossless_first4=lossless,
                 verify_graph_eager=info["forward_counts"].get("target_verify"), adaptive=info.get("adaptive"))
        eng.shutdown()
        out["runs"].append(r)
        print(f"{name}{tag}: {_rate(r)} ({r['speedup']:.2f}x), accept length "
              f"{r['accept_length']:.2f}, identical output {lossless}" + _adaptive_line(r), flush=True)


def _probe_tag(a, probe: int | None) -> str:
    """A run's name suffix for its probe_rounds where several are compared."""
    return f"_probe{probe}" if probe is not None and len(a.adaptive_probe_rounds) > 1 else ""


def _adaptive_line(r: dict) -> str:
    """The adaptive policy's state after a run, for the printed line."""
    ad = r.get("adaptive")
    if not ad:
        return ""
    return (f"; adaptive: k={ad['num_steps']} after {ad['rounds']} rounds, {ad['switches']} switches, acceptance "
            f"{', '.join(f'{p:.2f}' for p in ad['acceptance'])}")


class WorkerEngine:
    """The few Engine methods _timed_generate uses, over one ModelWorker (the Kimi slice's, or an Engine's
    backend), keeping each step's draft length after it (``ks``; None without a draft)."""

    def __init__(self, worker):
        self.w = worker
        self.first_steps: list[float] = []  # seconds of each request's first step: its prefill
        self.ks: list[int | None] = []

    def generate(self, input_ids, sampling_params):
        from sglang_eagle3.runtime.request import Request
        from sglang_eagle3.runtime.sampling import SamplingParams

        batch = isinstance(input_ids[0], list)
        reqs = [Request(rid=str(i), input_ids=p, params=SamplingParams.from_dict(sampling_params))
                for i, p in enumerate(input_ids if batch else [input_ids])]
        for r in reqs:
            self.w.add(r)
        t0, first = time.perf_counter(), True
        while self.w.has_work():
            self.w.step()
            self.ks.append(self.w.scheduler.num_steps)
            if first:  # one request at a time: the first step is its prefill (and draft extend)
                self.first_steps.append(time.perf_counter() - t0)
                first = False
        res = [{"output_ids": r.output_ids, "meta_info": {"completion_tokens": len(r.output_ids),
                                                          "spec_verify_ct": r.verify_ct}} for r in reqs]
        return res if batch else res[0]


def timed_phases(engine: WorkerEngine, prompts, params, phases: list[float], repeat: int, concurrency: int = 1) -> dict:
    """_timed_generate with the pinned accept length changed before every pass, pass i at phases[i % len]: an
    adaptive policy carries its estimates from one pass to the next (the same worker), so each pass after the first
    times how it follows the change (--accept-phases). Adds ``phases``, per pass: its accept length, tok/s, steps,
    the steps after which each k was set, and the first step after which the draft ran (k > 0) and rested (k = 0)."""
    sched, starts = engine.w.scheduler, []

    def before_pass(i: int) -> None:
        sched.simulate_accept_length = phases[i % len(phases)]
        starts.append(len(engine.ks))

    r = _timed_generate(engine, prompts, params, input_ids=True, repeat=repeat, concurrency=concurrency,
                        before_pass=before_pass)
    r["phases"] = []
    for i, (a, b) in enumerate(zip(starts, [*starts[1:], len(engine.ks)], strict=True)):
        ks = engine.ks[a:b]
        r["phases"].append({
            "accept_length": phases[i % len(phases)], "tok_per_s": r["tok_per_s_runs"][i], "steps": len(ks),
            "steps_at_k": {k: ks.count(k) for k in sorted(set(ks))},
            "first_step_drafting": next((j for j, k in enumerate(ks) if k), None),
            "first_step_resting": next((j for j, k in enumerate(ks) if k == 0), None)})
    return r


def _phases_line(r: dict) -> str:
    """Per pass of a --accept-phases run: its accept length, tok/s and steps at each k."""
    return "".join(f"\n    pass {i} at accept length {p['accept_length']:g}: {p['tok_per_s']:.1f} tok/s, steps at k "
                   f"{p['steps_at_k']}, first drafting {p['first_step_drafting']}, first resting "
                   f"{p['first_step_resting']}" for i, p in enumerate(r.get("phases") or ()))


def _kimi_slice_rank(rank: int, world: int, a) -> dict:
    return kimi_slice(a, rank, world)


def kimi_models(layers: int, aux_layer_ids: tuple[int, ...] | None = None):
    """(bench_verify_graph as a module, target, draft): the Kimi-K2.5 TP=8 rank slice with ``layers`` layers and
    INT4 experts, and the Kimi-shaped EAGLE-3 draft (``aux_layer_ids``: its aux layers, if not Kimi's), random
    weights on the GPU; the draft's d2t offsets zero (its ids are the target's first 32000)."""
    from benchmarks.bench_draft_step import kimi_draft_config
    from sglang_eagle3.models.deepseek_v3 import DeepseekV3ForCausalLM
    from sglang_eagle3.models.eagle3 import Eagle3Draft

    spec = importlib.util.spec_from_file_location("bvg", os.path.join(HERE, "bench_verify_graph.py"))
    bvg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bvg)
    dcfg = kimi_draft_config()
    if aux_layer_ids is not None:
        dcfg = dataclasses.replace(dcfg, aux_layer_ids=aux_layer_ids)
    with torch.device("cuda"):
        target = DeepseekV3ForCausalLM(bvg.kimi_config(layers, 384), dtype=torch.bfloat16, int4_experts=True)
        draft = Eagle3Draft(dcfg, dtype=torch.bfloat16)
    bvg.randomize_cuda(target, 0)
    bvg.randomize_cuda(draft, 1)
    draft.d2t.zero_()
    return bvg, target, draft


def kimi_slice(a, rank: int = 0, world: int = 1) -> dict:
    """Random Kimi-shaped rank slice + draft, built in memory (no checkpoint), driven by a ModelWorker. With
    world > 1 (run_ranks, --comm-gpus) every rank runs the same and the all-reduces go over the real group."""
    import builtins

    from sglang_eagle3 import env
    from sglang_eagle3.distributed.parallel_state import init_tp
    from sglang_eagle3.engine import EngineArgs
    from sglang_eagle3.runtime.worker import ModelWorker

    if a.profile:
        from benchmarks import profile_round as profile
    print = builtins.print if rank == 0 else (lambda *x, **kw: None)  # noqa: A001 - one rank speaks
    init_tp(0, 8, simulated=True, simulated_all_reduce=world > 1)
    bvg, target, draft = kimi_models(a.layers)
    if a.draft_attention != "auto":  # pinned whatever backend the runner gives the draft's other kernels
        set_backends = type(draft).set_kernel_backends

        def pinned(attention: str = "auto") -> None:
            set_backends(draft, attention)
            draft.midlayer.self_attn.use_triton = a.draft_attention == "triton"

        draft.set_kernel_backends = pinned
    prompts = [[(17 * i + 3 * j) % 20480 for j in range(a.prompt_len)] for i in range(a.num_prompts)]
    # Each --routing value: None (the router's own) or its draws (decode and verify forwards of up to 16 tokens a
    # request, every batch bucket), made once and entered around each worker's life (capture and requests).
    moe_layers = len(target.moe_blocks())
    requests = max(a.cuda_graph_max_bs, a.concurrency)
    routings = {text: drawn_routing(parse_routing(text), target.config.n_routed_experts,
                                    target.config.num_experts_per_tok, moe_layers,
                                    shapes=[(b, w) for b in range(1, requests + 1) for w in range(1, 17)])
                for text in a.routing}
    out = {"workload": {"model": "Kimi-K2.5 TP=8 rank slice, random INT4 experts", "layers": a.layers,
                        "routing": {text: parse_routing(text).label() for text in a.routing},
                        "prompt_len": a.prompt_len, "max_new_tokens": a.max_new_tokens,
                        "context_length": a.context_length or "prompt + new tokens + 64",
                        "draft_attention": a.draft_attention, "sampling": a.sampling,
                        "concurrency": a.concurrency,
                        "comm_gpus": world,
                        "note": ("collectives skipped" if world == 1 else
                                 f"the same rank slice on each of {world} GPUs, all-reduces over the {world} (NCCL), "
                                 "lm_head all-gather skipped")
                                + "; accept length pinned (outputs not lossless in that mode)"},
           "runs": []}

    # An accept length of 0: not pinned (the random draft's real acceptance, ~1 token a round).
    # n: None for fixed k, else the adaptive run's probe_rounds
    probes = ((() if a.adaptive_only else (None,)) + tuple(a.adaptive_probe_rounds)) if a.adaptive else (None,)
    configs = [("baseline", None, None, False, None)] + [
        (f"eagle3_{'adaptive_from_' if n is not None else ''}k{a.k}" + (f"_acc{x}" if x else "") + _probe_tag(a, n),
         a.k, x or None, n is not None, n)
        for x in a.simulate_accept for n in probes]
    if a.accept_phases:  # the adaptive runs' accept length changes pass by pass (timed_phases)
        tag = "_phases" + ",".join(f"{x:g}" for x in a.accept_phases)
        configs += [(f"eagle3_adaptive_from_k{a.k}{tag}{_probe_tag(a, n)}", a.k, a.accept_phases[0], True, n)
                    for n in a.adaptive_probe_rounds]
    variants = [(v, prefill_tokens(v), m, e, o, smp, r) for v in a.prefill_graphs for m in a.mha_prefill_tokens
                for e in a.env_variants for o in a.overlap_schedule for smp in a.sampling for r in a.routing]
    # Each variant (prefill graphs x MHA prefill x environment x overlap schedule x sampling) runs every
    # configuration in turn, the variants alternating (--repeat-variants).
    schedule = [(v, c) for _ in range(a.repeat_variants) for v in variants for c in configs]
    base_tps = {}
    for (graphs, buckets, mha, env_set, overlap, smp, routing), (cname, k, acc, adaptive, probe) in schedule:
        params = {"max_new_tokens": a.max_new_tokens, "ignore_eos": True, **sampling_params(smp)}
        variant = graphs if mha is None else f"{graphs}, mha_prefill_tokens {mha}"
        variant += f", {env_set}" if env_set else ""
        variant += f", overlap schedule {overlap}" if len(a.overlap_schedule) > 1 else ""
        variant += f", sampling {smp}" if len(a.sampling) > 1 else ""
        variant += f", routing {routing}" if len(a.routing) > 1 else ""
        name = cname if len(variants) == 1 else f"{cname}[prefill graphs {variant}]"
        extra = ({} if buckets is None else {"cuda_graph_prefill_tokens": buckets}) | (
            {} if mha is None else {"mha_prefill_tokens": mha}) | (
            {} if probe is None else {"speculative_adaptive_probe_rounds": probe})
        args = EngineArgs(model_path="<in-memory>", device="cuda", dtype="bfloat16",
                          max_running_requests=max(a.cuda_graph_max_bs, a.concurrency),
                          cuda_graph_max_bs=a.cuda_graph_max_bs,
                          speculative_algorithm="EAGLE3" if k else None,
                          speculative_draft_model_path="<in-memory>" if k else None, speculative_num_steps=k,
                          speculative_simulate_accept_length=acc, speculative_adaptive=adaptive,
                          attention_backend=a.backend,
                          moe_runner_backend=a.backend, disable_overlap_schedule=overlap == "off",
                          mem_fraction_static=a.mem_fraction_static, **extra)
        ctx = a.context_length or a.prompt_len + a.max_new_tokens + 64  # the graphs' page table width
        widths = tuple(c + 1 for c in args.step_candidates()) if k else (1,)
        plan = {"context_length": ctx, "num_steps": k, "verify_widths": widths,
                "num_pages": a.concurrency * (ctx // args.page_size + 4), "eos": ()}
        drawn = routings[routing] or contextlib.nullcontext()  # around capture and the requests' eager forwards
        with env.overrides(bvg.parse_env_variant(env_set)), drawn:  # (kernel configs are read as graphs are captured)
            for m in (target, draft):  # what the models read when built (fusions, overlaps), under this setting
                bvg.apply_env_settings(m)
            worker = ModelWorker(args, plan, torch.device("cuda"),
                                 models=(target, draft if k else None))
            engine = WorkerEngine(worker)
            if "_phases" in cname:
                r = timed_phases(engine, prompts, params, a.accept_phases, a.repeat, a.concurrency)
            else:
                r = _timed_generate(engine, prompts, params, input_ids=True, repeat=a.repeat,
                                    concurrency=a.concurrency)
            if a.profile:  # where a step's time goes: host or GPU (profile_round.py's passes, one prompt)
                stats = engine.w.scheduler.stats
                r["profile"] = profile.profile_config(lambda e=engine, p=params: e.generate(prompts[0], p), stats, 25,
                                                      lambda s=stats: s.avg_accept_length)
                profile.print_profile(name, r["profile"])
        r["prefill_ms"] = round(statistics.median(engine.first_steps[1:]) * 1e3, 2)  # [0]: the warm-up's
        base_tps.setdefault(variant, r["tok_per_s"])
        r.update(name=name, speedup=r["tok_per_s"] / base_tps[variant], pinned_accept_length=acc,
                 prefill_graphs=variant, forward_counts=worker.runner.stats.as_dict(),
                 graphs=worker.runner.graph_report(), adaptive=worker.info()["adaptive"])
        out["runs"].append(r)
        captured = {n: g for n, g in r["graphs"].items() if g["graphs"]}
        print(f"{name}: {_rate(r)} ({r['speedup']:.2f}x)"
              + (f", accept length {r['accept_length']:.2f}" if r["accept_length"] else "")
              + f", prefill (first step) {r['prefill_ms']} ms" + _adaptive_line(r) + "; graphs captured: "
              + ", ".join(f"{n} {g['graphs']} in {g['capture_seconds']:.1f} s, {g['capture_mib']:.0f} MiB"
                          for n, g in captured.items()) + _phases_line(r), flush=True)
        # The next configuration's KV cache is sized to the memory free when its worker is built: this one's cache
        # and graphs go first (the engine wrapper held the worker past a plain `del`, so on an 80 GB H100 the second
        # speculative engine found 2 GiB less than the first, and the third none; the shared weights stay).
        worker.close()
        del worker, engine
        gc.collect()
        torch.cuda.empty_cache()
    # forwards the draws did not cover (prefills), by routing
    out["workload"]["own_routing_rows"] = {text: sorted(d.own_rows) for text, d in routings.items() if d}
    return out


def prefill_tokens(variant: str) -> tuple[int, ...] | None:
    """--prefill-graphs value -> cuda_graph_prefill_tokens: "default" (None: the engine's), "none" (()), or
    comma-separated buckets."""
    if variant == "default":
        return None
    if variant == "none":
        return ()
    try:
        return tuple(int(x) for x in variant.split(","))
    except ValueError:
        raise SystemExit(f"--prefill-graphs: {variant!r} is not default, none or comma-separated integers") from None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--model-path")
    ap.add_argument("--draft-path")
    ap.add_argument("--prompts", default=os.path.join(HERE, "data", "heldout_prompts.txt"))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--disable-cuda-graph", action="store_true")
    ap.add_argument("--kimi-slice", action="store_true")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--simulate-accept", type=float, nargs="*", default=[2.5, 3.0, 3.5],
                    help="pinned accept lengths of the EAGLE-3 configurations (0: not pinned; none: the baseline "
                    "only)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--tp-size", type=int, default=1, help="the embedded workload's tensor-parallel size")
    ap.add_argument("--comm-gpus", type=int, default=1,
                    help="--kimi-slice on N GPUs: the same rank slice on each, all-reduces over the N (NCCL)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="timed passes over the prompts per configuration; tok/s is their median, all are kept")
    ap.add_argument("--prefill-graphs", nargs="+", default=["default"], metavar="VARIANT",
                    help="--kimi-slice: prefill CUDA graph buckets per variant: default (the engine's), none (eager "
                    "prefill), or comma-separated token counts; several variants run in one process")
    ap.add_argument("--mha-prefill-tokens", type=int, nargs="+", default=[None], metavar="N",
                    help="--kimi-slice: EngineArgs.mha_prefill_tokens per variant (0: absorbed prefill; default: the "
                    "engine's), crossed with --prefill-graphs, alternating")
    ap.add_argument("--env-variants", nargs="+", default=[""], metavar="SETTINGS",
                    help="environment settings per variant (space-separated NAME=VALUE, '' for the environment as "
                    "it is), crossed with the others, e.g. SGLANG_EAGLE3_GRAMMAR_PREFILL_BELOW_US=0, or a config table "
                    "'SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gemv_fp32_table.json'")
    ap.add_argument("--overlap-schedule", nargs="+", choices=["on", "off"], default=["on"],
                    help="the engine's overlap schedule per variant (off: disable_overlap_schedule), crossed with the "
                    "others (--kimi-slice)")
    ap.add_argument("--sampling", nargs="+", default=["greedy"], metavar="SPEC",
                    help="sampling per variant: greedy, or comma-separated NAME=VALUE (temperature, top_p, top_k, "
                    "min_p, seed, frequency_penalty, presence_penalty, repetition_penalty, min_new_tokens), crossed "
                    "with the others")
    ap.add_argument("--repeat-variants", type=int, default=1,
                    help="alternate the variants this many times (the embedded workload: --overlap-schedule; "
                    "--kimi-slice: every variant option)")
    ap.add_argument("--context-length", type=int, default=0,
                    help="--kimi-slice: the context limit (page table width of every graph), as a server sets it; "
                    "default: prompt + new tokens + 64")
    ap.add_argument("--draft-attention", choices=["auto", "triton", "torch"], default="auto",
                    help="--kimi-slice: the draft's attention on this backend (the torch reference gathers the "
                    "whole page table; auto: as --backend)")
    ap.add_argument("--profile", action="store_true",
                    help="--kimi-slice: after timing, profile each configuration's steps over one prompt: wall, GPU "
                    "kernel time and the host's Python functions (benchmarks/profile_round.py's passes)")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=1,
                    help="--kimi-slice: the largest batch bucket captured (and running requests): for the capture "
                         "time and graph memory a server's setting costs; with --concurrency, the batches' graphs")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="prompts submitted together, each group one batch run to its end (default 1: a single "
                         "stream); tok/s is then the batches' throughput")
    ap.add_argument("--mem-fraction-static", type=float, default=0.96,
                    help="--kimi-slice: the engine's mem_fraction_static (on an 80 GB H100 the slice and its draft "
                    "leave 4.4 GiB free: 0.85 and 0.93 keep more than that for activations, so no KV cache fits)")
    ap.add_argument("--adaptive", action="store_true",
                    help="also run EAGLE-3 with speculative_adaptive from k = --k (embedded: beside every --ks; "
                    "Kimi slice: beside each --simulate-accept)")
    ap.add_argument("--adaptive-only", action="store_true",
                    help="with --adaptive: leave out the fixed-k EAGLE-3 runs (the baseline stays)")
    ap.add_argument("--adaptive-probe-rounds", type=int, nargs="+", default=[16],
                    help="--adaptive: the resting draft's rounds between catch-ups (speculative_adaptive_probe_rounds; "
                    "0: k = 0 rounds run the draft's extend); several values: an adaptive run for each")
    ap.add_argument("--accept-phases", type=float, nargs="+", default=None, metavar="ACCEPT_LENGTH",
                    help="--kimi-slice --adaptive: one more adaptive run a --adaptive-probe-rounds value, its pinned "
                    "accept length changed before every --repeat pass, pass i at the i-th value (cycling): the policy "
                    "carries its estimates over, so each pass times how it follows the change (e.g. 1 3 --repeat 4)")
    ap.add_argument("--routing", nargs="+", default=["own"], metavar="own|uniform|reuse:P|trace:PATH",
                    help="--kimi-slice: the MoE layers' expert ids at decode and verify (benchmarks/routing.py): the "
                         "random router's own (a verify's tokens on nearly the same few experts), or drawn before "
                         "capture: uniform (a trained router's spread), reuse:P, trace:PATH; several: variants, each "
                         "configuration's speedup against the baseline of its own routing")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {a.repeat}")
    if a.concurrency < 1:
        ap.error(f"--concurrency must be >= 1, got {a.concurrency}")
    if a.adaptive_only and not a.adaptive:
        ap.error("--adaptive-only leaves out the fixed-k runs beside --adaptive's: give --adaptive too")
    if a.accept_phases and not (a.kimi_slice and a.adaptive):
        ap.error("--accept-phases pins the Kimi slice's adaptive runs' accept length: give --kimi-slice and --adaptive")
    from sglang_eagle3.engine import MAX_NUM_STEPS

    bad = [x for x in a.accept_phases or () if not 1.0 <= x <= MAX_NUM_STEPS + 1]
    if bad:
        ap.error(f"--accept-phases {bad}: each accept length must lie in [1, {MAX_NUM_STEPS + 1}] (1: no draft "
                 "accepted)")
    if a.comm_gpus > 1 and not a.kimi_slice:
        ap.error("--comm-gpus is for --kimi-slice (the embedded workload takes --tp-size)")
    for text in a.routing:
        try:
            choice = parse_routing(text)
        except ValueError as e:
            ap.error(str(e))
        if choice.drawn and not a.kimi_slice:
            ap.error("--routing draws the Kimi slice's expert ids: give --kimi-slice")
        # a row count's draw (or traced forward) takes one split into requests
        if choice.kind in ("reuse", "trace") and max(a.concurrency, a.cuda_graph_max_bs) > 1:
            ap.error(f"--routing {text} chains a request's tokens: it needs one request a step (--concurrency 1, "
                     "--cuda-graph-max-bs 1); uniform takes any")
    if a.kimi_slice and a.comm_gpus > 1:
        from sglang_eagle3.bench.ranks import run_ranks

        res = run_ranks(a.comm_gpus, _kimi_slice_rank, a)[0]
    else:
        res = kimi_slice(a) if a.kimi_slice else embedded(a)
    res["provenance"] = _provenance("cuda" if a.kimi_slice else a.device)
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1, default=str)
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
