"""``python -m sglang_eagle3.generate``: one-shot generation from the command line.

    python -m sglang_eagle3.generate --prompt "In the beginning" --max-new-tokens 48
    python -m sglang_eagle3.generate --model-path /models/Kimi-K2.5 --speculative-algorithm EAGLE3 \\
        --speculative-draft-model-path /models/kimi-eagle3 --device cuda --prompt "Hello"

With no --model-path it runs the embedded default pair (EAGLE-3 on). Prints the text, then one line of
statistics (tokens, seconds, tokens/s, accept length) on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_eagle3.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", action="append", help="prompt text (repeat for a batch)")
    ap.add_argument("--model-path")
    ap.add_argument("--speculative-algorithm", default=None)
    ap.add_argument("--speculative-draft-model-path")
    ap.add_argument("--speculative-num-steps", type=int)
    ap.add_argument("--no-speculation", action="store_true", help="target only (also for the embedded pair)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tp-size", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--json", action="store_true", help="print the full SGLang-shaped result as JSON")
    a = ap.parse_args(argv)

    from sglang_eagle3 import Engine

    kwargs = dict(model_path=a.model_path, device=a.device, dtype=a.dtype, tp_size=a.tp_size)
    if a.speculative_algorithm:
        kwargs.update(speculative_algorithm=a.speculative_algorithm,
                      speculative_draft_model_path=a.speculative_draft_model_path,
                      speculative_num_steps=a.speculative_num_steps)
    if a.no_speculation:
        if a.model_path is None:
            from sglang_eagle3.engine import EMBEDDED_DIR

            kwargs["model_path"] = f"{EMBEDDED_DIR}/target"
        kwargs.pop("speculative_algorithm", None)
    prompts = a.prompt or ["And God said,"]
    params = {"max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "top_p": a.top_p}
    if a.seed is not None:
        params["seed"] = a.seed
    with Engine(**kwargs) as engine:
        t0 = time.perf_counter()
        outs = engine.generate(prompts, params)
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
