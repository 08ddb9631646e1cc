"""The host's grammar work a speculative round at Kimi-K2.5's vocabulary size (runtime/grammar.py), no GPU needed:
the draft's k masks (GrammarBatch.after, one a draft step), the verify's last row (masks; rows 0..k-1 are the
draft's), and accepting the round's k + 1 tokens (the scheduler's _emit), for B requests with a grammar.

On a GPU the draft's masks sit on the round's critical path (each waits for its draft step, and the next step
waits for it); the verify's row overlaps the verify forward. The vocabulary is synthetic (no Kimi tokenizer can be
downloaded here): the embedded pair's 4096 tokens' bytes, then pairs of them (the second without whitespace, as
BPE merges within pre-split words), to 163840 ids, so token lengths and bytes are text-like. Each request's
tokens are a random walk through its grammar (a random allowed token at each step), every draft accepted: the
longest walks a round can take.

    python benchmarks/bench_grammar_host.py --out benchmarks/results/cpu/grammar_host_<commit>.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_eagle3.bench.harness import git_commit  # noqa: E402
from sglang_eagle3.engine import EMBEDDED_DIR  # noqa: E402
from sglang_eagle3.runtime.grammar import GrammarBackend, GrammarBatch, GrammarSpec, allowed_tokens  # noqa: E402
from sglang_eagle3.tokenizer import load_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
GRAMMARS = {"json_any": GrammarSpec("json_schema", "$$ANY$$"), "json_schema": GrammarSpec("json_schema",
                                                                                           json.dumps(SCHEMA)),
            "regex_star": GrammarSpec("regex", r"[A-Z][a-z]+( [a-z]+)*\."),
            "regex_bounded": GrammarSpec("regex", r"[A-Z][a-z]+( [a-z]+){5,40}\.")}


class _SyntheticTokenizer:
    """The Tokenizer interface grammar_vocab reads (token_bytes, special_ids, vocab_size) over V ids."""

    def __init__(self, V: int, seed: int = 0):
        base = load_tokenizer(f"{EMBEDDED_DIR}/target")
        self.special_ids = frozenset(base.special_ids)
        pieces = [base.token_bytes(i) for i in range(base.vocab_size)]
        rng = random.Random(seed)
        text = [p for i, p in enumerate(pieces) if i not in self.special_ids and p]
        # A second piece without whitespace: as a BPE over pre-split words, a token holds at most a leading space
        # (a pair across a space, "ing the", is rare in real vocabularies and costs a regex's mask the most).
        inner = [p for p in text if not any(c in p for c in b" \t\n")]
        self._bytes = pieces + [rng.choice(text) + rng.choice(inner) for _ in range(V - len(pieces))]
        self.vocab_size, self.eos_token_id = V, base.eos_token_id

    def token_bytes(self, i: int) -> bytes:
        return self._bytes[i]


def _walk(backend: GrammarBackend, spec: GrammarSpec, n: int, rng: random.Random, eos: int) -> list[int]:
    """Up to n tokens the grammar allows one after another (random choices among the allowed, the eos left out;
    fewer where only the eos is left)."""
    m = backend.matcher(spec)
    mask = torch.zeros(1, (backend.vocab_size + 31) // 32, dtype=torch.int32)
    out = []
    for _ in range(n):
        m.fill(mask, 0)
        ok = allowed_tokens(mask, backend.vocab_size)[0].nonzero().flatten().tolist()
        ok = [t for t in ok if t != eos] or ok
        t = rng.choice(ok)
        if t == eos or not m.accept(t):
            break
        out.append(t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out")
    a = ap.parse_args()
    tok = _SyntheticTokenizer(a.vocab)
    t0 = time.perf_counter()
    backend = GrammarBackend(tok, a.vocab, [tok.eos_token_id])
    rows = []
    for name, spec in GRAMMARS.items():
        t = time.perf_counter()
        backend.compile(spec)
        compile_s = time.perf_counter() - t
        rng = random.Random(1)
        T = a.k + 1
        n = T * a.rounds + 1
        walks = []
        for _ in range(max(a.batch)):  # walks that end early (a value closed: only the eos left) are drawn again
            walk: list[int] = []
            for _ in range(20):
                walk = max(walk, _walk(backend, spec, n, rng, tok.eos_token_id), key=len)
                if len(walk) >= n:
                    break
            walks.append(walk)
        for B in a.batch:
            matchers = [backend.matcher(spec) for _ in range(B)]
            for m, w in zip(matchers, walks, strict=False):
                assert m.accept(w[0])  # each round's first id is the last token emitted
            batch_ms, done = [], 0
            for r in range(a.rounds):
                if any(len(w) < (r + 1) * T + 1 for w in walks[:B]):
                    break  # a walk ended early (its grammar allowed only the eos)
                ids = torch.tensor([w[r * T:(r + 1) * T] for w in walks[:B]])  # [last, d_1..d_k] as accepted
                start = time.perf_counter()
                batch = GrammarBatch(matchers, a.vocab, lambda x: x)
                for j in range(T - 1):
                    batch.after(ids[:, 1:j + 1])
                batch.masks(ids, T)
                for b, m in enumerate(matchers):  # the round's k + 1 tokens, as _emit accepts them
                    for tk in walks[b][r * T + 1:(r + 1) * T + 1]:
                        assert m.accept(tk)
                batch_ms.append((time.perf_counter() - start) * 1e3)
                done += 1
            med = statistics.median(batch_ms) if batch_ms else float("nan")
            rows.append({"grammar": name, "batch": B, "k": a.k, "rounds": done, "round_ms_median": round(med, 3),
                         "per_request_us": round(med * 1e3 / B, 1), "compile_s": round(compile_s, 3)})
            print(f"{name:12s} B={B:3d} k={a.k}: {med:7.3f} ms a round ({med * 1e3 / B:7.1f} us a request), "
                  f"{done} rounds; compiled in {compile_s:.3f} s", flush=True)
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(), "machine": platform.processor()
              or platform.machine(), "cpus": torch.get_num_threads(), "vocab": a.vocab,
              "backend_ready_s": round(time.perf_counter() - t0, 2), "rows": rows}
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(result, indent=1))
        print("wrote", a.out)


if __name__ == "__main__":
    main()
