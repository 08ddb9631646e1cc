"""``python -m sglang_eagle3.launch_server``: one command that serves, with SGLang's flag names.

    python -m sglang_eagle3.launch_server                      # the embedded default pair, EAGLE-3 on
    python -m sglang_eagle3.launch_server --model-path T --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path D --speculative-num-steps 3 --port 30000

``--backend`` picks who serves: ``native`` (this package's engine and server), ``sglang`` (SGLang itself with
the sglang_eagle3 overlay, through ``sglang_eagle3.integration.launch``), or ``auto``: sglang when it is
importable, CUDA is present and a model path is given, else native. docs/SERVER.md lists every flag.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import re
import signal
import sys

from sglang_eagle3.argtypes import human_int, name_the_flag

logger = logging.getLogger("sglang_eagle3.launch_server")

LOG_FORMAT = "[%(asctime)s] %(levelname)s %(name)s: %(message)s"
EMBEDDED_SERVED_NAME = "sglang-eagle3-embedded"
# uvicorn's graceful-shutdown timeout is --shutdown-grace-s plus this: the "shutting down" errors that end the
# requests still in flight after the grace must reach their clients before uvicorn cuts the connections.
_UVICORN_EXTRA_GRACE_S = 3.0
_EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# flag -> EngineArgs field, for flags whose value goes to the engine unchanged (None = not given).
_ENGINE_FLAGS = (
    "model_path", "tokenizer_path", "speculative_algorithm", "speculative_draft_model_path",
    "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens", "tp_size", "device",
    "dtype", "cuda_graph_max_bs", "max_running_requests", "context_length", "attention_backend",
    "moe_runner_backend", "random_seed", "page_size", "max_total_tokens", "mem_fraction_static", "log_level",
    "worker_timeout", "worker_start_timeout",
    "cuda_graph_prefill_tokens", "mha_prefill_tokens", "max_top_logprobs_num", "max_stop_strings",
    "max_stop_str_len", "grammar_backend", "reasoning_parser", "speculative_adaptive_probe_rounds",
    "constrained_json_max_whitespace_cnt",
)
# store_true flag -> the EngineArgs bool it sets (given: True; not given: the engine's default).
_ENGINE_SWITCHES = ("disable_cuda_graph", "disable_overlap_schedule", "skip_tokenizer_init", "use_worker_processes",
                    "constrained_json_disable_any_whitespace", "speculative_adaptive", "enable_strict_thinking")


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _env_pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


# SGLang's other spellings of values the native engine takes (its --dtype choices include half and float).
_DTYPE_SYNONYMS = {"half": "float16", "float": "float32"}


def _synonym(names: dict[str, str]):
    """A string value, SGLang's other spelling of it (``names``) read as ours."""
    return lambda text: names.get(text, text)


def _kv_cache_dtype(text: str) -> str:
    if text not in ("auto", "bf16", "bfloat16"):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the native server keeps the KV cache in the model's --dtype (auto; bf16 / bfloat16 with "
            "--dtype bfloat16); SGLang's FP8 / FP4 KV caches need --backend sglang")
    return text


# SGLang 0.5.23 flags the native server does not implement, with why (or what to use instead): refused naming each,
# rather than listed among "unrecognised arguments" with their values. Any other unknown flag is refused too.
SGLANG_FLAGS_REFUSED = {
    "--chunked-prefill-size": "a prompt longer than the largest --cuda-graph-prefill-tokens bucket is prefilled in "
                              "chunks of that bucket (set the chunk there)",
    "--enable-torch-compile": "nothing is torch.compile'd here: decode, verify and prefill replay CUDA graphs of "
                              "Triton kernels (drop it)",
    "--torch-compile-max-bs": "nothing is torch.compile'd here (drop it)",
    "--watchdog-timeout": "the native server's counterpart is --worker-timeout S (seconds a worker may take to "
                          "answer; default 300)",
    "--quantization": "the checkpoint's quantization_config decides (INT4 W4A16 and FP8 checkpoints are read as "
                      "such; drop it)",
    "--dp-size": "only tensor parallelism (--tp-size) is implemented", "--data-parallel-size": "only tensor "
    "parallelism (--tp-size) is implemented", "--ep-size": "only tensor parallelism (--tp-size) is implemented",
    "--expert-parallel-size": "only tensor parallelism (--tp-size) is implemented", "--ep": "only tensor "
    "parallelism (--tp-size) is implemented", "--enable-dp-attention": "only tensor parallelism (--tp-size) is "
    "implemented", "--nnodes": "one host only (--tp-size processes on it)",
}


def _option_index(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def _resolve(name: str, options: dict[str, argparse.Action]) -> str | None:
    """The flag ``name`` stands for as argparse reads it: itself, or the one flag it abbreviates (None: unknown or
    ambiguous)."""
    if name in options:
        return name
    matches = [o for o in options if o.startswith(name) and o.startswith("--")]
    return matches[0] if len(name) > 2 and len(matches) == 1 else None


def _is_flag(token: str) -> bool:
    return token.startswith("-") and token != "-" and not re.fullmatch(r"-\d[\d.]*", token)


def _cli_problems(argv: list[str], parser: argparse.ArgumentParser, from_config: int = 0) -> list[str]:
    """What the native server refuses in ``argv``, one sentence each: a switch given a value (``--enable-metrics
    true``, ``--disable-cuda-graph=false``: SGLang's switches take none either), and flags it does not have, with
    why where SGLANG_FLAGS_REFUSED knows. Ambiguous abbreviations are left to argparse, which names the candidates.
    ``from_config``: how many of ``argv``'s first tokens came from the --config file (their messages say so)."""
    options = _option_index(parser)
    problems, i = [], 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if token == "--":
            break
        if not _is_flag(token):
            continue  # a value of an unknown flag before it (refused there)
        name, eq, _ = token.partition("=")
        flag = _resolve(name, options)
        where = " (in the --config file)" if i <= from_config else ""
        if flag is None:
            if not name.startswith("--") or any(o.startswith(name) for o in options):
                continue  # -x, or an ambiguous abbreviation: argparse names the candidates
            why = SGLANG_FLAGS_REFUSED.get(name, "the native backend does not implement it")
            problems.append(f"{name}{where}: {why}")
            while not eq and i < len(argv) and not _is_flag(argv[i]) and argv[i] != "--":
                i += 1  # its values
            continue
        action = options[flag]
        if action.nargs == 0:  # a switch
            value = token.partition("=")[2] if eq else (argv[i] if i < len(argv) and not _is_flag(argv[i])
                                                       and argv[i] != "--" else None)
            if eq or value is not None:
                problems.append(f"{name}{where} is a switch and takes no value (got {value!r}): give it alone to "
                                "turn it on, leave it out for off")
                i += 0 if eq else 1
        elif not eq and action.nargs is None:
            i += 1  # its value (argparse reports a missing one)
    return problems


def _read_config(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], str | None]:
    """(the flags a --config FILE.yaml holds, FILE), as SGLang's --config reads it: a mapping of flag names (dashes
    or underscores) to values; a switch true adds it, false leaves it out; a list is a comma list
    (speculative-aux-layer-ids: [2, 3, 5]) or, for --worker-env, one pair each (a mapping of names to values
    too). Put before the command line's flags, so these win. Raises ValueError naming the problem."""
    options = _option_index(parser)
    found, i = [], 0
    while i < len(argv) and argv[i] != "--":
        name, eq, value = argv[i].partition("=")
        if _is_flag(name) and _resolve(name, options) == "--config":
            if not eq:
                if i + 1 >= len(argv) or _is_flag(argv[i + 1]):
                    raise ValueError(f"{name} needs a YAML file after it")
                value = argv[i + 1]
                i += 1
            found.append(value)
        i += 1
    if not found:
        return [], None
    if len(found) > 1:
        raise ValueError(f"--config given {len(found)} times ({', '.join(found)}): give one file")
    path = found[0]
    if not path.lower().endswith((".yaml", ".yml")):
        raise ValueError(f"--config {path}: must be a YAML file (.yaml or .yml), as SGLang's --config")
    try:
        import yaml
    except ImportError:
        raise ValueError(f"--config {path}: reading it needs PyYAML (pip install pyyaml)") from None
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ValueError(f"--config {path}: must hold a mapping of flag names to values, not a "
                         f"{type(data).__name__}")
    out = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        action = options.get(flag)
        if value is None:
            raise ValueError(f"--config {path}: {key!r} has no value (give one, or leave the key out)")
        if flag == "--config":
            raise ValueError(f"--config {path}: a config file cannot name another (config: {value!r})")
        if action is not None and action.nargs == 0:
            if not isinstance(value, bool):
                raise ValueError(f"--config {path}: {key!r} is a switch: true or false, not {value!r}")
            out += [flag] if value else []
        elif isinstance(value, bool) and action is None:
            # Not ours: read as SGLang's switches are (false: left at their default, off; true: the flag, refused
            # below with why).
            out += [flag] if value else []
        elif isinstance(value, dict) and action is not None and action.dest == "worker_env":
            for k, v in value.items():
                out += [flag, f"{k}={v}"]
        elif isinstance(value, list) and action is not None and action.dest == "worker_env":
            for pair in value:
                out += [flag, str(pair)]
        elif isinstance(value, list):
            out += [flag, ",".join(str(v) for v in value)]
        elif isinstance(value, bool):
            out += [flag, str(value).lower()]  # a flag of ours with a value: its own type judges it
        elif isinstance(value, dict):
            out += [flag, json.dumps(value)]  # as SGLang's --config; no flag of ours takes one
        else:
            out += [flag, str(value)]
    return out, path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_eagle3.launch_server", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("model (SGLang names)")
    g.add_argument("--model-path", "--model", dest="model_path",
                   help="target checkpoint directory (default: the embedded model pair)")
    g.add_argument("--tokenizer-path", help="tokenizer directory (default: --model-path)")
    g.add_argument("--served-model-name", help="name in /v1/models and OpenAI 'model' (default: --model-path; "
                   "'default' is always accepted too)")
    g.add_argument("--chat-template", help="a Jinja chat template file overriding the model directory's")
    g.add_argument("--skip-tokenizer-init", action="store_true", help="no tokenizer: /generate with input_ids only")
    g.add_argument("--context-length", type=human_int(1), help="maximum prompt + output tokens, e.g. 32768 or 32k "
                   "(SGLang's suffixes: k, M, Ki, Mi; default: the model's)")
    g.add_argument("--dtype", type=_synonym(_DTYPE_SYNONYMS),
                   help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | float16 (SGLang's half, "
                   "float too)")
    g.add_argument("--kv-cache-dtype", type=_kv_cache_dtype, default="auto",
                   help="only auto: the KV cache is kept in --dtype (bf16 / bfloat16 accepted with --dtype "
                   "bfloat16); SGLang's FP8 / FP4 caches need --backend sglang")
    g.add_argument("--trust-remote-code", action="store_true", help="accepted for SGLang compatibility; no effect "
                   "(no remote code is ever run)")
    g = p.add_argument_group("speculative decoding (SGLang names)")
    g.add_argument("--speculative-algorithm", help="EAGLE3 (or EAGLE); default: off, or EAGLE3 for the embedded model")
    g.add_argument("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
                   help="EAGLE-3 draft checkpoint directory")
    g.add_argument("--speculative-num-steps", type=int, help="draft steps per round (default 3)")
    g.add_argument("--speculative-eagle-topk", type=int, help="draft branching; only 1 (chain) is supported")
    g.add_argument("--speculative-num-draft-tokens", type=int, help="num-steps + 1 for a chain draft")
    g.add_argument("--speculative-aux-layer-ids", type=_int_list,
                   help="(sglang_eagle3) override the target layers whose inputs feed the draft, e.g. 2,3,5")
    g.add_argument("--speculative-num-steps-candidates", type=_int_list,
                   help="(sglang_eagle3) extra draft lengths to capture verify graphs for (0: rounds that verify "
                   "the last token alone while the draft follows)")
    g.add_argument("--speculative-adaptive", action="store_true",
                   help="the draft length follows the acceptance among --speculative-num-steps and the candidates "
                   "(default candidates 0, 1, k, k+2), by round costs timed at start-up")
    g.add_argument("--speculative-adaptive-probe-rounds", type=int,
                   help="(sglang_eagle3) while the adaptive draft length is 0 the draft rests and catches up every "
                   "this many rounds (default 16; 0: it extends over every token)")
    g = p.add_argument_group("runtime (SGLang names)")
    g.add_argument("--device", help="auto | cpu | cuda | cuda:N (default auto)")
    g.add_argument("--tp-size", "--tp", "--tensor-parallel-size", dest="tp_size", type=int,
                   help="tensor-parallel processes, one a GPU (default 1)")
    g.add_argument("--disable-cuda-graph", action="store_true", help="run verify/draft forwards eagerly")
    g.add_argument("--disable-overlap-schedule", action="store_true",
                   help="read each decode/speculative round before the next is queued (default: the next round, "
                   "greedy, sampled or with logprobs, is queued on the GPU first)")
    g.add_argument("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", dest="cuda_graph_max_bs", type=int,
                   help="largest batch captured as a CUDA graph (default 16; SGLang 0.5.23's name for it is "
                   "--cuda-graph-max-bs-decode)")
    g.add_argument("--cuda-graph-prefill-tokens", type=_int_list, metavar="N,N,...",
                   help="(sglang_eagle3) prompt lengths captured as prefill graphs, e.g. 32,64,128,256,512,1024 "
                   "(the default); '' turns them off")
    g.add_argument("--mha-prefill-tokens", type=int, metavar="N",
                   help="(sglang_eagle3) prefill forwards of >= N new tokens a request run MLA non-absorbed (keys "
                   "and values decompressed once; a scratch of heads x (nope + rope + v) elements a KV slot: ~7%% of "
                   "a Kimi-K2.5 TP=8 rank's KV cache); 0: always absorbed (default 64)")
    g.add_argument("--max-running-requests", type=int, help="requests in the running batch (default 32)")
    g.add_argument("--max-total-tokens", type=human_int(1), help="KV-cache size in tokens, e.g. 2M (default: "
                   "max-running-requests x "
                   "context-length, cut to what fits under --mem-fraction-static)")
    g.add_argument("--mem-fraction-static", type=float, help="fraction of each GPU's memory for weights + KV cache; "
                   "the rest is for activations and CUDA graphs (default 0.85)")
    g.add_argument("--page-size", type=int,
                   help="tokens per KV page (default 64: a multiple of the MLA kernel's key tile)")
    g.add_argument("--attention-backend", type=_synonym({"torch_native": "torch"}),
                   help="auto (Triton on CUDA) | triton | torch (SGLang's torch_native too)")
    g.add_argument("--moe-runner-backend", help="auto (Triton on CUDA) | triton | torch")
    g.add_argument("--random-seed", type=int,
                   help="seeds of requests sampled without a seed, drawn in arrival order (default 0)")
    g.add_argument("--grammar-backend", choices=("xgrammar", "none"),
                   help="structured output (json_schema / regex / ebnf, response_format): xgrammar (default) or none")
    g.add_argument("--constrained-json-disable-any-whitespace", action="store_true",
                   help="JSON schemas with fixed separators instead of any whitespace between tokens")
    g.add_argument("--constrained-json-max-whitespace-cnt", type=int, metavar="N",
                   help="at most N whitespace characters in a row between a JSON schema's tokens (default: any "
                   "number, where a weak model may pad with spaces until max_tokens)")
    # (no argparse choices: with --backend sglang any of SGLang's parsers goes through; the native server's
    # ServerConfig names its own)
    g.add_argument("--tool-call-parser", metavar="NAME",
                   help="how chat reads the model's tool calls for tool_choice auto (native: kimi_k2, Kimi-K2 / K2.5; "
                   "auto: read from the chat template and tokenizer)")
    g.add_argument("--reasoning-parser", metavar="NAME",
                   help="a reasoning model's thinking markers: chat splits its thinking into reasoning_content, and "
                   "grammars (response_format, json_schema, regex, ebnf) constrain the answer after it (native: "
                   "kimi_k2, deepseek-r1, deepseek-v3, qwen3, qwen3-thinking, kimi; auto: read from the chat "
                   "template and tokenizer)")
    g.add_argument("--enable-strict-thinking", action="store_true",
                   help="hold every request's thinking to the --reasoning-parser format's rules (needs it): its "
                   "excluded tokens (tool-call markers, the turn's end) are refused inside the thinking, and a "
                   "thinking budget (/generate's max_thinking_tokens, sampling custom_params.thinking_budget, "
                   "Anthropic's thinking.budget_tokens; SGLANG_MAX_THINK_TOKENS for the rest) forces its end marker")
    g.add_argument("--worker-env", action="append", type=_env_pair, metavar="KEY=VALUE",
                   help="(sglang_eagle3) extra environment for the worker processes (at --tp-size 1 the model "
                   "then runs in one spawned worker, where they apply before torch starts); repeatable")
    g.add_argument("--use-worker-processes", action="store_true",
                   help="(sglang_eagle3) run even --tp-size 1 in a spawned worker (the TP code path)")
    g.add_argument("--worker-timeout", type=float,
                   help="(sglang_eagle3) seconds a worker may take to answer (default 300)")
    g.add_argument("--worker-start-timeout", type=float,
                   help="(sglang_eagle3) seconds the workers' start (checkpoint load, graph capture) may go "
                   "without progress from any rank (default 600)")
    g = p.add_argument_group("server (SGLang names)")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    g.add_argument("--port", type=int, default=30000, help="port (default 30000, as SGLang)")
    g.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (not on /health, /health_generate and "
                   "/metrics, nor for OPTIONS)")
    g.add_argument("--max-queued-requests", type=int, default=4096,
                   help="requests allowed to wait beyond --max-running-requests; one more gets HTTP 503 "
                   "(default 4096; -1: unbounded)")
    g.add_argument("--sampling-defaults", choices=("model", "openai"),
                   help="where a chat request's unset temperature, top_p, top_k, min_p and repetition_penalty come "
                   "from: 'model', the checkpoint's generation_config.json where it writes them, else OpenAI's "
                   "defaults; 'openai', OpenAI's always (default model, as SGLang)")
    g.add_argument("--max-request-bytes", type=int, metavar="N",
                   help="(sglang_eagle3) largest request body in bytes; a larger one gets HTTP 413 before it is "
                   "read (default 16777216 = 16 MiB)")
    g.add_argument("--max-top-logprobs-num", type=int, metavar="N",
                   help="(sglang_eagle3) the largest top_logprobs_num a request may ask for; more gets HTTP 400 "
                   "(default 20, OpenAI's top_logprobs cap; each position returned carries N entries)")
    g.add_argument("--max-stop-strings", type=int, metavar="N",
                   help="(sglang_eagle3) the most stop strings a request; more gets HTTP 400 (default 128: every "
                   "emitted token is checked against each, on the thread that steps the whole batch)")
    g.add_argument("--max-stop-str-len", type=int, metavar="N",
                   help="(sglang_eagle3) the longest stop string in characters; longer gets HTTP 400 (default 256)")
    g.add_argument("--shutdown-grace-s", type=float, metavar="S",
                   help="(sglang_eagle3) on SIGTERM / Ctrl+C, seconds the requests in flight get to finish before "
                   "they end with a 'server is shutting down' error; new requests are refused at once (default 5)")
    g.add_argument("--log-level", default="info", help="debug | info | warning | error (default info)")
    g.add_argument("--log-requests", action="store_true", help="log every HTTP request (uvicorn's access log)")
    g.add_argument("--enable-metrics", action="store_true", help="accepted for SGLang compatibility: /metrics is "
                   "always on")
    g.add_argument("--disable-radix-cache", action="store_true", help="accepted for SGLang compatibility: there is "
                   "no prefix cache to disable (a finished request's KV pages are freed at once)")
    g.add_argument("--config", metavar="FILE.yaml",
                   help="flags from a YAML mapping, as SGLang's --config: keys are flag names (model-path or "
                   "model_path), a switch true or false, a list for the comma lists and --worker-env; flags on the "
                   "command line win over the file's")
    p.add_argument("--backend", choices=("auto", "native", "sglang"), default="auto",
                   help="native: this package's server; sglang: SGLang with the overlay, every other flag then "
                   "SGLang's, as written (--backend sglang --help lists them and what the hand-off adds); auto: "
                   "sglang when importable with CUDA and a --model-path, else native (default auto)")
    return p


def _setup_logging(level: str) -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        # (argparse's form and exit code, as for every other bad flag: logging is not set up yet)
        print(f"python -m sglang_eagle3.launch_server: error: --log-level {level!r} is not one of debug, info, "
              "warning, error, critical", file=sys.stderr)
        raise SystemExit(2)
    logging.basicConfig(level=numeric, format=LOG_FORMAT, stream=sys.stderr, force=True)
    # The package's own level too: an Engine built earlier in this process (Engine(log_level=...)) set it, and its
    # level, not the root's, decides what the package's loggers pass on.
    logging.getLogger("sglang_eagle3").setLevel(numeric)


def _backend_parser() -> argparse.ArgumentParser:
    """The flags main() reads before it knows who serves. With --backend sglang nothing else is parsed here: every
    other flag goes to SGLang's launcher as written, so its types ("128k" for --context-length), its choices
    (--grammar-backend llguidance) and its --help apply, not the native server's."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--backend", choices=("auto", "native", "sglang"), default="auto")
    p.add_argument("--worker-env", action="append", type=_env_pair)
    p.add_argument("--log-level", default="info")
    p.add_argument("--model-path", "--model", dest="model_path")
    return p


# Ours alone (SGLang's launcher has neither): taken out of what is handed on, as argparse matched them, which
# includes abbreviations (--back sglang).
_OWN_FLAGS = ("--backend", "--worker-env")


def _strip_own_flags(argv: list[str]) -> list[str]:
    """``argv`` without --backend and --worker-env and their values, whether written whole, with ``=`` or
    abbreviated as _backend_parser's argparse reads them (a prefix of at least three characters, unique among its
    flags: each of its flags starts with its own letter)."""
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--":  # argparse reads nothing after it as a flag
            out.extend(argv[i:])
            break
        name = a.split("=", 1)[0]
        if len(name) >= 3 and any(flag.startswith(name) for flag in _OWN_FLAGS):
            skip = "=" not in a
            continue
        out.append(a)
    return out


# Flags of the native server that SGLang 0.5.23's launcher does not have, with what to use there instead (None:
# nothing). Handed on, SGLang would stop at them with "unrecognized arguments" or, through argparse's prefix
# matching, "ambiguous option" (--cuda-graph-max-bs); --backend sglang refuses them first, naming each.
# tests/integration/test_launch_sglang.py keeps this list equal to our flags minus SGLang's.
NATIVE_ONLY_FLAGS = {
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode (the launcher sets it from --max-running-requests)",
    "--cuda-graph-prefill-tokens": None, "--max-request-bytes": None, "--mha-prefill-tokens": None,
    "--max-stop-str-len": None, "--max-stop-strings": None, "--max-top-logprobs-num": None,
    "--shutdown-grace-s": None, "--speculative-aux-layer-ids": None, "--speculative-num-steps-candidates": None,
    "--speculative-adaptive-probe-rounds": None, "--use-worker-processes": None, "--worker-timeout": None,
    "--worker-start-timeout": None,
}
# Ours and SGLang's for the same thing under another name.
_SGLANG_NAMES = {"--tp": "--tp-size"}


def _native_only_given(argv: list[str]) -> dict[str, str]:
    """Native-only flags in ``argv`` as written -> the flag each is: whole, with ``=``, or abbreviated as our parser
    reads it (a prefix of one of its flags alone). Handed on abbreviated, SGLang's parser stopped at them as
    "unrecognized", or, a prefix of a flag of its own too, took them for that one (--use: its --use-ray)."""
    ours = sorted({o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")})
    given = {}
    for a in argv:
        if a == "--":  # argparse reads nothing after it as a flag
            break
        name = a.split("=", 1)[0]
        if not name.startswith("--") or len(name) < 3:
            continue
        if name in NATIVE_ONLY_FLAGS:
            given[name] = name
            continue
        matches = [o for o in ours if o.startswith(name)]
        if len(matches) == 1 and matches[0] in NATIVE_ONLY_FLAGS:
            given[name] = matches[0]
    return given


def sglang_argv(argv: list[str]) -> list[str]:
    """``argv`` for SGLang's launcher: our aliases renamed; raises ValueError naming native-only flags."""
    given = _native_only_given(argv)
    if given:
        names = sorted(given)
        shown = ", ".join(n if given[n] == n else f"{n} (our {given[n]}, abbreviated)" for n in names)
        hints = "; ".join(f"{flag}: use {NATIVE_ONLY_FLAGS[flag]}" for flag in sorted(set(given.values()))
                          if NATIVE_ONLY_FLAGS[flag])
        raise ValueError(f"{shown} {'belongs' if len(names) == 1 else 'belong'} to the native server; SGLang's "
                         f"launcher has no such flag (drop {'it' if len(names) == 1 else 'them'} with --backend "
                         f"sglang{'; ' + hints if hints else ''})")
    out, options = [], _option_index(build_parser())
    for i, a in enumerate(argv):
        if a == "--":
            out.extend(argv[i:])
            break
        name, eq, value = a.partition("=")
        if name.startswith("--") and _resolve(name, options) == "--config":
            # SGLang's launcher reads the file only after "--config" written whole, as its own word: given as
            # --config=FILE or abbreviated, its argparse took the path and nothing read the file.
            out += ["--config", value] if eq else ["--config"]
            continue
        out.append(_SGLANG_NAMES.get(name, name) + eq + value)
    return out


def choose_backend(args: argparse.Namespace) -> tuple[str, str]:
    """(backend, why)."""
    if args.backend != "auto":
        return args.backend, "--backend " + args.backend
    if importlib.util.find_spec("sglang") is None:
        return "native", "sglang is not importable"
    if args.model_path is None:
        return "native", "no --model-path (the embedded model is served natively)"
    import torch

    if not torch.cuda.is_available():
        return "native", "CUDA is not available"
    if importlib.util.find_spec("sglang_eagle3.integration.launch") is None:
        return "native", "sglang_eagle3.integration.launch is not installed"
    return "sglang", "sglang is importable, CUDA is present and --model-path is given"


def launch_sglang(argv: list[str], worker_env: list[tuple[str, str]] | None = None) -> int:
    """SGLang with the overlay, every flag but ours (--backend, --worker-env) handed to its launcher.

    ``--worker-env KEY=VALUE`` (``worker_env``, parsed) is not an SGLang flag: the pairs go into this process's
    environment before SGLang starts, and its spawned workers inherit them (so does the launcher process
    itself; SGLang's own writes still win where it makes them, and the overlay reports those). Refused with exit
    2, naming them: native-only flags (whole or abbreviated) and malformed pairs. Secrets' values are not logged.
    """
    try:
        argv = sglang_argv(_strip_own_flags(argv))
    except ValueError as e:
        logger.error("--backend sglang: %s", e)
        return 2
    bad = _sglang_worker_env_problems(worker_env or ())
    if bad:
        logger.error("--backend sglang: --worker-env %s; not starting", "; ".join(bad))
        return 2
    if importlib.util.find_spec("sglang") is None:  # the overlay itself imports it only once applied
        logger.error("--backend sglang: SGLang is not installed (pip install 'sglang==0.5.23'), or use "
                     "--backend native.")
        return 2
    try:
        from sglang_eagle3.integration.launch import launch_sglang as launch
    except ImportError as e:
        missing = "sglang_eagle3.integration.launch" if (e.name or "").startswith("sglang_eagle3") else "SGLang"
        logger.error("--backend sglang: %s is not importable (%s). Install SGLang 0.5.23 with the overlay, "
                     "or use --backend native.", missing, e)
        return 2
    if any(a in ("-h", "--help") for a in argv[:argv.index("--") if "--" in argv else len(argv)]):
        sys.stdout.write(_SGLANG_HELP_PREAMBLE)  # then SGLang's launcher prints its own help
        sys.stdout.flush()
    from sglang_eagle3.env_report import is_secret

    for key, value in worker_env or ():
        shown = "<hidden>" if is_secret(key) else repr(value)  # a token must not reach the server's log
        logger.info("--worker-env: %s=%s in the environment SGLang's workers inherit", key, shown)
        os.environ[key] = value
    return int(launch(argv) or 0)


_SGLANG_HELP_PREAMBLE = """\
python -m sglang_eagle3.launch_server --backend sglang: SGLang's own launcher with the sglang_eagle3 overlay
(docs/SGLANG_OVERLAY.md). Every flag below is SGLang's and goes to it as written, except:
  --backend sglang              this choice (--backend native: this package's server)
  --worker-env KEY=VALUE        repeatable: put into the environment SGLang's workers inherit (where SGLang
                                writes the same variable itself, its value wins and the overlay warns)
  --tp N                        renamed --tp-size N
The native server's own flags (--worker-start-timeout, --max-request-bytes, ...) are refused, naming each.
The overlay's switches are environment variables (0 or 1; any other value refuses to start):
  SGLANG_EAGLE3_STRICT_VERIFY=1 a verify that cannot replay its CUDA graph stops the server (test runs)
  SGLANG_EAGLE3_NO_MOE_ROUTING=1 keep SGLang's MoE routing
  SGLANG_EAGLE3_KEEP_GRAPH_BS=1 do not add --cuda-graph-max-bs-decode N for --max-running-requests N
  SGLANG_EAGLE3_FORCE=1         patch an SGLang other than 0.5.23 (mismatched patch targets are skipped)
--use-ray is refused: SGLang's Ray actors never run the plugin that brings the overlay to its workers.

"""

def _sglang_worker_env_problems(pairs) -> list[str]:
    """Why ``--worker-env`` pairs cannot go into the environment SGLang's workers inherit, naming each: what
    env_report.env_pair_problems refuses for our own workers ('NCCL_ALGO =Ring' set "NCCL_ALGO " and NCCL ran with
    its default; a NUL byte), or the variable the overlay itself sets for the workers."""
    from sglang_eagle3 import env
    from sglang_eagle3.env_report import env_pair_problems

    bad = env_pair_problems(pairs)
    for key, value in pairs:
        if key == env.OVERLAY_CONFIG.name:
            bad.append(f"{key + '=' + value!r}: the overlay writes {key} itself for SGLang's workers (its switches "
                       f"are {env.STRICT_VERIFY.name}, {env.NO_MOE_ROUTING.name}, {env.OVERLAY_FORCE.name} and "
                       f"{env.KEEP_GRAPH_BS.name}, in this process's environment)")
    return bad


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw = {name: getattr(args, name) for name in _ENGINE_FLAGS if getattr(args, name) is not None}
    kw.update({name: True for name in _ENGINE_SWITCHES if getattr(args, name)})
    if args.speculative_aux_layer_ids:
        kw["speculative_aux_layer_ids"] = args.speculative_aux_layer_ids
    if args.speculative_num_steps_candidates:
        kw["speculative_num_steps_candidates"] = args.speculative_num_steps_candidates
    if args.worker_env:
        kw["worker_env"] = tuple(args.worker_env)
    return kw


def resolve_auto_parsers(args: argparse.Namespace) -> None:
    """``--reasoning-parser auto`` / ``--tool-call-parser auto``: each replaced in ``args`` by what the chat template
    that will serve (``--chat-template``'s, else the checkpoint's) and the tokenizer say (runtime/auto_parsers.py),
    before the engine loads, so that the engine and the HTTP side get the same names. Raises ValueError (no
    tokenizer to read; strict thinking and no reasoning format found) and OSError (the template file)."""
    from sglang_eagle3.runtime.auto_parsers import AUTO, resolve

    if AUTO not in (args.reasoning_parser, args.tool_call_parser):
        return
    from sglang_eagle3.engine import EMBEDDED_TARGET
    from sglang_eagle3.tokenizer import load_tokenizer

    tok, source = None, "the checkpoint's chat template"
    if not args.skip_tokenizer_init:
        tok = load_tokenizer(args.tokenizer_path or args.model_path or EMBEDDED_TARGET)
    if tok is not None and args.chat_template:
        with open(args.chat_template) as f:
            tok.set_chat_template(f.read())
        source = f"--chat-template {args.chat_template}"
    args.reasoning_parser, args.tool_call_parser = resolve(tok, args.reasoning_parser, args.tool_call_parser, source,
                                                           strict_thinking=args.enable_strict_thinking)


def server_config(args: argparse.Namespace):
    """The HTTP side's ServerConfig from the flags (raises ServerConfigError), checked before the engine loads."""
    from sglang_eagle3.server.config import ServerConfig, ServerConfigError

    if args.max_queued_requests < -1:
        raise ServerConfigError(f"--max-queued-requests {args.max_queued_requests}: must be >= 0, or -1 for "
                                "unbounded")
    # (an empty --served-model-name is refused by ServerConfig, not replaced by the default without a word)
    served = args.served_model_name if args.served_model_name is not None else \
        args.model_path or EMBEDDED_SERVED_NAME
    optional = {name: getattr(args, name) for name in ("max_request_bytes", "shutdown_grace_s", "tool_call_parser",
                                                       "reasoning_parser", "sampling_defaults")
                if getattr(args, name) is not None}
    return ServerConfig(host=args.host, port=args.port, served_model_name=served,
                        max_queued_requests=None if args.max_queued_requests == -1 else args.max_queued_requests,
                        api_key=args.api_key, **optional)


def serve_native(args: argparse.Namespace) -> int:
    import uvicorn

    from sglang_eagle3.config import ConfigError
    from sglang_eagle3.engine import Engine
    from sglang_eagle3.server import EngineDriver, create_app
    from sglang_eagle3.server.app import model_info
    from sglang_eagle3.server.config import ServerConfigError
    from sglang_eagle3.server.metrics import ServerMetrics

    try:
        resolve_auto_parsers(args)
        config = server_config(args)
    except (ValueError, OSError) as e:  # (ServerConfigError is a ValueError)
        logger.error("%s", e)
        return 2
    try:
        engine = Engine(**engine_kwargs(args))
    except (ConfigError, OSError, ValueError, RuntimeError) as e:  # RuntimeError: WorkerError, out of memory, ...
        flags = {name: "--" + name.replace("_", "-") for name in (*_ENGINE_FLAGS, *_ENGINE_SWITCHES)}
        logger.error("cannot start the engine: %s: %s", type(e).__name__, name_the_flag(str(e), flags))
        return 2
    served, max_queued = config.served_model_name, config.max_queued_requests
    try:
        if args.chat_template:
            if engine.tokenizer is None:
                raise ServerConfigError("--chat-template needs a tokenizer (drop --skip-tokenizer-init)")
            with open(args.chat_template) as f:
                engine.tokenizer.set_chat_template(f.read())
    except (ServerConfigError, OSError) as e:
        logger.error("%s", e)
        engine.shutdown()
        return 2
    info = engine.get_server_info()  # before the engine thread starts: afterwards only that thread reads it
    running, num_steps = info["args"]["max_running_requests"], (info.get("draft") or {}).get("num_steps")
    driver = EngineDriver(engine, ServerMetrics(max_accept_length=(num_steps or 0) + 1),
                          max_inflight=None if max_queued is None else running + max_queued)
    app = create_app(engine, driver, config, model_info(info, served))
    driver.start()
    logger.info("serving %r (%s) on http://%s:%d: context %d tokens, %s, device %s, dtype %s, "
                "max_running_requests=%d, max_queued_requests=%s", served, info["model"]["path"], args.host,
                args.port, info["model"]["context_length"],
                f"EAGLE-3 with {num_steps} draft steps" if num_steps else "no speculation", info.get("device"),
                info.get("dtype", args.dtype or "auto"), running, max_queued)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            # Runs in the signal handler: only flags and a queue put (begin_shutdown is safe there).
            driver.begin_shutdown(config.shutdown_grace_s)
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_config=None, access_log=args.log_requests,
                                   timeout_graceful_shutdown=config.shutdown_grace_s + _UVICORN_EXTRA_GRACE_S))
    # NOTE: uvicorn re-raises the signal that stopped it once it has finished, with the handlers it found in
    # place: with the default ones that kills the process before the engine thread and TP workers are stopped.
    # So it finds ours, which only remember the signal; it is re-raised below, after the cleanup.
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, frame: caught.append(sig)) for sig in _EXIT_SIGNALS}
    try:
        server.run()
    finally:
        driver.stop()
        engine.shutdown()  # TP worker processes exit with the server
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        logger.info("server stopped by signal %d", caught[0])
        signal.signal(caught[0], signal.SIG_DFL)
        signal.raise_signal(caught[0])  # exits as killed by it, as uvicorn would have
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        from_file, config_path = _read_config(argv, parser)
    except ValueError as e:
        _setup_logging(_backend_parser().parse_known_args(argv)[0].log_level)
        logger.error("%s", e)
        return 2
    expanded = from_file + argv  # the command line after the file's flags: its own win
    first, _ = _backend_parser().parse_known_args(expanded)
    _setup_logging(first.log_level)
    backend, why = choose_backend(first)
    if backend == "sglang":
        logger.info("backend: %s (%s)", backend, why)
        # SGLang reads the --config file itself, as written: what it would stop at is named here first.
        ours = sorted({t.split("=", 1)[0] for t in from_file if t.startswith("--")} & set(_OWN_FLAGS))
        native = sorted(_native_only_given(from_file))
        if ours or native:
            logger.error("--backend sglang: --config %s names %s, which SGLang's launcher does not have (it reads the "
                         "file itself; put --backend / --worker-env on the command line, and drop the native "
                         "server's own flags)", config_path, ", ".join(ours + native))
            return 2
        return launch_sglang(argv, first.worker_env)
    if {"-h", "--help"} & set(expanded):
        parser.parse_known_args(expanded)  # prints the help and exits
    problems = _cli_problems(expanded, parser, from_config=len(from_file))
    if first.model_path is None:
        from sglang_eagle3.engine import EMBEDDED_DIR

        # NOTE: this must stay the first log line: users and tests read it to learn what is being served.
        logger.warning("no --model-path: serving the embedded default model pair (target + EAGLE-3 draft) "
                       "from %s", EMBEDDED_DIR)
    logger.info("backend: %s (%s)", backend, why)
    if config_path is not None:
        # (flag names only: a value may be a secret, --api-key's)
        logger.info("--config %s: %s", config_path, ", ".join(t for t in from_file if t.startswith("--")) or "empty")
    if problems:  # (before argparse, whose "ignored explicit argument" would say less)
        logger.error("the native server refuses %d flag(s): %s (SGLang's own flags need --backend sglang)",
                     len(problems), "; ".join(problems))
        return 2
    args, unknown = parser.parse_known_args(expanded)
    if unknown:
        logger.error("unrecognised argument(s) %s: the native backend does not implement them (SGLang-only flags "
                     "need --backend sglang)", unknown)
        return 2
    if args.kv_cache_dtype != "auto" and args.dtype != "bfloat16":
        logger.error("--kv-cache-dtype %s: the KV cache is kept in the model's dtype; give --dtype bfloat16 with it, "
                     "or --kv-cache-dtype auto", args.kv_cache_dtype)
        return 2
    return serve_native(args)


if __name__ == "__main__":
    sys.exit(main())
