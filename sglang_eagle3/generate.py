"""``python -m sglang_eagle3.generate``: one-shot generation from the command line.

    python -m sglang_eagle3.generate --prompt "In the beginning" --max-new-tokens 48
    python -m sglang_eagle3.generate --model-path /models/Kimi-K2.5 --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path /models/kimi-eagle3 --device cuda --prompt "Hello"

The speculation flags mean what launch_server makes of them. With no --model-path it runs the embedded default
pair, EAGLE-3 on: --speculative-draft-model-path replaces the embedded draft, --speculative-num-steps sets k.
With --model-path, EAGLE-3 needs --speculative-algorithm EAGLE3 and --speculative-draft-model-path; a draft
path or step count without the algorithm is an error, not ignored. --no-speculation runs the target alone.

For each prompt it prints the prompt followed by its continuation (with --json, the SGLang-shaped result
instead), then one line of statistics (tokens, seconds, tokens/s, accept length) on stderr. Invalid flags
are refused before the model loads; every error is one line naming the flag (after the usage), with exit
code 2. Ctrl-C stops at once (nothing is printed for the prompts: a batch is answered whole), exit code 130.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from sglang_eagle3.argtypes import name_the_flag

# SamplingParams field -> flag, to name the flag in a SamplingParamsError ("temperature=nan must ...").
_SAMPLING_FLAGS = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_p": "--top-p",
                   "top_k": "--top-k", "min_p": "--min-p", "stop": "--stop", "seed": "--seed"}
# Engine keyword -> flag, for the engine's ConfigError ("speculative_num_steps=0 must ...").
_ENGINE_FLAGS = {"model_path": "--model-path", "speculative_algorithm": "--speculative-algorithm",
                 "speculative_draft_model_path": "--speculative-draft-model-path",
                 "speculative_num_steps": "--speculative-num-steps", "device": "--device", "dtype": "--dtype",
                 "tp_size": "--tp-size"}


def _one_prompt(msg: str, prompts: int) -> str:
    """The engine's "prompt 0 of the batch: ..." for the one --prompt given: the message alone."""
    prefix = "prompt 0 of the batch: "
    return msg[len(prefix):] if prompts == 1 and msg.startswith(prefix) else msg


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_eagle3.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", action="append", help="prompt text (repeat for a batch; default 'And God said,')")
    ap.add_argument("--model-path", help="target checkpoint directory (default: the embedded model pair)")
    ap.add_argument("--speculative-algorithm", default=None,
                    help="EAGLE3 (or EAGLE); default: off, or EAGLE3 for the embedded pair")
    ap.add_argument("--speculative-draft-model-path", help="EAGLE-3 draft checkpoint directory")
    ap.add_argument("--speculative-num-steps", type=int, help="draft steps per round (default 3)")
    ap.add_argument("--no-speculation", action="store_true", help="target only (also for the embedded pair)")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    ap.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16 | "
                    "float16")
    ap.add_argument("--tp-size", type=int, default=1, help="tensor-parallel processes (default 1)")
    g = ap.add_argument_group("sampling (SGLang's sampling_params)")
    g.add_argument("--max-new-tokens", type=int, default=64, help="default 64")
    g.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    g.add_argument("--top-p", type=float, default=1.0, help="default 1.0: off")
    g.add_argument("--top-k", type=int, default=-1, help="default -1: off")
    g.add_argument("--min-p", type=float, default=0.0, help="default 0.0: off")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--seed", type=int, help="sampling seed")
    ap.add_argument("--json", action="store_true", help="print the full SGLang-shaped result as JSON")
    return ap


def engine_kwargs(ap: argparse.ArgumentParser, a: argparse.Namespace) -> dict:
    """Engine keyword arguments from the flags; contradictory speculation flags are a parser error."""
    kwargs = dict(model_path=a.model_path, device=a.device, dtype=a.dtype, tp_size=a.tp_size)
    spec_flags = [flag for flag, value in (("--speculative-algorithm", a.speculative_algorithm),
                                           ("--speculative-draft-model-path", a.speculative_draft_model_path),
                                           ("--speculative-num-steps", a.speculative_num_steps))
                  if value is not None]
    if a.no_speculation:
        if spec_flags:
            ap.error(f"--no-speculation contradicts {', '.join(spec_flags)}")
        if a.model_path is None:
            from sglang_eagle3.engine import EMBEDDED_DIR

            kwargs["model_path"] = f"{EMBEDDED_DIR}/target"
        return kwargs
    if a.model_path is not None and spec_flags and a.speculative_algorithm is None:
        ap.error(f"{', '.join(spec_flags)} given without --speculative-algorithm: pass --speculative-algorithm "
                 "EAGLE3 to speculate, or drop them")
    if a.model_path is not None and spec_flags and a.speculative_draft_model_path is None:
        ap.error("--speculative-algorithm with --model-path needs --speculative-draft-model-path")
    # Passed on unchanged, as launch_server passes them: with no model_path the engine serves the embedded pair
    # with EAGLE-3 on, taking a given draft path or step count in place of its own.
    for name in ("speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps"):
        if getattr(a, name) is not None:
            kwargs[name] = getattr(a, name)
    return kwargs


def sampling_params(ap: argparse.ArgumentParser, a: argparse.Namespace) -> dict:
    """SGLang sampling_params from the flags, checked as the engine checks each request."""
    from sglang_eagle3.runtime.sampling import SamplingParams, SamplingParamsError

    params = {"max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "top_p": a.top_p,
              "top_k": a.top_k, "min_p": a.min_p, "stop": a.stop}
    if a.seed is not None:
        params["seed"] = a.seed
    if a.top_k < 1 and a.top_k != -1:
        # The engine reads a greedy request's top_k as 1, whatever it is (as SGLang does, for scripts that pass
        # top_k 0 beside temperature 0); a flag outside its own range is still the user's mistake here.
        ap.error(f"--top-k={a.top_k} must be -1 (off) or an integer >= 1")
    try:
        SamplingParams.from_dict(params)
    except SamplingParamsError as e:
        ap.error(name_the_flag(str(e), _SAMPLING_FLAGS))
    return params


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    prompts = a.prompt or ["And God said,"]
    if "" in prompts:
        ap.error("--prompt '' is empty")
    params = sampling_params(ap, a)
    kwargs = engine_kwargs(ap, a)

    from sglang_eagle3.config import ConfigError
    from sglang_eagle3.engine import Engine, RequestError, SamplingParamsError

    try:
        engine = Engine(**kwargs)
    except ConfigError as e:  # an engine argument: name the flag it came from
        msg = name_the_flag(str(e), _ENGINE_FLAGS)
        if msg == str(e):  # e.g. "config file not found: PATH": name the flag that gave PATH
            for flag in ("--speculative-draft-model-path", "--model-path"):
                path = getattr(a, flag[2:].replace("-", "_"))
                if path and path in msg:
                    msg = f"{flag} {path!r}: {msg}"
                    break
        print(f"{ap.prog}: error: cannot start the engine: {msg}", file=sys.stderr)
        return 2
    except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: WorkerError, OOM
        print(f"{ap.prog}: error: cannot start the engine: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{ap.prog}: interrupted while the engine was starting", file=sys.stderr)
        return 130
    with engine:
        t0 = time.perf_counter()
        try:
            outs = engine.generate(prompts, params)
        except (RequestError, SamplingParamsError) as e:  # a prompt longer than the context, a stop string too long
            print(f"{ap.prog}: error: {name_the_flag(_one_prompt(str(e), len(prompts)), _SAMPLING_FLAGS)}",
                  file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # 130: the shell's code for Ctrl-C; no traceback, the user asked for it
            print(f"{ap.prog}: interrupted: nothing generated", file=sys.stderr)
            return 130
        dt = time.perf_counter() - t0
        for p, o in zip(prompts, outs, strict=True):
            print(json.dumps(o) if a.json else p + o.get("text", str(o["output_ids"])))
        tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
        verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
        accept = f", accept length {tokens / verify:.2f}" if verify else ""
        print(f"[{tokens} tokens in {dt:.2f} s: {tokens / dt:.1f} tok/s{accept}]", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
