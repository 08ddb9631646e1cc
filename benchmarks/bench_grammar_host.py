"""The host's grammar work a speculative round at Kimi-K2.5's vocabulary size (runtime/grammar.py), no GPU needed,
for B requests with a grammar, split as a GPU round meets it:
- ``serial``: between the draft steps, each step's rows filled ahead of it (GrammarBatch.step_mask, where a request's
  rows are cheap) and its draft picked among the step's candidates (choose); on a GPU this sits on the round's
  critical path (each step waits for the pick before it);
- ``overlapped``: the verify's k + 1 rows not filled for the drafts (masks()), while the verify forward runs;
- ``emit``: accepting the round's k + 1 tokens (the scheduler's _emit).
Modes: ``ahead`` (every row filled before its step, one by one: the flow before the candidates, the fortieth
session's), ``default`` (step_mask's threshold grammar.PREFILL_BELOW_S, rows one by one) and ``default_tN`` (the
same, dear rows filled together on N threads: --fill-threads). The drafts are the walk's tokens, each its step's
first candidate (no refill: a refill adds a row to ``serial``).

The vocabulary is synthetic (no Kimi tokenizer can be
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
from sglang_eagle3.runtime.grammar import (  # noqa: E402
    PREFILL_BELOW_S,
    GrammarBackend,
    GrammarBatch,
    GrammarSpec,
    allowed_tokens,
)
from sglang_eagle3.server.tools import KimiK2Format  # noqa: E402
from sglang_eagle3.tokenizer import load_tokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "tags"]}
GRAMMARS = {"json_any": GrammarSpec("json_schema", "$$ANY$$"), "json_schema": GrammarSpec("json_schema",
                                                                                           json.dumps(SCHEMA)),
            "regex_star": GrammarSpec("regex", r"[A-Z][a-z]+( [a-z]+)*\."),
            "regex_bounded": GrammarSpec("regex", r"[A-Z][a-z]+( [a-z]+){5,40}\."),
            # free text in which "<call>" opens a JSON object (SGLang's legacy structural tag; a random walk seldom
            # writes the trigger: its free text's rows), and the tag itself, forced (xgrammar's shape: the JSON's rows)
            "structural_tag": GrammarSpec("structural_tag", json.dumps(
                {"structures": [{"begin": "<call>", "schema": SCHEMA, "end": "</call>"}], "triggers": ["<call>"]})),
            "structural_tag_forced": GrammarSpec("structural_tag", json.dumps({"format": {
                "type": "tag", "begin": "<call>", "content": {"type": "json_schema", "json_schema": SCHEMA},
                "end": "</call>"}}))}
# Kimi-K2's tool-call markers and thinking end: special tokens at the top of the synthetic vocabulary, for the tool
# calls held to its markup (server/tools.py ToolPlan.use_markup); these grammars' first compile builds the compiler
# whose vocabulary lets a tag require them (runtime/grammar.py grammar_vocab), so their compile_s holds that build.
KIMI_MARKERS = KimiK2Format.MARKERS + ("</think>",)


def _kimi_tags(ids: dict[str, int]) -> dict[str, GrammarSpec]:
    """Forced calls to one function of SCHEMA in Kimi's markup, and tool_choice auto with it strict (free text in
    which the section's marker opens calls: a random walk seldom draws it, so these rows are the free text's);
    ``ids``: the markers' token ids."""
    fmt = KimiK2Format()
    return {name: GrammarSpec("structural_tag", json.dumps({"type": "structural_tag", "format": fmt.markup_format(
        [("record", SCHEMA)], True, ids, forced=forced)})) for name, forced in (("kimi_forced", True),
                                                                                  ("kimi_strict_auto", False))}


class _SyntheticTokenizer:
    """The Tokenizer interface grammar_vocab reads (token_bytes, special_ids, vocab_size, encode for a special
    token's text) over V ids, Kimi's markers (KIMI_MARKERS) its last ids."""

    def __init__(self, V: int, seed: int = 0):
        base = load_tokenizer(f"{EMBEDDED_DIR}/target")
        pieces = [base.token_bytes(i) for i in range(base.vocab_size)]
        rng = random.Random(seed)
        text = [p for i, p in enumerate(pieces) if i not in base.special_ids and p]
        # A second piece without whitespace: as a BPE over pre-split words, a token holds at most a leading space
        # (a pair across a space, "ing the", is rare in real vocabularies and costs a regex's mask the most).
        inner = [p for p in text if not any(c in p for c in b" \t\n")]
        n = V - len(pieces) - len(KIMI_MARKERS)
        self._bytes = pieces + [rng.choice(text) + rng.choice(inner) for _ in range(n)] + [
            m.encode() for m in KIMI_MARKERS]
        self.markers = {m: V - len(KIMI_MARKERS) + i for i, m in enumerate(KIMI_MARKERS)}
        self.special_ids = frozenset(base.special_ids) | frozenset(self.markers.values())
        self.vocab_size, self.eos_token_id = V, base.eos_token_id

    def token_bytes(self, i: int) -> bytes:
        return self._bytes[i]

    def encode(self, text: str) -> list[int]:
        return [self.markers[text]] if text in self.markers else list(text.encode())


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


def _rounds(backend: GrammarBackend, spec: GrammarSpec, walks: list[list[int]], a, T: int, below: float) -> dict:
    """Median ms a round of each part (module doc) over the walks' rounds, with step_mask(below)."""
    matchers = [backend.matcher(spec) for _ in walks]
    for m, w in zip(matchers, walks, strict=True):
        assert m.accept(w[0])  # each round's first id is the last token emitted
    parts: dict[str, list[float]] = {"serial_ms": [], "overlapped_ms": [], "emit_ms": []}
    for r in range(a.rounds):
        if any(len(w) < (r + 1) * T + 1 for w in walks):
            break  # a walk ended early (its grammar allowed only the eos)
        drafts = [w[r * T:(r + 1) * T] for w in walks]  # [last, d_1..d_k] as accepted
        t0 = time.perf_counter()
        batch = GrammarBatch(matchers, a.vocab, lambda x: x)
        for j in range(1, T):
            batch.step_mask(below)
            chosen, stuck = batch.choose([[d[j]] for d in drafts])
            assert not stuck and chosen == [d[j] for d in drafts]
        batch.end_drafts()
        t1 = time.perf_counter()
        batch.masks(drafts, T)
        t2 = time.perf_counter()
        for m, w in zip(matchers, walks, strict=True):  # the round's k + 1 tokens, as _emit accepts them
            for tk in w[r * T + 1:(r + 1) * T + 1]:
                assert m.accept(tk)
        t3 = time.perf_counter()
        for key, dt in (("serial_ms", t1 - t0), ("overlapped_ms", t2 - t1), ("emit_ms", t3 - t2)):
            parts[key].append(dt * 1e3)
    return {"rounds": len(parts["serial_ms"])} | {
        k: round(statistics.median(v), 3) if v else float("nan") for k, v in parts.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--vocab", type=int, default=163840)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--fill-threads", type=int, nargs="*", default=[2],
                    help="thread counts for the default_tN modes (RowFiller)")
    ap.add_argument("--grammars", nargs="+", help="these of the grammars only (default: all): "
                    + ", ".join([*GRAMMARS, "kimi_forced", "kimi_strict_auto"]))
    ap.add_argument("--out")
    a = ap.parse_args()
    tok = _SyntheticTokenizer(a.vocab)
    grammars = {**GRAMMARS, **_kimi_tags(tok.markers)}
    unknown = sorted(set(a.grammars or ()) - set(grammars))
    if unknown:
        ap.error(f"--grammars {' '.join(unknown)}: not among {', '.join(grammars)}")
    t0 = time.perf_counter()
    backend = GrammarBackend(tok, a.vocab, [tok.eos_token_id], fill_threads=1)
    threaded = {n: GrammarBackend(tok, a.vocab, [tok.eos_token_id], fill_threads=n) for n in a.fill_threads}
    rows = []
    for name, spec in grammars.items():
        if a.grammars and name not in a.grammars:
            continue
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
            modes = [("ahead", backend, float("inf")), ("default", backend, PREFILL_BELOW_S)] + [
                (f"default_t{n}", be, PREFILL_BELOW_S) for n, be in threaded.items()]
            for mode, be, below in modes:
                rows.append(_rounds(be, spec, walks[:B], a, T, below) | {
                    "grammar": name, "batch": B, "k": a.k, "mode": mode, "compile_s": round(compile_s, 3)})
                r = rows[-1]
                print(f"{name:13s} B={B:3d} k={a.k} {mode:10s}: serial {r['serial_ms']:7.3f} ms, overlapped "
                      f"{r['overlapped_ms']:7.3f} ms, emit {r['emit_ms']:6.3f} ms a round (medians of {r['rounds']})",
                      flush=True)
    write_host_result(a.out, rows, vocab=a.vocab, backend_ready_s=round(time.perf_counter() - t0, 2))


def write_host_result(out: str | None, rows: list[dict], **fields) -> None:
    """A host benchmark's result file (this one's, bench_strict_thinking_host.py's): the command, commit, machine and
    torch threads, ``fields``, the rows; nothing where ``out`` is None."""
    if not out:
        return
    result = {"command": " ".join(["python"] + sys.argv), "git_commit": git_commit(), "machine": platform.processor()
              or platform.machine(), "cpus": torch.get_num_threads(), **fields, "rows": rows}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    print("wrote", out)


if __name__ == "__main__":
    main()
