"""CPU tokens/s with and without EAGLE-3 speculation on a small random target + draft pair.

Three runs over the same prompts, greedy, through the public Engine:
  target-only     one target decode per token
  eagle3 (random) the real draft head, random weights: almost every draft is rejected, so this is the cost
                  of speculation when it never pays (1 token per verify round)
  eagle3 (oracle) the real draft runs, but its proposals are replaced with the target's known greedy
                  continuation: every draft is accepted (k+1 tokens per round), the best speculation can do
Prints tokens/s, mean tokens per verify round (accept length) and whether the outputs equal target-only.
Random tiny models are overhead-bound, so read the ratios, not the absolute numbers. A benchmark, not a test.

    python benchmarks/bench_cpu_spec.py [--k 4] [--batch 4] [--tokens 64] [--hidden 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time

import torch

from sglang_eagle3 import Engine
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair


def oracle_proposals(engine: Engine, refs: dict[tuple[int, ...], list[int]]):
    """A _draft_propose replacement: runs the real draft, proposes refs[p + 2] for a row at position p (a row
    reads token p+1 and proposes token p+2); a row's request is found through its first page."""
    real = engine.runner._draft_propose
    sched = engine.backend.scheduler

    def propose(input_ids, hidden, positions, fb, samp_f=None, samp_i=None):  # (greedy here: no sampler inputs)
        _, h = real(input_ids, hidden, positions, fb)
        owner = {r.pages[0]: refs[tuple(r.input_ids)] for r in sched.running}
        counts = fb.extend_lens if fb.extend_lens is not None else [fb.tokens_per_req] * fb.batch_size
        pos, out, row = positions.tolist(), [], 0
        for b, n in enumerate(counts):
            ref = owner[int(fb.page_table[b, 0])]
            out += [ref[p + 2] if p + 2 < len(ref) else 0 for p in pos[row:row + n]]
            row += n
        return torch.tensor(out, dtype=torch.int64, device=h.device), h

    return propose


def timed(engine: Engine, prompts, max_new: int) -> tuple[list[list[int]], float]:
    sp = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=prompts, sampling_params=sp)
    return [o["output_ids"] for o in outs], time.perf_counter() - t0


def warm_up(engine: Engine, prompts) -> None:
    engine.generate(input_ids=[p[:4] for p in prompts], sampling_params={"max_new_tokens": 4, "temperature": 0})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--k", type=int, default=4, help="draft steps per round (speculative_num_steps)")
    ap.add_argument("--batch", type=int, default=4, help="prompts per generate call")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads (1: tiny ops gain nothing from more, and they spin on busy machines)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("sglang_eagle3").setLevel(logging.WARNING)

    cfg = tiny_config(vocab=2048, hidden=args.hidden, layers=args.layers, heads=8, q_lora=args.hidden // 2,
                      kv_lora=args.hidden // 4, nope=32, rope=16, v=32, experts=args.experts, top_k=4, n_group=4,
                      topk_group=2, moe_inter=args.hidden // 2, inter=args.hidden * 2, max_pos=1024)
    dcfg = tiny_draft_config(cfg, draft_vocab=1024, heads=8, kv_heads=2, inter=args.hidden * 2)
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len + 3 * i,), generator=g).tolist()
               for i in range(args.batch)]
    with tempfile.TemporaryDirectory() as root:
        target, draft = write_tiny_pair(root, cfg, dcfg, seed=args.seed, scale=3.0)
        common = dict(model_path=target, device="cpu", dtype="float32", skip_tokenizer_init=True)
        spec = dict(speculative_algorithm="EAGLE3", speculative_draft_model_path=draft, speculative_num_steps=args.k)

        base = Engine(**common)
        warm_up(base, prompts)
        ref_out, base_s = timed(base, prompts, args.tokens)
        longer = base.generate(input_ids=prompts, sampling_params={"max_new_tokens": args.tokens + args.k + 2,
                                                                   "temperature": 0, "ignore_eos": True})
        refs = {tuple(p): p + o["output_ids"] for p, o in zip(prompts, longer, strict=True)}

        rows = [("target-only", base_s, ref_out, None)]
        for name in ("eagle3 (random)", "eagle3 (oracle)"):
            engine = Engine(**common, **spec)
            warm_up(engine, prompts)
            if "oracle" in name:
                engine.runner._draft_propose = oracle_proposals(engine, refs)
            stats = engine.backend.scheduler.stats
            verify0, accepted0 = stats.verify_forwards, stats.accepted_tokens
            out, s = timed(engine, prompts, args.tokens)
            rows.append((name, s, out, (stats.accepted_tokens - accepted0, stats.verify_forwards - verify0)))

    n_tokens = sum(len(o) for o in ref_out)
    print(f"target: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.n_routed_experts} experts "
          f"top-{cfg.num_experts_per_tok}; draft vocab {dcfg.draft_vocab_size}/{cfg.vocab_size}; k={args.k}; "
          f"batch {args.batch} x {args.tokens} tokens; {args.threads} threads")
    print(f"{'mode':<18}{'tok/s':>10}{'speedup':>9}{'accept len':>12}  output == target-only")
    for name, s, out, acc in rows:
        accept = "-" if acc is None else f"{acc[0] / max(acc[1], 1):.2f}"
        print(f"{name:<18}{n_tokens / s:>10.1f}{base_s / s:>8.2f}x{accept:>12}  {out == ref_out}")


if __name__ == "__main__":
    main()
