"""Audit of /metrics, OpenAI logprobs and the reasoning split, against definitions written here.

- Reasoning with logprobs, streamed: the reasoning's tokens go out with the reasoning's chunks (docs/SERVER.md,
  "Reasoning": "the reasoning's streamed with the reasoning's chunks"), never with a content chunk; the chunks'
  lists concatenate to the non-streamed list. End to end through the scripted tiny model, and at the unit level
  over hand-made vocabularies whose tokens straddle the markers (the rule: a token belongs to the part its text
  starts in, so one holding the end marker's tail and the answer's head goes with the reasoning, as SGLang, which
  attaches a step's logprobs to the first chunk of that step, the reasoning's, sends it).
- /generate's ``return_text_in_logprobs`` (SGLang's): every logprob row's text against the tokenizer's own decode of
  its id (special tokens kept), streamed and not, in a batch; without it the rows keep null.
- /metrics: Prometheus' histogram definition (bucket ``le=x`` counts the observations <= x, ``+Inf`` all of them)
  over the engine's per-round tally, for accept lengths past ``--speculative-num-steps`` + 1 (adaptive candidates);
  SGLang's ``sglang:token_usage`` / ``sglang:num_used_tokens`` gauges from the pool's pages.
"""

from __future__ import annotations

import pytest

from sglang_eagle3.server.metrics import ServerMetrics

from .test_reasoning import END, THINK, THOUGHT
from .test_tools import ask, scripted_app


@pytest.fixture(scope="module")
def thinking(tiny_model, tmp_path_factory, torch_one_thread):
    yield from scripted_app(tiny_model, str(tmp_path_factory.mktemp("audit_thinking")), (THINK, END),
                            reasoning_parser="kimi_k2")


@pytest.mark.parametrize("stream_reasoning", [False, True])
def test_reasoning_logprobs_go_with_the_reasoning_chunks(thinking, stream_reasoning):
    script = THINK + THOUGHT + END + "Sunny."
    n = len(thinking.tokenizer.encode(script))
    whole, chunks = ask(thinking, script, {"max_tokens": n, "temperature": 0, "logprobs": True, "top_logprobs": 1,
                                           "stream_reasoning": stream_reasoning})
    msg = whole["choices"][0]["message"]
    assert (msg["reasoning_content"], msg["content"]) == (THOUGHT, "Sunny.")
    wanted = [t["token"] for t in whole["choices"][0]["logprobs"]["content"]]
    assert len(wanted) == n
    choices = [c["choices"][0] for c in chunks]
    streamed = [t["token"] for c in choices for t in ((c.get("logprobs") or {}).get("content") or [])]
    assert streamed == wanted
    # The thinking's tokens (the start marker and the thought, written before any content) come with chunks that
    # carry reasoning, never with a chunk whose delta is an empty content string.
    thought_tokens = len(thinking.tokenizer.encode(THINK + THOUGHT))
    seen = 0
    for c in choices:
        entries = (c.get("logprobs") or {}).get("content") or []
        if entries and seen < thought_tokens:
            assert c["delta"].get("reasoning_content"), (c, seen)
        seen += len(entries)
    if not stream_reasoning:
        assert [c["delta"]["reasoning_content"] for c in choices if c["delta"].get("reasoning_content")] == [THOUGHT]


class _Vocab:
    """A tokenizer over hand-made token strings (what TokenTable reads): id i is ``words[i]``, no specials."""

    def __init__(self, words: list[str]):
        self.words = words

    def token_bytes(self, i: int) -> bytes:
        return self.words[i].encode()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.words[i] for i in ids)


def _expected_parts(fmt, words: list[str]) -> list[str]:
    """The rule, written over the whole text: the reasoning spans from its start marker (the text's start for a
    format that starts inside) through its end marker; a token is the part its text starts in."""
    text = "".join(words)
    lo = 0 if fmt.forced else text.find(fmt.start)
    if lo < 0:
        return ["content"] * len(words)
    opened = text.find(fmt.start, lo)
    body = opened + len(fmt.start) if opened >= 0 and not text[lo:opened].strip() else lo
    close = text.find(fmt.end, body)
    hi = close + len(fmt.end) if close >= 0 else len(text) + 1
    out, at = [], 0
    for w in words:
        out.append("reasoning" if lo <= at < hi else "content")
        at += len(w)
    return out


def _stream(fmt, words: list[str], cuts: list[int], stream_reasoning: bool) -> list[dict]:
    """_chat_chunks' choices for an output of ``words`` arriving in updates that end at ``cuts``."""
    import asyncio
    import json

    from sglang_eagle3.server.driver import Update
    from sglang_eagle3.server.logprobs import TokenTable
    from sglang_eagle3.server.openai_api import _chat_chunks, _sse_events

    class Sub:
        requests = [None]

        async def updates(self):
            prev = 0
            for cut in cuts:
                ids = list(range(prev, cut))
                done = cut == len(words)
                yield Update(0, ids, "".join(words[:cut]), done,
                             result={"meta_info": {"finish_reason": {"type": "length"}}} if done else None,
                             new_logprobs=[[-0.5 - i, i, None] for i in ids], new_top_logprobs=None)
                prev = cut

    async def go():
        return [e async for e in _sse_events(_chat_chunks(Sub(), TokenTable(_Vocab(words)), "c", 0, "m", 1, None,
                                                          thinking=fmt, stream_reasoning=stream_reasoning))]

    events = [e[len(b"data: "):].strip() for e in asyncio.run(go())]
    assert events[-1] == b"[DONE]"
    return [json.loads(e)["choices"][0] for e in events[:-1]]


STRADDLING = [  # (parser, tokens): markers cut across tokens, the answer's text sharing a token with them
    ("kimi_k2", ["<think>", "Let", " me", " see", ".", "</th", "ink>\n\nSun", "ny."]),
    ("kimi_k2", ["Hi <th", "ink>x", " y", "</think>ok", "!"]),
    ("kimi_k2", ["Hi ", "<thi", "nk>", "a b", " ", "</think>", "\n", "ok"]),
    ("qwen3", ["<think>", "</think>", "\n\n", "fast"]),
    ("deepseek-r1", ["plain", " thoughts", "</thin", "k>answer", " here"]),
    ("kimi", ["◁think▷hm", "◁/", "think▷o", "k"]),
    ("kimi_k2", ["<think>", "cut", " short"]),
]


@pytest.mark.parametrize("stream_reasoning", [False, True])
@pytest.mark.parametrize("parser,words", STRADDLING)
def test_reasoning_logprobs_split_by_token_at_the_boundary(parser, words, stream_reasoning):
    """Every way the tokens can arrive in updates: each token's entry comes with a chunk of its own part (reasoning
    or content, _expected_parts' rule), the entries in output order (the non-streamed list), the text as the whole
    answer splits it; stream_reasoning off: one reasoning chunk, holding every reasoning token."""
    import itertools

    from sglang_eagle3.server.reasoning import REASONING_FORMATS, ReasoningSplitter

    fmt = REASONING_FORMATS[parser]
    want_parts = _expected_parts(fmt, words)
    reasoning, content = ReasoningSplitter(fmt).split("".join(words))
    n = len(words)
    for mask in itertools.product((False, True), repeat=n - 1):
        cuts = [i + 1 for i, c in enumerate(mask) if c] + [n]
        choices = _stream(fmt, words, cuts, stream_reasoning)
        got, parts = [], []
        for c in choices:
            entries = (c["logprobs"] or {}).get("content") or []
            if entries:
                assert len(c["delta"]) == 1, c  # (one part a chunk)
                parts += ["reasoning" if "reasoning_content" in c["delta"] else "content"] * len(entries)
            got += [(e["token"], e["logprob"]) for e in entries]
        assert got == [(w, -0.5 - i) for i, w in enumerate(words)], (cuts, got)
        assert parts == want_parts, (cuts, parts, want_parts)
        assert "".join(c["delta"].get("reasoning_content") or "" for c in choices) == (reasoning or "")
        assert "".join(c["delta"].get("content") or "" for c in choices) == content
        if not stream_reasoning:
            assert sum("reasoning_content" in c["delta"] for c in choices) == (0 if reasoning is None else 1), cuts


# -- /generate: return_text_in_logprobs ---------------------------------------------------------------------------

def _generate(app, body: dict) -> list[dict]:
    """/generate's answer (one element) and a stream's chunks (the rest), in process."""
    import asyncio
    import json

    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.post("/generate", json=body), await c.post("/generate", json={**body, "stream": True})

    whole, streamed = asyncio.run(go())
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    events = [line[len("data: "):] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [whole.json()] + [json.loads(e) for e in events[:-1]]


def _check_rows_text(tok, meta: dict, with_text: bool) -> int:
    """Every logprob row of meta_info (token lists and each position's top list): [logprob, id, text] with text
    the tokenizer's own decode of that id alone, special tokens kept (SGLang's batch_decode of the ids), or null
    without return_text_in_logprobs. Returns how many rows it checked."""
    rows = meta["input_token_logprobs"] + meta["output_token_logprobs"]
    rows += [r for key in ("input_top_logprobs", "output_top_logprobs") for top in meta[key] if top for r in top]
    for v, i, text in rows:
        assert text == (tok.decode([i], skip_special_tokens=False) if with_text else None), (v, i, text)
    return len(rows)


def test_generate_returns_text_in_logprobs(thinking):
    """SGLang's return_text_in_logprobs: the third element of every logprob row is the token's text (it was left
    null, the field dropped without a word). Scripted output with special tokens (kept in the rows' text, skipped
    in the answer's text), streamed and not, a batch too; without the field the rows stay [logprob, id, null]."""
    tok = thinking.tokenizer
    script = THINK + "Pack my box" + END + "Sphinx"
    n = len(tok.encode(script))
    prompt = tok.encode("How vexingly quick")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}, "return_logprob": True,
            "logprob_start_len": 0, "top_logprobs_num": 3}
    thinking.script = script
    try:
        answers = _generate(thinking.app, {**body, "return_text_in_logprobs": True})
        plain = _generate(thinking.app, body)[0]
        batch = _generate(thinking.app, {**body, "input_ids": [prompt, prompt[:2]], "return_logprob": [True, False],
                                         "return_text_in_logprobs": True})
    finally:
        thinking.script = None
    whole = answers[0]
    assert whole["output_ids"] == tok.encode(script), whole
    assert any(i in tok.special_ids for i in whole["output_ids"])
    assert whole["text"] == tok.decode(whole["output_ids"])  # (the answer's text skips them)
    meta = whole["meta_info"]
    assert len(meta["input_token_logprobs"]) == len(prompt) and len(meta["output_token_logprobs"]) == n
    # (a row a token and 3 in its top list, but for the prompt's first token, which nothing predicts: no top list)
    assert _check_rows_text(tok, meta, True) == (len(prompt) + n) * 4 - 3
    for chunk in answers[1:]:
        _check_rows_text(tok, chunk["meta_info"], True)
    assert answers[-1]["meta_info"]["output_token_logprobs"] == whole["meta_info"]["output_token_logprobs"]
    assert _check_rows_text(tok, plain["meta_info"], False) > 0
    first, second = batch[0]
    assert _check_rows_text(tok, first["meta_info"], True) > 0 and "output_token_logprobs" not in second["meta_info"]


# -- /metrics ----------------------------------------------------------------------------------------------------

def _samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _value(samples: dict[str, float], name: str) -> float:
    """The one series of metric ``name`` whatever its labels (SGLang's model_name, ... on SGLang's metrics)."""
    found = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    assert len(found) == 1, (name, found)
    return found[0]


def _info(**more) -> dict:
    return {"running_requests": 0, "waiting_requests": 0, "kv_pages_free": 10, "kv_pages_total": 10,
            "page_size": 64, **more}


def test_accept_length_histogram_covers_every_draft_length():
    """Launch sizes the buckets for --speculative-num-steps (k = 3: 1..4); the adaptive policy may run its larger
    candidates (k + 2 = 5: up to 6 tokens a round). Every observed length gets its own bucket, so that
    histogram_quantile reads them, and the counts follow Prometheus' cumulative definition."""
    m = ServerMetrics(max_accept_length=4)
    tally = {1: 3, 2: 1, 4: 2, 6: 5}
    m.update_from_info(_info(accept_length_hist=tally, accepted_tokens=sum(k * v for k, v in tally.items()),
                             verify_forwards=sum(tally.values()),
                             adaptive={"candidates": [0, 1, 3, 5], "switches": 2}), inflight=0)
    s = _samples(m.render())
    name = "sglang:spec_accept_length_per_round"
    buckets = {float(k.split('le="')[1].rstrip('"}')): v for k, v in s.items() if k.startswith(name + "_bucket")}
    for le in (1, 2, 3, 4, 5, 6):
        assert buckets[le] == sum(v for x, v in tally.items() if x <= le), (le, buckets)
    assert buckets[float("inf")] == s[name + "_count"] == sum(tally.values())
    assert s[name + "_sum"] == sum(k * v for k, v in tally.items())
    # A later scrape keeps the same buckets (no series disappears) and moves the counts.
    m.update_from_info(_info(accept_length_hist={1: 4, 2: 1, 4: 2, 6: 5}, accepted_tokens=37, verify_forwards=12,
                             adaptive={"candidates": [0, 1, 3, 5]}), inflight=0)
    again = _samples(m.render())
    assert {k for k in again if k.startswith(name + "_bucket")} == {k for k in s if k.startswith(name + "_bucket")}
    assert again[name + '_bucket{le="1"}'] == 4


def test_token_usage_gauges_as_sglang_names_them():
    """SGLang's sglang:token_usage (the KV pool's used fraction) and sglang:num_used_tokens, which routers and
    dashboards written for SGLang read: here from the pool's pages (used = total - free) and the page size."""
    m = ServerMetrics()
    m.update_from_info(_info(kv_pages_free=10, kv_pages_total=10), inflight=0)
    s = _samples(m.render())
    assert _value(s, "sglang:token_usage") == 0 and _value(s, "sglang:num_used_tokens") == 0
    m.update_from_info(_info(kv_pages_free=3, kv_pages_total=12, page_size=64), inflight=2)
    s = _samples(m.render())
    assert _value(s, "sglang:token_usage") == pytest.approx(9 / 12)
    assert _value(s, "sglang:num_used_tokens") == 9 * 64
    m.update_from_info(_info(kv_pages_free=0, kv_pages_total=0), inflight=0)  # (no pool: nothing used)
    assert _value(_samples(m.render()), "sglang:token_usage") == 0


def test_token_usage_on_a_live_app(thinking):
    """The same gauges through /metrics of a running app, next to /get_server_info's pool: idle, nothing used."""
    import asyncio

    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=thinking.app), base_url="http://t",
                                     timeout=60) as c:
            return (await c.get("/metrics")).text, (await c.get("/get_server_info")).json()

    text, info = asyncio.run(go())
    s = _samples(text)
    used = info["kv_pages_total"] - info["kv_pages_free"]
    assert info["kv_pages_total"] > 0 and info["page_size"] > 0
    assert _value(s, "sglang:token_usage") == used / info["kv_pages_total"] == 0
    assert _value(s, "sglang:num_used_tokens") == used * info["page_size"]
