"""``python -m sglang_eagle3.selfcheck``: run your model through SGLang with and without the overlay.

For users on their own GPUs. Each configuration runs in its own child process (the overlay patches the
process and its spawned workers, so "without" must be a clean interpreter): ``baseline`` is SGLang with only the
overlay's behaviour-neutral reporting (the verify counter, and the worker reports that carry its counts out of
SGLang's workers), so both columns have graph/eager counts, or plain SGLang with ``--no-count-baseline``;
``overlay`` is ``sglang_eagle3.apply()`` with its defaults. Both generate
greedily (temperature 0) on the same prompts; the report says whether the outputs are equal and puts the
verify-path counts and the mean time per output token side by side.

``--dry-run`` checks the arguments (reporting every problem at once; each ``--sglang-arg`` name against SGLang's
server arguments), the local model paths and the installed SGLang version (one the overlay supports), and prints
the plan without starting SGLang. It needs SGLang installed but no GPU; without SGLang it exits with status 2,
saying so. The real run also needs at least ``--tp`` CUDA devices, checked before either configuration starts.
``--output`` is checked before the runs too, and the report is printed before it is written.

Exit codes: 0 the greedy outputs are equal, 1 they differ, 2 the check cannot run (arguments, SGLang, GPUs)
or --output could not be written, 3 one of the runs failed (its own output, above, says why), 130 Ctrl-C.

Example:
  python -m sglang_eagle3.selfcheck --model-path /models/Kimi-K2.5 --draft-model-path /models/kimi-eagle3 \\
      --tp 8 --sglang-arg=--speculative-num-steps=3 --sglang-arg=--speculative-num-draft-tokens=4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

logger = logging.getLogger(__name__)

DEFAULT_PROMPTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List the first ten prime numbers, separated by commas.",
    "Translate to French: The cat sleeps on the warm windowsill.",
)


class SelfCheckError(ValueError):
    """Invalid arguments or environment for the selfcheck."""


def build_parser() -> argparse.ArgumentParser:
    # The whole module docstring: what the two runs are, what --dry-run checks and the exit codes are for the user.
    p = argparse.ArgumentParser(prog="python -m sglang_eagle3.selfcheck", description=__doc__.replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="target model (local directory or hub id)")
    p.add_argument("--draft-model-path", default=None, help="EAGLE-3 draft; omit to check without speculation")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size")
    p.add_argument("--prompts-file", default=None, help="one prompt per line (default: 4 built-in prompts)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--sglang-arg", action="append", default=[], metavar="--FLAG=VALUE",
                   help="extra SGLang server flag, repeatable (e.g. --sglang-arg=--cuda-graph-max-bs-decode=64)")
    p.add_argument("--no-count-baseline", dest="count_baseline", action="store_false",
                   help="baseline runs plain SGLang, without the overlay's verify counter and worker reports")
    p.add_argument("--strict-verify", action="store_true", help="overlay run fails on any verify fallback")
    p.add_argument("--output", default=None, help="write the JSON report here")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; start nothing")
    p.add_argument("--_child", choices=("baseline", "overlay"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--_child-out", default=None, help=argparse.SUPPRESS)
    return p


# The baseline's overlay (unless --no-count-baseline): reporting only. worker_env stays on: its
# Scheduler.get_internal_state patch carries the workers' verify counters into get_server_info (off, the column was
# always null).
BASELINE_OVERLAY = {"moe_routing": False, "draft_wiring": False}

# SGLang keywords our own flags set: a --sglang-arg for one would silently replace the flag (and the GPU count
# is checked against --tp).
_OWN_KEYWORDS = {"model_path": "--model-path", "tp_size": "--tp", "speculative_algorithm": "--draft-model-path",
                 "speculative_draft_model_path": "--draft-model-path"}


def sglang_kwargs(args: argparse.Namespace) -> dict:
    """``sglang.Engine`` keyword arguments from our flags plus every ``--sglang-arg=--name=value``; raises
    SelfCheckError naming every malformed ``--sglang-arg`` and every one that would replace one of our flags."""
    kw: dict = {"model_path": args.model_path, "tp_size": args.tp}
    if args.draft_model_path:
        kw.update(speculative_algorithm="EAGLE3", speculative_draft_model_path=args.draft_model_path)
    problems = [f"--sglang-arg {item!r} must look like --flag=value or --flag" for item in args.sglang_arg
                if not item.startswith("--") or item[2:].partition("=")[0] == ""]
    for item in args.sglang_arg:
        key = item[2:].partition("=")[0].replace("-", "_")
        if item.startswith("--") and key in _OWN_KEYWORDS:
            problems.append(f"--sglang-arg {item!r} sets {key}: use {_OWN_KEYWORDS[key]}")
    if problems:
        raise SelfCheckError("; ".join(problems))
    for item in args.sglang_arg:
        name, sep, value = item[2:].partition("=")
        key = name.replace("-", "_")
        if not sep:
            kw[key] = True
            continue
        try:
            kw[key] = json.loads(value)
        except json.JSONDecodeError:
            kw[key] = value
    return kw


def unknown_engine_keywords(kwargs: dict) -> list[str]:
    """One problem per keyword SGLang's ServerArgs (what ``sglang.Engine(**kwargs)`` builds first) does not have:
    checked by --dry-run, where the real run would fail in its first child after the model path checks, and the
    second run would never start."""
    import dataclasses
    import difflib

    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError:  # (its version was read from the package metadata; the real run names the import error)
        return []
    # (a msgspec Struct in SGLang 0.5.23, a dataclass before)
    known = set(getattr(ServerArgs, "__struct_fields__", None) or (f.name for f in dataclasses.fields(ServerArgs)))
    out = []
    for key in kwargs:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean --{close[0].replace('_', '-')}?)" if close else ""
            out.append(f"--sglang-arg --{key.replace('_', '-')}: SGLang's server arguments have no {key!r}{hint}")
    return out


def load_prompts(path: str | None) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    if os.path.isdir(path):
        raise SelfCheckError(f"--prompts-file {path!r} is a directory")
    if not os.path.isfile(path):
        raise SelfCheckError(f"--prompts-file {path!r} does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            prompts = [line.rstrip("\r\n") for line in f if line.strip()]  # "\r": files written on Windows
    except UnicodeDecodeError as e:
        raise SelfCheckError(f"--prompts-file {path!r} is not UTF-8 text ({e})") from None
    if not prompts:
        raise SelfCheckError(f"--prompts-file {path!r} holds no prompts")
    return prompts


def validate(args: argparse.Namespace) -> dict:
    """Check arguments and environment; returns the plan. Raises SelfCheckError with every problem."""
    problems = []
    if args.tp < 1:
        problems.append(f"--tp={args.tp} must be >= 1")
    if args.max_new_tokens < 1:
        problems.append(f"--max-new-tokens={args.max_new_tokens} must be >= 1")
    for flag, path in (("--model-path", args.model_path), ("--draft-model-path", args.draft_model_path)):
        # Hub ids ("org/name") are left to SGLang; anything that looks like a local path must exist.
        if path and path.startswith((".", "/", "~")) and not os.path.isdir(os.path.expanduser(path)):
            problems.append(f"{flag} {path!r} is not a directory")
    prompts, kwargs = [], {}
    try:
        prompts = load_prompts(args.prompts_file)
    except SelfCheckError as e:
        problems.append(str(e))
    try:
        kwargs = sglang_kwargs(args)
    except SelfCheckError as e:
        problems.append(str(e))
    if args.output is not None:
        out_dir = os.path.dirname(os.path.abspath(args.output))
        if os.path.isdir(args.output):
            problems.append(f"--output {args.output!r} is a directory")
        elif not os.path.isdir(out_dir):
            problems.append(f"--output {args.output!r}: directory {out_dir!r} does not exist")
        elif not os.access(out_dir, os.W_OK):
            problems.append(f"--output {args.output!r}: directory {out_dir!r} is not writable")
    from sglang_eagle3.integration.sglang_overlay import SUPPORTED_SGLANG_VERSIONS, installed_sglang_version

    try:
        version = installed_sglang_version()
    except ImportError as e:
        version = None
        problems.append(str(e))
    if version is not None and version not in SUPPORTED_SGLANG_VERSIONS:
        problems.append(f"sglang {version} is installed; the overlay supports {list(SUPPORTED_SGLANG_VERSIONS)}")
    elif version is not None:
        problems += unknown_engine_keywords(kwargs)
    if problems:
        raise SelfCheckError("selfcheck cannot run: " + "; ".join(problems))
    return {"sglang_version": version, "engine_kwargs": kwargs, "prompts": prompts,
            "max_new_tokens": args.max_new_tokens, "runs": ["baseline", "overlay"],
            "count_baseline": args.count_baseline, "strict_verify": args.strict_verify}


def _run_child(args: argparse.Namespace) -> None:
    """One configuration in this (child) process; writes its result JSON to ``args._child_out``."""
    from sglang_eagle3.integration import sglang_overlay

    if args._child == "overlay":
        sglang_overlay.apply(strict_verify=args.strict_verify)
    elif args.count_baseline:
        sglang_overlay.apply(**BASELINE_OVERLAY)
    import sglang

    plan = validate(args)
    engine = sglang.Engine(**plan["engine_kwargs"])
    try:
        sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens}
        engine.generate(plan["prompts"][:1], sampling)  # warm-up, not timed
        t0 = time.perf_counter()
        outs = engine.generate(plan["prompts"], sampling)
        elapsed = time.perf_counter() - t0
        texts = [o["text"] for o in outs]
        tokens = sum(o.get("meta_info", {}).get("completion_tokens", 0) for o in outs)
        info = engine.get_server_info()
        verify = [s.get("sglang_eagle3", {}).get("verify") for s in info.get("internal_states", [])]
    finally:
        engine.shutdown()
    result = {"run": args._child, "texts": texts, "elapsed_s": elapsed, "completion_tokens": tokens,
              "ms_per_token": 1e3 * elapsed / max(tokens, 1), "verify": verify}
    with open(args._child_out, "w") as f:
        json.dump(result, f)


def compare(baseline: dict, overlay: dict) -> dict:
    """Side-by-side report of two child results."""
    mismatches = [i for i, (a, b) in enumerate(zip(baseline["texts"], overlay["texts"], strict=True)) if a != b]
    return {
        "greedy_outputs_equal": not mismatches,
        "mismatched_prompts": mismatches,
        "ms_per_token": {"baseline": baseline["ms_per_token"], "overlay": overlay["ms_per_token"]},
        "verify": {"baseline": baseline["verify"], "overlay": overlay["verify"]},
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    if args._child:
        _run_child(args)
        return 0
    try:
        plan = validate(args)
    except SelfCheckError as e:
        logger.error("%s", e)
        return 2
    if args.dry_run:
        print(json.dumps(plan, indent=2))
        return 0
    import torch

    if torch.cuda.device_count() < args.tp:
        logger.error("selfcheck: the runs need %d CUDA device(s) (--tp %d); %d visible (--dry-run checks the rest "
                     "without a GPU)", args.tp, args.tp, torch.cuda.device_count())
        return 2
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in plan["runs"]:
            out = os.path.join(tmp, f"{run}.json")
            cmd = [sys.executable, "-m", "sglang_eagle3.selfcheck", *(argv if argv is not None else sys.argv[1:]),
                   f"--_child={run}", f"--_child-out={out}"]
            env = {k: v for k, v in os.environ.items() if k != "SGLANG_EAGLE3_OVERLAY"}
            logger.info("selfcheck: running %s", run)
            try:
                subprocess.run(cmd, check=True, env=env)
            except subprocess.CalledProcessError as e:  # the child printed its own traceback above
                logger.error("selfcheck: the %s run failed (exit code %s); its output above says why",
                             run, e.returncode)
                return 3
            except KeyboardInterrupt:  # the child got the Ctrl-C too and has stopped
                logger.error("selfcheck: interrupted during the %s run; no report", run)
                return 130
            with open(out) as f:
                results[run] = json.load(f)
    report = compare(results["baseline"], results["overlay"])
    text = json.dumps(report, indent=2)
    print(text, flush=True)  # first: a failed write below must not lose the runs' result
    if args.output:
        try:
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as e:
            logger.error("selfcheck: cannot write --output %r: %s (the report is printed above)", args.output, e)
            return 2
    return 0 if report["greedy_outputs_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
