"""``Engine``: the offline API, shaped like SGLang's ``sglang.Engine`` (keyword names follow ServerArgs).

    engine = Engine(model_path=..., speculative_algorithm="EAGLE3", speculative_draft_model_path=...,
                    speculative_num_steps=3, device="cuda")
    out = engine.generate("Hello", {"max_new_tokens": 32, "temperature": 0})
    out["text"], out["output_ids"], out["meta_info"]["spec_verify_ct"]

With no model_path the embedded default pair (a small trained target + EAGLE-3 draft shipped in the
package) is served, with EAGLE-3 on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass

import torch

from sglang_eagle3 import env
from sglang_eagle3.config import ConfigError, GenerationConfig, resolve_aux_layer_ids
from sglang_eagle3.env_report import git_commit
from sglang_eagle3.runtime.grammar import GrammarBackend
from sglang_eagle3.runtime.interrupts import defer_interrupt
from sglang_eagle3.runtime.request import SGLANG_UNSUPPORTED, Request, sglang_neutral
from sglang_eagle3.runtime.sampling import (
    SamplingParams,
    SamplingParamsError,
    find_stop,
    find_stop_regex,
    parallel_samples,
    seeded,
    settled_chars,
    short_repr,
)

logger = logging.getLogger(__name__)

EMBEDDED_DIR = os.path.join(os.path.dirname(__file__), "assets", "embedded")
EMBEDDED_TARGET = os.path.join(EMBEDDED_DIR, "target")  # (what an engine without model_path serves)


class RequestError(ValueError):
    """A client's request is invalid (bad prompt, token ids or sampling params); never a server fault."""


@dataclass(frozen=True)
class FlushCacheReqOutput:
    """What SGLang's Engine.flush_cache returns (its io_struct's name and fields)."""

    success: bool
    message: str = ""


# SGLang's arguments that change nothing here whatever their value: a trace header, a session's identity, and a
# prefix-cache namespace or hints (this engine shares no cache between requests).
_SGLANG_IGNORED_ARGUMENTS = ("external_trace_header", "session_id", "cache_salt", "kv_hints")


def _parallel_sampling(sampling_params):
    """SGLang's parallel sampling: (n, the sampling params without ``n``). One n for every prompt of a batch, as
    SGLang requires."""
    if isinstance(sampling_params, dict):
        if "n" not in sampling_params:
            return 1, sampling_params
        rest = dict(sampling_params)
        return parallel_samples(rest.pop("n"), "sampling_params.n"), rest
    if not isinstance(sampling_params, list) or not sampling_params:
        return 1, sampling_params
    ks = [parallel_samples(sp.get("n"), f"sampling_params[{i}].n") if isinstance(sp, dict) else 1
          for i, sp in enumerate(sampling_params)]
    if len(set(ks)) > 1:
        raise SamplingParamsError(f"sampling_params' n differ between the prompts of the batch ({sorted(set(ks))}): "
                                  "one n for the whole batch, as in SGLang")
    return ks[0], [{k: v for k, v in sp.items() if k != "n"} if isinstance(sp, dict) else sp
                   for sp in sampling_params]


def _check_sglang_only_arguments(kwargs: dict) -> None:
    for name, v in kwargs.items():
        if name in _SGLANG_IGNORED_ARGUMENTS:
            continue
        if name not in SGLANG_UNSUPPORTED:
            raise TypeError(f"generate() got an unexpected keyword argument {name!r}")
        if not sglang_neutral(v):
            raise RequestError(f"{name}={short_repr(v)} is not supported: this engine has no "
                               f"{SGLANG_UNSUPPORTED[name]} (pass it as None or leave it out)")


async def _async_chunks(chunks):
    """generate(stream=True)'s iterator read in its own thread, its chunks handed to the event loop as they come
    (the engine holds its lock in that one thread from the first step to the last)."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def put(item):
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop was closed: no one reads any more
            stop.set()

    def pump():
        try:
            for out in chunks:
                put(("chunk", out))
                if stop.is_set():
                    break
        except BaseException as e:  # noqa: BLE001 -- raised again in the reader's task
            put(("error", e))
        else:
            put(("end", None))
        finally:
            chunks.close()  # a reader that stopped early: the rest of its requests are aborted

    threading.Thread(target=pump, name="sglang_eagle3-async-stream", daemon=True).start()
    try:
        while True:
            kind, v = await queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise v
            yield v
    finally:
        stop.set()


def checked_generation_config(model_path: str) -> GenerationConfig:
    """The checkpoint's generation_config.json (GenerationConfig), its sampling defaults checked as a request's
    would be: a value no request may set is the file's error, named at start-up, not every chat request's 400."""
    gen = GenerationConfig.from_path(model_path)
    try:
        SamplingParams.from_dict(gen.sampling_defaults())
    except SamplingParamsError as e:
        raise ConfigError(f"{gen.path}: {e}") from None
    return gen


def engine_eos(config_eos: tuple[int, ...], gen: GenerationConfig, tokenizer) -> tuple[int, ...]:
    """The tokens that end a request (without ignore_eos), as SGLang stops: config.json's eos_token_id,
    generation_config.json's, the tokenizer's EOS and its turn-final tokens (tokenizer.ADDITIONAL_STOP_TOKENS). The
    files of one checkpoint may name different ones (a chat turn's end, the pretraining's end of text); the
    tokenizer's counted only where the config named none, a model that ended a turn with it ran to max_new_tokens."""
    eos = [*config_eos, *gen.eos_token_id]
    if tokenizer is not None:
        eos += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        eos += tokenizer.additional_stop_ids
    return tuple(dict.fromkeys(eos))


@dataclass(frozen=True)
class EngineArgs:
    """Engine settings. Names follow SGLang's ServerArgs wherever SGLang has one."""

    model_path: str | None = None
    tokenizer_path: str | None = None
    speculative_algorithm: str | None = None  # None or "EAGLE3" (also accepts "EAGLE")
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None  # k: draft steps per round (chain)
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int | None = None  # k + 1 for a chain
    # Extra draft lengths to capture verify graphs for, so an adaptive policy can switch k at run time. 0: rounds
    # that verify the last token alone (a decode step) while the draft's extend follows it (runtime/adaptive.py).
    speculative_num_steps_candidates: tuple[int, ...] = ()
    # SGLang's flag: the draft length follows the acceptance, round by round, among num_steps and the candidates
    # (with none given: 0, 1, num_steps and num_steps + 2), choosing the k with the most tokens a second from round
    # costs timed at start-up (runtime/adaptive.py).
    speculative_adaptive: bool = False
    # While that policy is at k = 0 the draft rests: plain decode steps, the draft catching up over their tokens in
    # one extend every this many rounds (and before it drafts again); 0: k = 0 rounds run the draft's one-token
    # extend each (runtime/adaptive.py).
    speculative_adaptive_probe_rounds: int = 16
    speculative_aux_layer_ids: tuple[int, ...] | None = None  # explicit override of the draft's wiring
    # Benchmarking only, like SGLang's SGLANG_SIMULATE_ACC_LEN: pins the accept length; output is not lossless.
    speculative_simulate_accept_length: float | None = None
    device: str = "auto"  # "cpu", "cuda", "auto"
    dtype: str = "auto"  # float32, bfloat16, float16, float64 (tests), auto (bf16 on CUDA, fp32 on CPU)
    tp_size: int = 1
    disable_cuda_graph: bool = False
    # Decode and speculative rounds (greedy, sampled or returning logprobs) queue the next round on the GPU before
    # the host reads this one (runtime/scheduler.py, "Overlap"); True reads each round before the next is built
    # (SGLang's flag).
    disable_overlap_schedule: bool = False
    # Largest batch (requests) captured as a CUDA graph. 1 (a single-stream server) also puts MLA's q_b and the
    # MoE router + shared gate/up pair on the CUDA-core GEMV, faster at 1-4 rows (kernels/gemv.py fma_for_engine;
    # SGLANG_EAGLE3_GEMV_FMA forces it).
    cuda_graph_max_bs: int = 16
    # (sglang_eagle3) Prompt lengths captured as prefill CUDA graphs: a prompt replays the smallest bucket that
    # holds it, padded, together with the prompts admitted with it (batch buckets up to 8, at most the largest
    # bucket's tokens in all); a longer one goes in chunks of the largest bucket. () turns prefill graphs off
    # (eager prefill, counted with the reason), as does running out of memory capturing them (with a warning).
    # Buckets past the context length are not captured.
    cuda_graph_prefill_tokens: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
    # (sglang_eagle3) Prefill forwards of at least this many new tokens a request compute MLA in its non-absorbed
    # (MHA) form: the context's latents decompressed once into per-head keys and values, which the chunk's tokens
    # share (docs/KERNELS.md, "MLA prefill"). It costs a scratch of heads x (nope + rope + v) elements a KV cache
    # slot (+7% of a Kimi-K2.5 TP=8 rank's cache, +58% with all 64 heads on one GPU). 0: prefill stays absorbed.
    mha_prefill_tokens: int = 64
    max_running_requests: int = 32
    # (sglang_eagle3) Per-request limits, so that one request cannot make every other one slow or run the server
    # out of memory (SGLang has neither, but for 128 top logprobs under prefill/decode disaggregation). The most
    # top_logprobs_num: each position with logprobs carries that many entries, so 163840 of them over a long
    # output (logprob_start_len 0) is gigabytes of response; 20 is the most OpenAI's API accepts for top_logprobs.
    max_top_logprobs_num: int = 20
    # The most stop strings a request: every emitted token of every such request is checked against each of them
    # on the engine thread, so all requests in the batch wait for it (OpenAI accepts 4; SGLang any number).
    max_stop_strings: int = 128
    # The longest stop string, in characters: each emitted token decodes the output's last (its UTF-8 bytes + 2)
    # tokens to look for it.
    max_stop_str_len: int = 256
    context_length: int | None = None
    # KV cache page, tokens. 64: a multiple of the MLA split pass's key tile (64 keys in the H200's table, 16 in
    # sm_120's), so every tile lies in one page and is addressed from one base (docs/KERNELS.md, "In-page key
    # tiles": the 61-layer step 0.6-2.4% faster than a page id a key). Smaller pages work, with that addressing.
    page_size: int = 64
    max_total_tokens: int | None = None  # KV cache size in tokens (default: room for every running request,
    # as far as mem_fraction_static allows on CUDA)
    # Weights + KV cache stay within this fraction of each GPU's memory; the rest is for activations and CUDA
    # graphs (SGLang's flag). A default-sized pool (max_running_requests x context_length) that would not fit is
    # cut to what does, with a warning; an explicit max_total_tokens that does not fit is refused.
    mem_fraction_static: float = 0.85
    attention_backend: str = "auto"  # "triton" | "torch" | "auto" (triton on CUDA)
    moe_runner_backend: str = "auto"  # "triton" | "torch" | "auto"
    random_seed: int = 0
    # Structured output (json_schema / regex / ebnf sampling parameters; SGLang's flags): "xgrammar" (its default),
    # or "none" to refuse requests with a grammar. JSON schemas allow any whitespace between tokens unless
    # constrained_json_disable_any_whitespace (then the separators are fixed: ", " and ": ").
    grammar_backend: str = "xgrammar"
    constrained_json_disable_any_whitespace: bool = False
    # At most this many whitespace characters in a row between a JSON schema's tokens (SGLang's
    # constrained_json_max_whitespace_cnt; None: any number, SGLang's default, where a weak model may pad with spaces
    # until max_new_tokens).
    constrained_json_max_whitespace_cnt: int | None = None
    # A reasoning model's thinking markers (runtime/reasoning.py, SGLang's --reasoning-parser names): a request's
    # grammar then constrains the answer after the thinking, not the thinking (the server also splits chat answers
    # with it when the launch flag sets both). "auto": read from the chat template and tokenizer when the engine
    # starts (runtime/auto_parsers.py; Engine.args then holds what was found, None where nothing was).
    reasoning_parser: str | None = None
    # SGLang's --enable-strict-thinking (runtime/reasoning.py): every request's thinking is held to the reasoning
    # format's rules, its excluded tokens (tool-call markers, the turn's end) refused inside it and its budget
    # (custom_params.thinking_budget, /generate's max_thinking_tokens; SGLANG_MAX_THINK_TOKENS for the rest) forcing
    # its end marker. Needs reasoning_parser. A request is then under a mask until its thinking ends (its rounds run
    # as a grammar's: no overlap schedule for its batch).
    enable_strict_thinking: bool = False
    skip_tokenizer_init: bool = False
    log_level: str = "info"  # for the sglang_eagle3 loggers (load progress, graph capture, fallbacks)
    # Extra environment for the worker processes (the launcher's environment is always inherited). Given at
    # tp_size=1, the model runs in a spawned worker too (use_worker_processes), so that it applies there before
    # torch starts, as on every TP rank: never a setting the model's process silently did not get.
    worker_env: tuple[tuple[str, str], ...] = ()
    use_worker_processes: bool = False  # run even tp_size=1 in a spawned worker (same path as TP)
    worker_timeout: float = 300.0  # seconds a worker may take to answer before it is declared failed
    # Seconds the workers' start (the process group, the checkpoint load, KV pool, graph capture and the adaptive
    # timing) may go without progress from any rank: each checkpoint tensor read and each graph captured is progress
    # (progress.beat), so a 1T-parameter load from network storage may take an hour and a start-up that hangs is
    # still named in minutes, with each rank's last progress and stack. A death or an error is named at once.
    worker_start_timeout: float = 600.0

    def __post_init__(self):
        self._check_types()
        algo = self.speculative_algorithm
        if algo is not None and algo.upper() not in ("EAGLE3", "EAGLE"):
            raise ConfigError(f"speculative_algorithm={algo!r} is not supported (use 'EAGLE3' or None)")
        if algo is None:
            # Settings of a speculation that is off would be silently ignored: a draft path given without the
            # algorithm usually means the algorithm was forgotten. (model_path=None turns EAGLE-3 on itself.)
            given = [f"{n}={getattr(self, n)!r}" for n in ("speculative_draft_model_path", "speculative_num_steps",
                                                          "speculative_num_draft_tokens",
                                                          "speculative_simulate_accept_length")
                     if getattr(self, n) is not None]
            defaults = {f.name: f.default for f in dataclasses.fields(self)}
            given += [f"{n}={getattr(self, n)!r}" for n in ("speculative_num_steps_candidates",
                                                           "speculative_aux_layer_ids",
                                                           "speculative_adaptive_probe_rounds")
                      if getattr(self, n) != defaults[n]]
            if given and self.model_path is not None:
                raise ConfigError(f"{', '.join(given)} given but speculative_algorithm is None: pass "
                                  "speculative_algorithm='EAGLE3' to speculate, or drop them")
        if self.speculative_eagle_topk != 1:
            raise ConfigError(f"speculative_eagle_topk={self.speculative_eagle_topk} is not supported yet "
                              "(chain drafts only: topk=1)")
        if self.device not in ("cpu", "cuda", "auto") and not re.fullmatch(r"cuda:\d+", self.device):
            raise ConfigError(f"device={self.device!r} must be 'cpu', 'cuda[:n]' or 'auto'")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16", "float64"):
            raise ConfigError(f"dtype={self.dtype!r} must be one of auto, float32, bfloat16, float16, float64")
        for name in ("tp_size", "cuda_graph_max_bs", "max_running_requests", "page_size"):
            v = getattr(self, name)
            if v < 1:
                raise ConfigError(f"{name}={v!r} must be a positive integer")
        if self.context_length is not None and self.context_length < 1:
            raise ConfigError(f"context_length={self.context_length!r} must be a positive integer (or None: the "
                              "model's max_position_embeddings)")
        for name in ("max_top_logprobs_num", "max_stop_strings"):
            v = getattr(self, name)
            if v < 0:
                raise ConfigError(f"{name}={v!r} must be an integer >= 0")
        if self.max_stop_str_len < 1:
            raise ConfigError(f"max_stop_str_len={self.max_stop_str_len!r} must be a positive integer")
        if self.constrained_json_max_whitespace_cnt is not None and self.constrained_json_max_whitespace_cnt < 1:
            raise ConfigError(f"constrained_json_max_whitespace_cnt={self.constrained_json_max_whitespace_cnt!r} must "
                              "be a positive integer (or None: any number)")
        if self.mha_prefill_tokens < 0:
            raise ConfigError(f"mha_prefill_tokens={self.mha_prefill_tokens!r} must be an integer >= 0 (0: off)")
        bad = [t for t in self.cuda_graph_prefill_tokens if t < 1]
        if bad:
            raise ConfigError(f"cuda_graph_prefill_tokens={self.cuda_graph_prefill_tokens!r} must be a tuple of "
                              f"positive integers (bad: {bad})")
        if self.speculative_adaptive and algo is None and self.model_path is not None:
            raise ConfigError("speculative_adaptive=True given but speculative_algorithm is None: the draft length "
                              "it adapts exists only with speculative_algorithm='EAGLE3'")
        if self.speculative_adaptive_probe_rounds < 0:
            raise ConfigError(f"speculative_adaptive_probe_rounds={self.speculative_adaptive_probe_rounds!r} must be "
                              "an integer >= 0 (0: the draft never rests)")
        bad = [c for c in self.speculative_num_steps_candidates if not 0 <= c <= MAX_NUM_STEPS]
        if bad:
            raise ConfigError(f"speculative_num_steps_candidates={self.speculative_num_steps_candidates!r}: each "
                              f"must lie in [0, {MAX_NUM_STEPS}] (bad: {bad})")
        acc = self.speculative_simulate_accept_length
        if acc is not None and not 1.0 <= acc <= MAX_NUM_STEPS + 1:
            raise ConfigError(f"speculative_simulate_accept_length={acc!r} must lie in [1, {MAX_NUM_STEPS + 1}] "
                              "(tokens a round emits: accepted drafts + the target's own)")
        if not 0.0 < self.mem_fraction_static < 1.0:
            raise ConfigError(f"mem_fraction_static={self.mem_fraction_static!r} must lie in (0, 1)")
        if self.max_total_tokens is not None and self.max_total_tokens < self.page_size:
            raise ConfigError(f"max_total_tokens={self.max_total_tokens!r} must be an integer >= page_size="
                              f"{self.page_size}")
        if self.attention_backend not in ("auto", "triton", "torch"):
            raise ConfigError(f"attention_backend={self.attention_backend!r} must be auto, triton or torch")
        if self.moe_runner_backend not in ("auto", "triton", "torch"):
            raise ConfigError(f"moe_runner_backend={self.moe_runner_backend!r} must be auto, triton or torch")
        if self.grammar_backend not in ("xgrammar", "none"):
            raise ConfigError(f"grammar_backend={self.grammar_backend!r} must be xgrammar or none")
        from sglang_eagle3.runtime.auto_parsers import AUTO
        from sglang_eagle3.runtime.reasoning import REASONING_PARSERS

        if self.reasoning_parser not in (None, AUTO, *REASONING_PARSERS):
            raise ConfigError(f"reasoning_parser={self.reasoning_parser!r} must be one of "
                              f"{', '.join(REASONING_PARSERS)} or {AUTO}")
        if self.enable_strict_thinking and self.reasoning_parser is None:
            raise ConfigError("enable_strict_thinking=True needs a reasoning_parser (--reasoning-parser): the "
                              "thinking's markers and excluded tokens are the reasoning format's")
        for name in ("worker_timeout", "worker_start_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be > 0 seconds")

    def _check_types(self) -> None:
        """Every field against its annotation's kind, before any range check compares it: a string or a bool
        where a number belongs (or a string where a bool does: "no" is truthy) fails here, naming the field."""
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            kind = _FIELD_KINDS[f.name]
            if v is None and kind.endswith("?"):
                continue
            kind = kind.rstrip("?")
            if kind == "str":
                ok, want = isinstance(v, str), "a string"
            elif kind == "bool":
                ok, want = isinstance(v, bool), "True or False"
            elif kind == "int":
                ok, want = isinstance(v, int) and not isinstance(v, bool), "an integer"
            elif kind == "float":
                ok, want = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
                            "a finite number")
            elif kind == "ints":
                ok, want = (isinstance(v, tuple) and all(isinstance(x, int) and not isinstance(x, bool) for x in v),
                            "a tuple (or list) of integers")
            else:  # "env": (name, value) string pairs
                ok, want = (isinstance(v, tuple) and all(isinstance(p, tuple) and len(p) == 2
                                                         and all(isinstance(x, str) for x in p) for p in v),
                            "a dict of environment variable names to string values")
            if not ok:
                raise ConfigError(f"{f.name}={v!r} must be {want}")

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    def num_steps(self) -> int:
        k, n = self.speculative_num_steps, self.speculative_num_draft_tokens
        if k is None and n is None:
            k = 3
        elif k is None:
            k = n - 1
        if n is not None and n != k + 1:
            raise ConfigError(f"speculative_num_draft_tokens={n} must equal speculative_num_steps+1={k + 1} "
                              "for a chain draft (topk=1)")
        if not 1 <= k <= MAX_NUM_STEPS:
            raise ConfigError(f"speculative_num_steps={k} must lie in [1, {MAX_NUM_STEPS}]")
        return k

    def step_candidates(self) -> tuple[int, ...]:
        """Every draft length the engine captures graphs for and may switch to: num_steps and the candidates;
        with speculative_adaptive and no candidates given, 0, 1, num_steps and num_steps + 2 (at most MAX_NUM_STEPS)."""
        k = self.num_steps()
        extra = self.speculative_num_steps_candidates
        if self.speculative_adaptive and not extra:
            extra = (0, 1, min(k + 2, MAX_NUM_STEPS))
        return tuple(sorted({k, *extra}))


MAX_NUM_STEPS = 16  # draft steps a round: the largest k a verify graph is captured for
# EngineArgs' fields by kind ("?": None allowed); _check_types reads it. Kept beside the class so a new field
# without a kind fails its first construction (KeyError) instead of going unchecked.
_FIELD_KINDS = {
    "model_path": "str?", "tokenizer_path": "str?", "speculative_algorithm": "str?",
    "speculative_draft_model_path": "str?", "speculative_num_steps": "int?", "speculative_eagle_topk": "int",
    "speculative_num_draft_tokens": "int?", "speculative_num_steps_candidates": "ints", "speculative_adaptive": "bool",
    "speculative_adaptive_probe_rounds": "int",
    "speculative_aux_layer_ids": "ints?", "speculative_simulate_accept_length": "float?", "device": "str",
    "dtype": "str", "tp_size": "int", "disable_cuda_graph": "bool", "disable_overlap_schedule": "bool",
    "cuda_graph_max_bs": "int", "cuda_graph_prefill_tokens": "ints", "mha_prefill_tokens": "int",
    "max_running_requests": "int", "max_top_logprobs_num": "int", "max_stop_strings": "int",
    "max_stop_str_len": "int", "context_length": "int?", "page_size": "int", "max_total_tokens": "int?",
    "mem_fraction_static": "float", "attention_backend": "str", "moe_runner_backend": "str", "random_seed": "int",
    "grammar_backend": "str", "constrained_json_disable_any_whitespace": "bool",
    "constrained_json_max_whitespace_cnt": "int?", "skip_tokenizer_init": "bool",
    "reasoning_parser": "str?", "enable_strict_thinking": "bool", "log_level": "str", "worker_env": "env",
    "use_worker_processes": "bool",
    "worker_timeout": "float", "worker_start_timeout": "float",
}


class Engine:
    def __init__(self, **kwargs):
        # SGLang snippets for Kimi pass it; no remote code is ever run here (the server's flag is the same no-op).
        if not isinstance(kwargs.pop("trust_remote_code", False), bool):
            raise ConfigError("trust_remote_code must be True or False")
        known = {f.name for f in dataclasses.fields(EngineArgs)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ConfigError(f"unknown Engine argument(s): {unknown}")
        for key in ("speculative_num_steps_candidates", "speculative_aux_layer_ids", "cuda_graph_prefill_tokens"):
            if isinstance(kwargs.get(key), list):
                kwargs[key] = tuple(kwargs[key])
        if isinstance(kwargs.get("worker_env"), dict):
            kwargs["worker_env"] = tuple(sorted(kwargs["worker_env"].items()))
        args = EngineArgs(**kwargs)
        _configure_logging(args.log_level)
        if args.model_path is None:
            target_dir = EMBEDDED_TARGET
            if not os.path.exists(os.path.join(target_dir, "config.json")):
                raise ConfigError("no model_path given and the embedded default model is not installed "
                                  f"(looked in {target_dir})")
            logger.warning("no model_path: serving the embedded default model pair (%s) with EAGLE-3", EMBEDDED_DIR)
            args = dataclasses.replace(args, model_path=target_dir,
                                       speculative_algorithm=args.speculative_algorithm or "EAGLE3",
                                       speculative_draft_model_path=args.speculative_draft_model_path
                                       or os.path.join(EMBEDDED_DIR, "draft"))
        if args.speculative and not args.speculative_draft_model_path:
            raise ConfigError("speculative_algorithm=EAGLE3 needs speculative_draft_model_path")
        self.args = args
        self._shut_down = False
        self._generate_lock = threading.Lock()
        self._lock_owner: int | None = None  # the thread holding _generate_lock (a stream may hold it between reads)
        self._git_commit = git_commit()
        self.num_steps = args.num_steps() if args.speculative else None
        self._setup(args)

    # -- construction -----------------------------------------------------------------------------------
    def _setup(self, args: EngineArgs) -> None:
        """Resolves everything that does not need weights here (configs, context, tokenizer), then builds the
        backend: the model worker in this process, or tp_size worker processes."""
        from sglang_eagle3.config import ModelConfig
        from sglang_eagle3.runtime.worker import resolve_device

        device = resolve_device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError(f"device={args.device!r} but CUDA is not available")
        self.device = device
        _select_backends(args, device)
        cfg = ModelConfig.from_path(args.model_path)
        self.model_config = cfg
        self.draft_config = None
        if args.speculative:
            from sglang_eagle3.models.loader import check_draft

            # The draft against the target from configs and shard headers, before the target's weights load.
            self.draft_config = check_draft(args.speculative_draft_model_path, cfg).config
        self.aux_layer_ids = ()
        self.context_length = min(args.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        if self.draft_config is not None:
            self.aux_layer_ids = resolve_aux_layer_ids(self.draft_config, cfg.num_hidden_layers,
                                                       args.speculative_aux_layer_ids)
            logger.info("EAGLE-3 draft wired to the residual streams entering target layers %s",
                        list(self.aux_layer_ids))
            self.context_length = min(self.context_length, self.draft_config.max_position_embeddings)
        self.tokenizer = None
        if not args.skip_tokenizer_init:
            from sglang_eagle3.tokenizer import load_tokenizer

            self.tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
            if self.tokenizer is None and args.tokenizer_path is not None:
                # Asked for by name: an engine without it would refuse every text request later, not now.
                raise ConfigError(f"tokenizer_path={args.tokenizer_path!r} holds no tokenizer.json or tiktoken.model")
        from sglang_eagle3.runtime.auto_parsers import AUTO, resolve

        if args.reasoning_parser == AUTO:
            try:
                found, _ = resolve(self.tokenizer, args.reasoning_parser, None, "the tokenizer's chat template",
                                   strict_thinking=args.enable_strict_thinking)
            except ValueError as e:
                raise ConfigError(str(e)) from None
            # (the workers and the grammars get the format found, never "auto")
            args = self.args = dataclasses.replace(args, reasoning_parser=found)
        self.generation_config = checked_generation_config(args.model_path)
        eos = self.eos_token_ids = engine_eos(cfg.eos_token_id, self.generation_config, self.tokenizer)
        k = self.num_steps or 0
        max_tokens = args.max_total_tokens or args.max_running_requests * (self.context_length + args.page_size)
        plan = {
            "context_length": self.context_length,
            "num_steps": self.num_steps,
            "verify_widths": tuple(c + 1 for c in args.step_candidates()) if k else (1,),
            "num_pages": max_tokens // args.page_size + 2,
            "eos": tuple(eos),
            "vocab_size": cfg.vocab_size,
        }
        # Requests with a grammar are compiled here when made (a grammar that does not compile is the client's
        # error), and the in-process worker's matchers come from the same cache.
        try:
            self.grammar = GrammarBackend.for_engine(args, self.tokenizer, cfg.vocab_size, plan["eos"])
            if args.enable_strict_thinking:
                self.grammar.thinking_ids()  # the markers are one token each: named before the weights load
        except ValueError as e:  # (GrammarError; SGLANG_MAX_THINK_TOKENS not an integer)
            raise ConfigError(str(e)) from None
        t0 = time.perf_counter()
        self.worker_env_reports: list[dict] = []
        if args.tp_size > 1 or args.use_worker_processes or args.worker_env:
            from sglang_eagle3.distributed.workers import TPWorkerGroup

            if args.tp_size == 1 and not args.use_worker_processes:
                # In this process the variables would come too late for what reads them at start-up (torch, NCCL,
                # CUDA) and would leak into the caller's environment; a worker gets them first thing.
                logger.info("worker_env %s at tp_size=1: the model runs in a spawned worker process, where they "
                            "apply before torch starts (set them in this process's environment instead to keep "
                            "it in-process)", sorted(k for k, _ in args.worker_env))

            self.backend = TPWorkerGroup(args, plan, timeout=args.worker_timeout,
                                         start_timeout=args.worker_start_timeout)
            self.worker_env_reports = self.backend.env_reports
            self.runner = None
        else:
            from sglang_eagle3.env_report import collect_env_report
            from sglang_eagle3.runtime.worker import ModelWorker

            self.backend = ModelWorker(args, plan, device,
                                       detokenize=self.tokenizer.decode if self.tokenizer is not None else None,
                                       grammar=self.grammar)
            self.runner = self.backend.runner
            # This process is the only worker: its environment is what the model ran with.
            self.worker_env_reports = [{**collect_env_report(), "rank": 0}]
        # The scheduler interface (add / abort / step / has_work) the server drives, local or remote.
        self.scheduler = self.backend
        # The pool as the workers sized it (on a GPU, cut to what fits: fit_kv_pages); page 0 is scratch and one
        # page is slack.
        self._pool_tokens = (self.backend.kv_pages - 2) * args.page_size
        self.load_seconds = time.perf_counter() - t0

    # -- requests ----------------------------------------------------------------------------------------
    def make_request(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                     logprob_start_len=None, top_logprobs_num=None, rid=None) -> Request:
        """Validates one request (raises RequestError / SamplingParamsError naming the field)."""
        self._check_running()
        if (prompt is None) == (input_ids is None):
            raise RequestError("exactly one of prompt (text) and input_ids must be given")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise RequestError(f"prompt must be a string, got {type(prompt).__name__}")
            if self.tokenizer is None:
                raise RequestError("this engine has no tokenizer: pass input_ids instead of text")
            input_ids = self.tokenizer.encode(prompt)
        if not isinstance(input_ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                      for t in input_ids):
            raise RequestError("input_ids must be a list of integers")
        if not input_ids:
            raise RequestError("the prompt is empty (0 tokens)")
        V = self.model_config.vocab_size
        bad = [t for t in input_ids if not 0 <= t < V]
        if bad:
            raise RequestError(f"token id(s) {bad[:5]} outside the vocabulary [0, {V})")
        n, lookahead = len(input_ids), self._lookahead()
        if n + lookahead > self.context_length:
            raise RequestError(f"prompt of {n} tokens is longer than the context allows "
                               f"({self.context_length} tokens, {lookahead} reserved for decoding)")
        if n + lookahead > self._pool_tokens:
            raise RequestError(f"prompt of {n} tokens does not fit the KV cache ({self._pool_tokens} tokens, "
                               f"{lookahead} reserved for decoding; raise max_total_tokens, or "
                               f"mem_fraction_static={self.args.mem_fraction_static} where memory cut it)")
        limit = self.max_new_tokens_limit(n)
        if isinstance(sampling_params, dict) and "max_new_tokens" in sampling_params \
                and sampling_params["max_new_tokens"] is None:
            # SGLang's null max_new_tokens: no limit but what the context and the KV cache leave the prompt.
            sampling_params = {**sampling_params, "max_new_tokens": limit}
        # After the prompt's checks: a prompt too long is the error to name (a limit that follows from it is not).
        params = self._vocab_checked(SamplingParams.from_dict(sampling_params))
        if params.max_new_tokens > limit:
            if isinstance(sampling_params, dict) and sampling_params.get("max_new_tokens") is not None:
                # Asked for explicitly: cutting it would return less than the client asked for without saying so
                # (SGLang refuses too). The default is cut to what fits.
                raise RequestError(
                    f"max_new_tokens={params.max_new_tokens} with a prompt of {n} tokens does not fit: at most {limit} "
                    f"new tokens for this prompt (context length {self.context_length} tokens less {lookahead - 1} "
                    f"reserved for speculation; KV cache {self._pool_tokens} less {lookahead})")
            # (min_new_tokens clipped with it, as SGLang does)
            params = dataclasses.replace(params, max_new_tokens=limit, min_new_tokens=min(params.min_new_tokens, limit))
        start = logprob_start_len
        if start is not None and (not isinstance(start, int) or isinstance(start, bool) or not -1 <= start <= n):
            raise RequestError(f"logprob_start_len={logprob_start_len!r} must be an integer in [-1, {n}] (-1: the "
                               f"output tokens only; {n}: the prompt's length)")
        if return_logprob is None:  # GenerateReqInput's default, read as False
            return_logprob = False
        if not isinstance(return_logprob, bool):
            raise RequestError(f"return_logprob={return_logprob!r} must be true or false")
        if rid is not None and not isinstance(rid, str):
            raise RequestError(f"rid={rid!r} must be a string")
        if top_logprobs_num is not None:
            most = min(V, self.args.max_top_logprobs_num)
            if (not isinstance(top_logprobs_num, int) or isinstance(top_logprobs_num, bool)  # True is not 1
                    or not 0 <= top_logprobs_num <= most):
                why = "the vocabulary's size" if most == V else f"max_top_logprobs_num={most}, this engine's limit"
                raise RequestError(f"top_logprobs_num={top_logprobs_num!r} must be an integer in [0, {most}] "
                                   f"({why})")
        return Request(rid=rid or uuid.uuid4().hex, input_ids=list(input_ids), params=params,
                       return_logprob=return_logprob,
                       logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
                       top_logprobs_num=top_logprobs_num or 0)

    def _check_running(self) -> None:
        if self._shut_down:
            raise RuntimeError("this Engine was shut down (Engine.shutdown or the end of its with block): "
                               "create a new one")

    def _lookahead(self) -> int:
        """KV slots a request needs past its tokens: room for the longest draft an adaptive policy may switch to
        (set_speculative_num_steps), + 1."""
        # The configured k, not the current one: after set_speculative_num_steps lowered it, a request admitted with
        # the smaller reserve would overrun the context once k is raised again.
        if self.num_steps is None:
            return 1
        return max(self.args.step_candidates()) + 1

    def max_new_tokens_limit(self, prompt_tokens: int) -> int:
        """The most new tokens a prompt of this length can be given: the context and the KV cache, each less the
        slots a speculative round writes past the last token. 0 when the prompt alone does not fit."""
        lookahead = self._lookahead()
        by_context = self.context_length - lookahead - prompt_tokens + 1
        by_pool = self._pool_tokens - lookahead - prompt_tokens
        return max(min(by_context, by_pool), 0)

    def _vocab_checked(self, params: SamplingParams) -> SamplingParams:
        """The sampling checks that need this engine's vocabulary, tokenizer and per-request limits."""
        V = self.model_config.vocab_size
        bad = [t for t in params.stop_token_ids if not 0 <= t < V]
        if bad:  # the first few, not the list: a client's list may hold 10^5 ids
            raise SamplingParamsError(f"stop_token_ids={bad[:5]!r}{' ...' if len(bad) > 5 else ''}: {len(bad)} of "
                                      f"{len(params.stop_token_ids)} ids outside the vocabulary [0, {V})")
        bad = [t for t in params.logit_bias or {} if not 0 <= t < V]
        if bad:
            raise SamplingParamsError(f"logit_bias keys {bad[:5]!r}{' ...' if len(bad) > 5 else ''} outside the "
                                      f"vocabulary [0, {V})")
        # Before any message that shows the list: 100000 stop strings would make a 1.4 MB error.
        limit = self.args.max_stop_strings
        if len(params.stop) > limit:
            raise SamplingParamsError(f"stop=[{len(params.stop)} strings] holds more than max_stop_strings={limit}, "
                                      "this engine's limit a request")
        limit = self.args.max_stop_str_len
        long = next((s for s in params.stop if len(s) > limit), None)
        if long is not None:
            raise SamplingParamsError(f"stop=[{long[:16]!r}..., ...] holds a string of {len(long)} characters, "
                                      f"more than max_stop_str_len={limit}, this engine's limit")
        if len(params.stop_regex) > self.args.max_stop_strings:
            raise SamplingParamsError(f"stop_regex=[{len(params.stop_regex)} patterns] holds more than "
                                      f"max_stop_strings={self.args.max_stop_strings}, this engine's limit a request")
        long = next((s for s in params.stop_regex if len(s) > self.args.max_stop_str_len), None)
        if long is not None:
            raise SamplingParamsError(f"stop_regex=[{long[:16]!r}..., ...] holds a pattern of {len(long)} characters, "
                                      f"more than max_stop_str_len={self.args.max_stop_str_len}, this engine's limit")
        if params.stop_regex and self.tokenizer is None:
            raise SamplingParamsError(f"stop_regex={params.stop_regex[:3]!r} needs a tokenizer, and this engine runs "
                                      "without one (skip_tokenizer_init)")
        params.check_stop_regex()
        if params.stop and self.tokenizer is None:
            raise SamplingParamsError(f"stop={params.stop[:3]!r}{' ...' if len(params.stop) > 3 else ''} needs a "
                                      "tokenizer, and this engine runs without one (skip_tokenizer_init): use "
                                      "stop_token_ids")
        if params.grammar is not None:
            self.grammar.compile(params.grammar)  # GrammarError (a SamplingParamsError) when it does not compile
        if params.thinking_budget is not None and not self.args.enable_strict_thinking:
            # (SGLang refuses its max_thinking_tokens so; a budget left unenforced would be an answer as if it held)
            raise SamplingParamsError(f"custom_params.thinking_budget={params.thinking_budget} needs strict thinking: "
                                      "start the engine with enable_strict_thinking=True (--enable-strict-thinking) "
                                      "and a reasoning_parser")
        if params.top_k >= V:  # keeps every token, as SGLang reads it (2**63 overflowed the sampled batch's int64)
            params = dataclasses.replace(params, top_k=-1)
        return params

    def result(self, r: Request) -> dict:
        """SGLang-shaped output dict for a (finished or running) request."""
        fr = r.finished_reason
        if fr is not None and fr.get("type") == "abort":  # SGLang's FINISH_ABORT.to_json has all four keys
            fr = {"status_code": None, "err_type": None, **fr}
        meta = {
            "id": r.rid,
            "prompt_tokens": len(r.input_ids),
            "completion_tokens": len(r.output_ids),
            # SGLang's prefix-cache hits; this engine keeps no prefix cache (a finished request's pages are freed).
            "cached_tokens": 0,
            "finish_reason": fr,
            "spec_verify_ct": r.verify_ct,
            "num_retractions": r.retractions,  # times the KV pool's pressure sent it back to the waiting queue
            "weight_version": "default",  # SGLang's --weight-version default; weights are never updated here
        }
        if r.verify_ct > 0:  # SGLang's (with speculation): tokens a verify round, the first token's included
            meta["spec_accept_length"] = len(r.output_ids) / r.verify_ct
        if r.proposed_draft_tokens > 0:
            # SGLang's strict acceptance (no bonus token). NOTE: SGLang counts k proposed drafts every verify round;
            # here a round the adaptive policy rested the draft in (k = 0) proposes none.
            meta["spec_accept_rate"] = r.accepted_draft_tokens / r.proposed_draft_tokens
            meta["spec_num_correct_drafts"] = r.accepted_draft_tokens
            meta["spec_num_proposed_drafts"] = r.proposed_draft_tokens
        if r.finished:  # as SGLang, on the finished result only
            if r.finished_time is None:
                r.finished_time = time.perf_counter()
            meta["e2e_latency"] = r.finished_time - r.arrival_time
        if r.return_logprob:
            meta["input_token_logprobs"] = r.input_token_logprobs
            meta["output_token_logprobs"] = r.output_token_logprobs
            if r.top_logprobs_num:
                meta["input_top_logprobs"] = r.input_top_logprobs
                meta["output_top_logprobs"] = r.output_top_logprobs
        out = {"output_ids": list(r.output_ids), "meta_info": meta}
        if self.tokenizer is not None:
            out["text"] = self.output_text(r)
        return out

    def output_text(self, r: Request) -> str:
        """The request's text as SGLang's detokenizer gives it: without the stop string or stop token that
        ended it (unless no_stop_trim), special tokens skipped unless skip_special_tokens is false."""
        p, fr = r.params, r.finished_reason or {}
        matched = fr.get("matched") if fr.get("type") == "stop" else None
        ids = r.output_ids
        if isinstance(matched, int) and not p.no_stop_trim and ids:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
        if isinstance(matched, str) and not p.no_stop_trim:
            # Cut at the match that ended the request: one inside the first min_new_tokens - 1 tokens' text
            # (where stop strings are not looked for) is text.
            after = 0
            if p.min_new_tokens > 1:
                after = settled_chars(self.tokenizer.decode(ids[:p.min_new_tokens - 1],
                                                            skip_special_tokens=p.skip_special_tokens))
            if matched in p.stop or matched not in p.stop_regex:
                hit = find_stop(text, [matched], after)
            else:
                # A stop_regex: searched where the scheduler searched it, the text of the last stop_window tokens
                # (a pattern of unbounded length could match further back in the whole text).
                tail = self.tokenizer.decode(ids[-p.stop_window:], skip_special_tokens=p.skip_special_tokens)
                base = len(text) - len(tail) if text.endswith(tail) else 0
                hit = find_stop_regex(text[base:], [p.stop_patterns[p.stop_regex.index(matched)]],
                                      max(after - base, 0))
                hit = None if hit is None else (hit[0], base + hit[1])
            if hit is not None:
                text = text[:hit[1]]
        return text

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, rid=None, stream=False, **sglang_kwargs):
        """Runs to completion. A list prompt (or list of id lists) is a batch: returns a list of dicts.

        As SGLang's Engine.generate: in a batch, sampling_params, return_logprob, logprob_start_len,
        top_logprobs_num and rid may each be one value for every prompt or a list of one per prompt.
        ``stream=True`` returns an iterator of SGLang's stream chunks instead: each the request's whole output so
        far (text, output_ids, meta_info; finish_reason set on its last), a batch's with ``index``. The engine
        steps as the iterator is read, and other generate calls wait until it is exhausted or closed.
        ``sampling_params["n"]`` > 1 (one n for every prompt) samples each prompt n times, answered as a list,
        prompt-major (sample j of prompt i at i * n + j) as SGLang answers; with a seed, sample j draws with seed + j
        and with a rid, it is rid_j (the server's /generate and OpenAI n do the same).
        SGLang's other arguments (image_data, lora_path, ...) are accepted at their neutral values only."""
        _check_sglang_only_arguments(sglang_kwargs)
        if not isinstance(stream, bool):
            raise RequestError(f"stream={stream!r} must be True or False")
        batch = isinstance(prompt, list) or (isinstance(input_ids, list) and input_ids
                                             and isinstance(input_ids[0], list))
        k, sampling_params = _parallel_sampling(sampling_params)
        one_prompt = not batch
        if k > 1 and not batch:  # n samples of one prompt: a batch of one, answered as a list (as SGLang)
            batch = True
            prompt, input_ids = ([prompt] if prompt is not None else None,
                                 [input_ids] if input_ids is not None else None)
            rid = None if rid is None else [rid]
            sampling_params, return_logprob, logprob_start_len, top_logprobs_num = (
                [v] if isinstance(v, list) else v
                for v in (sampling_params, return_logprob, logprob_start_len, top_logprobs_num))
        if not batch:
            if sampling_params is not None and not isinstance(sampling_params, dict):
                raise RequestError(f"sampling_params must be a dict for one prompt, got "
                                   f"{type(sampling_params).__name__}")
            reqs = [self.make_request(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                      top_logprobs_num, rid)]
        else:
            n = len(prompt) if prompt is not None else len(input_ids)
            if isinstance(rid, str):  # as SGLang's io_struct: one id for a batch names each prompt's
                rid = [f"{rid}_{i}" for i in range(n)]

            def per_item(name, v):
                if isinstance(v, list):
                    if len(v) != n:
                        raise RequestError(f"{len(v)} {name} for {n} prompts")
                    return v
                return [v] * n

            sps, lps, starts, tops, rids = (per_item(k, v) for k, v in (
                ("sampling_params", sampling_params), ("return_logprob", return_logprob),
                ("logprob_start_len", logprob_start_len), ("top_logprobs_num", top_logprobs_num), ("rid", rid)))
            if rid is not None and len(set(rids)) != n:
                raise RequestError(f"rid={rids!r} repeats an id within the batch")
            reqs = []
            for i in range(n):
                if sps[i] is not None and not isinstance(sps[i], dict):
                    raise RequestError(f"sampling_params[{i}] must be a dict, got {type(sps[i]).__name__}")
                # n > 1: sample j of prompt i at i * n + j, seeds and ids as the server's (sample 0 keeps them)
                for j in range(k):
                    sp = seeded(sps[i], j) if sps[i] is not None else None
                    r = rids[i] if k == 1 or rids[i] is None else f"{rids[i]}_{j}"
                    try:
                        reqs.append(self.make_request(prompt[i] if prompt is not None else None, sp,
                                                      input_ids[i] if input_ids is not None else None, lps[i],
                                                      starts[i], tops[i], r))
                    except (RequestError, SamplingParamsError) as e:
                        if one_prompt:
                            raise
                        raise type(e)(f"prompt {i} of the batch: {e}") from None
        # Validated all before queueing any (here and in the stream): nothing half-submitted.
        if stream:
            return self._stream(reqs, batch)
        done = {r.rid: r for r in self._run(reqs) if r.finished}
        outs = [self.result(done[r.rid]) for r in reqs]
        return outs if batch else outs[0]

    def _run(self, reqs: list[Request]):
        """Queues the requests and steps the scheduler until they finish; yields each request that changed (its
        finished self last). One generate at a time (a lock, held until this generator ends): two threads stepping
        one scheduler read each other's rounds (wrong tokens)."""
        if self._lock_owner == threading.get_ident():
            # The lock is not reentrant: this thread would wait for itself for ever.
            raise RuntimeError("a generate(stream=True) iterator of this thread is still open: read it to its end "
                               "or close() it before another generate")
        with self._generate_lock:
            self._lock_owner = threading.get_ident()
            left = {r.rid for r in reqs}
            try:
                for r in reqs:
                    self.scheduler.add(r)
                while left:
                    for r in self.scheduler.step():
                        if r.rid in left:  # (requests queued by others finish here too)
                            if r.finished:
                                r.finished_time = time.perf_counter()
                                left.discard(r.rid)
                            yield r
            except BaseException:  # GeneratorExit too: a stream closed before its end
                # An interrupted generate leaves nothing queued behind, also when a second Ctrl-C comes meanwhile:
                # a request it skipped would hold its pages until decoded to its end for no one.
                with defer_interrupt():
                    for r in reqs:
                        if r.rid in left:
                            self.scheduler.abort(r.rid)
                raise
            finally:
                self._lock_owner = None

    def _stream(self, reqs: list[Request], batch: bool):
        """generate(stream=True): SGLang's chunks (its default, non-incremental: the whole output so far)."""
        index = {r.rid: i for i, r in enumerate(reqs)}
        sent: dict[str, int] = {}
        for r in self._run(reqs):
            if not r.finished and sent.get(r.rid) == len(r.output_ids):
                continue  # a step that added no token to it (a prefill chunk): nothing new to show
            sent[r.rid] = len(r.output_ids)
            out = self.result(r)
            # A snapshot: the request's lists grow in later steps, a chunk the caller keeps must not.
            out["meta_info"] = {k: list(v) if isinstance(v, list) else v for k, v in out["meta_info"].items()}
            if batch:
                out["index"] = index[r.rid]
            yield out

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, top_logprobs_num=None, rid=None, stream=False, **sglang_kwargs):
        """SGLang's Engine.async_generate: generate's arguments and result, awaited; with ``stream=True`` it returns
        an async iterator of generate's stream chunks. The engine runs in a worker thread, so the event loop stays
        free; concurrent calls run one after another (one generate at a time), not batched together: pass a list
        of prompts to batch them."""
        args = (prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num, rid)
        if not stream:
            return await asyncio.to_thread(self.generate, *args, **sglang_kwargs)
        chunks = self.generate(*args, stream=True, **sglang_kwargs)  # a bad request raises here, as SGLang's does
        return _async_chunks(chunks)

    def flush_cache(self) -> FlushCacheReqOutput:
        """SGLang's Engine.flush_cache. This engine keeps no prefix cache (a finished request's KV pages are freed at
        once), so there is nothing to flush: it succeeds."""
        self._check_running()
        return FlushCacheReqOutput(success=True, message="no prefix cache: nothing to flush")

    def set_speculative_num_steps(self, k: int) -> None:
        """Switches the draft length between rounds (an adaptive policy's knob; 0: the target verifies the last token
        alone and the draft's extend follows it, runtime/adaptive.py). Verify/draft-extend graphs exist for num_steps
        and every speculative_num_steps_candidates; any other k runs eager (counted)."""
        self._check_running()
        if self.num_steps is None:
            raise ConfigError("set_speculative_num_steps needs speculative decoding on")
        if self.args.speculative_adaptive:
            raise ConfigError("set_speculative_num_steps: the draft length is chosen by the adaptive policy "
                              "(speculative_adaptive=True); start the engine without it to set k by hand")
        allowed = set(self.args.step_candidates())
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= max(allowed):
            raise ConfigError(f"speculative_num_steps={k!r} must lie in [0, {max(allowed)}] "
                              f"(graphs captured for {sorted(allowed)})")
        self.backend.set_num_steps(k)
        self.num_steps = k

    # -- introspection -----------------------------------------------------------------------------------
    def get_server_info(self) -> dict:
        self._check_running()
        info = {
            "args": dataclasses.asdict(self.args),
            "model": {"path": self.args.model_path, "layers": self.model_config.num_hidden_layers,
                      "hidden_size": self.model_config.hidden_size, "experts": self.model_config.n_routed_experts,
                      "vocab_size": self.model_config.vocab_size, "context_length": self.context_length,
                      # what ends a request (engine_eos) and generation_config.json's sampling defaults, which
                      # the server's chat endpoint applies (--sampling-defaults model, as SGLang)
                      "eos_token_ids": list(self.eos_token_ids),
                      "generation_config": self.generation_config.path,
                      "sampling_defaults": self.generation_config.sampling_defaults()},
            "draft": None if self.draft_config is None else {
                "path": self.args.speculative_draft_model_path, "aux_layer_ids": list(self.aux_layer_ids),
                "draft_vocab_size": self.draft_config.draft_vocab_size, "num_steps": self.num_steps},
            "device": str(self.device),
            "tp_size": self.args.tp_size,
            # SGLang's name: the KV pool's tokens as the workers sized it (cut to memory on a GPU: fit_kv_pages).
            "max_total_num_tokens": self._pool_tokens,
            "worker_env": self.worker_env_reports,
            "kernels": _kernel_report(self.device),
            "git_commit": self._git_commit,  # the checkout this engine runs from (bench records it)
        }
        info.update(self.backend.info())
        # SGLang's shape too, for code written against it: the server arguments at the top level (the keys above
        # win where both name one: the resolved device, the current k), the scheduler's state as internal_states
        # (one entry: no data parallelism; avg_spec_accept_length only with speculation, as SGLang's), version.
        state = {} if self.num_steps is None else {"avg_spec_accept_length": info.get("avg_spec_accept_length", 0.0)}
        from sglang_eagle3 import __version__

        return {**info["args"], **info, "internal_states": [state], "version": __version__}

    def shutdown(self) -> None:
        """Frees the models, KV cache and graphs (or stops the TP workers); later requests raise."""
        if self._shut_down:
            return
        self._shut_down = True
        self.backend.close()
        self.runner = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def _configure_logging(level: str) -> None:
    """Sets the package's log level; adds a stderr handler only if the application configured none."""
    lvl = getattr(logging, str(level).upper(), None)
    if not isinstance(lvl, int):
        raise ConfigError(f"log_level={level!r} is not a logging level (debug, info, warning, error)")
    pkg = logging.getLogger("sglang_eagle3")
    pkg.setLevel(lvl)
    if not logging.getLogger().handlers and not pkg.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        pkg.addHandler(handler)


def _kernel_report(device: torch.device) -> dict:
    from sglang_eagle3 import kernels

    return kernels.kernel_report(device)


def _select_backends(args: EngineArgs, device: torch.device) -> None:
    """Checks the kernel path choice (Triton on CUDA by default, torch references elsewhere)."""
    for name in ("attention_backend", "moe_runner_backend"):
        v = getattr(args, name)
        if v == "triton" and device.type != "cuda" and not env.TRITON_INTERPRET.flag():
            raise ConfigError(f"{name}='triton' needs a CUDA device (or TRITON_INTERPRET=1); got device={device}")


__all__ = ["Engine", "EngineArgs", "FlushCacheReqOutput", "RequestError", "SamplingParamsError"]
