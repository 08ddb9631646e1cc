"""The host's work strict thinking adds to a speculative round (EngineArgs.enable_strict_thinking; runtime/reasoning.py
ThinkingMatcher), at Kimi-K2.5's vocabulary size, no GPU or tokenizer needed: GrammarBatch.host_masks' k + 1 verify
rows for B requests inside their thinking (every token but the format's excluded ones; ``over_budget``: the end
marker alone), each round's drafts accepted and rolled back as the scheduler's round does, against the same batch
without matchers (what a round pays for the mask it builds at all). Medians over --rounds rounds, one torch thread.

    python benchmarks/bench_strict_thinking_host.py --out benchmarks/results/cpu/strict_thinking_host_<commit>.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.bench_grammar_host import write_host_result  # noqa: E402
from sglang_eagle3.runtime.grammar import GrammarBatch  # noqa: E402
from sglang_eagle3.runtime.reasoning import REASONING_FORMATS, ThinkingMatcher  # noqa: E402


def _median_ms(fn, rounds: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    # Kimi's excluded markers as ids near the vocabulary's end (where its special tokens are), the markers beside them.
    n_excluded = len(REASONING_FORMATS["kimi_k2"].excluded)
    excluded = frozenset(range(a.vocab - 256, a.vocab - 256 + n_excluded))
    start, end = a.vocab - 200, a.vocab - 199
    T, rows = a.k + 1, []
    for B in a.batch:
        drafts = [[rng.randrange(a.vocab - 256) for _ in range(T)] for _ in range(B)]
        for case, budget in (("no_matchers", None), ("thinking", 10 ** 9), ("over_budget", 0)):
            matchers = [None] * B if case == "no_matchers" else [
                ThinkingMatcher(None, start, end, thinking=True, budget=budget, excluded=excluded) for _ in range(B)]
            batch = GrammarBatch(matchers, a.vocab, upload=lambda x: x)
            ms = _median_ms(lambda b=batch, d=drafts: b.host_masks(d, T), a.rounds)
            rows.append({"case": case, "batch": B, "k": a.k, "verify_rows_ms": ms})
            print(f"{case:12s} B={B:3d} k={a.k}: verify rows {ms:7.3f} ms a round (median of {a.rounds})", flush=True)
    write_host_result(a.out, rows, vocab=a.vocab)


if __name__ == "__main__":
    main()
