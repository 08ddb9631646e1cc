"""Output text as SGLang's Engine gives it, on the embedded pair (it has a real tokenizer): stop strings of any
length end a request where plain decoding puts them, the stop string or stop token is cut from the text unless
no_stop_trim, special tokens are decoded on request, and every TP rank stops at the same token."""

from __future__ import annotations

import os
import random
import re

import pytest

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.engine import EMBEDDED_DIR
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import SamplingParams, SamplingParamsError

TARGET = os.path.join(EMBEDDED_DIR, "target")
pytestmark = [pytest.mark.skipif(not os.path.exists(os.path.join(TARGET, "config.json")),
                                 reason="embedded weights not present"),
              pytest.mark.usefixtures("torch_one_thread")]
PROMPTS = ["And God said,", "In the beginning", "The king of Israel"]
GREEDY = {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engines():
    return {"plain": Engine(model_path=TARGET, device="cpu"),
            "eagle3": Engine(device="cpu", speculative_num_steps=3)}  # the embedded pair, EAGLE-3 on


@pytest.fixture(scope="module")
def free_runs(engines):
    return engines["plain"].generate(PROMPTS, GREEDY)


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_long_stop_string(engines, free_runs, kind):
    """A stop string spanning more than 16 tokens (the scheduler decoded only the last 16: it never matched)."""
    eng, rng = engines[kind], random.Random()
    for prompt, free in zip(PROMPTS, free_runs, strict=True):
        ids = free["output_ids"]
        a = rng.randrange(2, 8)
        b = a + rng.randrange(18, 30)
        stop = eng.tokenizer.decode(ids[a:b]).strip()
        assert len(eng.tokenizer.encode(stop)) > 16 and stop in free["text"]
        out = eng.generate(prompt, {**GREEDY, "stop": [stop]})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert out["text"] == free["text"][: free["text"].index(stop)]
        kept = eng.generate(prompt, {**GREEDY, "stop": stop, "no_stop_trim": True})
        end = free["text"].index(stop) + len(stop)
        assert kept["text"].startswith(free["text"][:end]) and free["text"].startswith(kept["text"])


def _naive_stop(tokenizer, ids: list[int], stop: list[str]) -> tuple[int, str] | None:
    """(index of the token that completes the first stop string, that string): the whole output decoded after
    every token (special tokens' text included, as SGLang's stop check decodes), no window."""
    for j in range(len(ids)):
        text = tokenizer.decode(ids[: j + 1], skip_special_tokens=False)
        hit = next((s for s in stop if s in text), None)
        if hit is not None:
            return j, hit
    return None


def test_many_stop_strings_match_as_naive_matching(engines, free_runs):
    """Random stop lists up to max_stop_strings, of strings taken from the output (any length) and strings that
    never occur: the request ends at the token, and with the string, that decoding the whole output after every
    token finds (the scheduler decodes only a window, its size computed once a request)."""
    eng, rng = engines["eagle3"], random.Random(7)
    limit = eng.args.max_stop_strings
    hits = 0
    for trial in range(8):
        prompt, free = rng.choice(list(zip(PROMPTS, free_runs, strict=True)))
        text = free["text"]
        stop = [f"never {i} {rng.random()}" for i in range(rng.randrange(0, limit - 3))]
        for _ in range(rng.randrange(1, 4)):
            a = rng.randrange(len(text) // 4, len(text) - 2)
            stop.insert(rng.randrange(len(stop) + 1), text[a:a + rng.randrange(1, 40)])
        stop = [s for s in dict.fromkeys(stop) if s.strip()][:limit]
        # The last token ends the request by length, whatever it completes (SGLang checks length first).
        want = _naive_stop(eng.tokenizer, free["output_ids"][:-1], stop)
        out = eng.generate(prompt, {**GREEDY, "stop": stop})
        if want is None:
            assert out["output_ids"] == free["output_ids"], trial
            assert out["meta_info"]["finish_reason"]["type"] == "length", trial
            continue
        j, hit = want
        hits += 1
        assert out["output_ids"] == free["output_ids"][: j + 1], trial
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": hit}, trial
    assert hits >= 4, hits  # mostly stopped early: the comparison is not all "never matched"


def test_stop_token_text_is_trimmed(engines, free_runs):
    """As SGLang's detokenizer: the matched stop token stays in output_ids but not in the text."""
    eng = engines["eagle3"]
    for prompt, free in zip(PROMPTS, free_runs, strict=True):
        ids = free["output_ids"]
        j = next(j for j in range(3, len(ids)) if ids[j] not in ids[:j])  # its first occurrence
        out = eng.generate(prompt, {**GREEDY, "stop_token_ids": [ids[j]]})
        assert out["output_ids"] == ids[: j + 1]
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[j]}
        assert out["text"] == eng.tokenizer.decode(ids[:j])
        kept = eng.generate(prompt, {**GREEDY, "stop_token_ids": [ids[j]], "no_stop_trim": True})
        assert kept["text"] == eng.tokenizer.decode(ids[: j + 1])


def _naive_stop_regex(tokenizer, ids: list[int], patterns: list[str]) -> tuple[int, str, int] | None:
    """(index of the first token after which a pattern matches the whole output's text, the pattern, where the
    match starts): every token, no window."""
    for j in range(len(ids)):
        text = tokenizer.decode(ids[: j + 1], skip_special_tokens=False)
        for p in patterns:
            m = next((m for m in re.finditer(p, text) if m.end() > m.start()), None)
            if m is not None:
                return j, p, m.start()
    return None


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_stop_regex_ends_where_a_naive_search_does(engines, free_runs, kind):
    """SGLang's stop_regex: bounded patterns built from words of the output (and ones that never match) end the
    request at the token a search of the whole output after every token finds, the text cut at the match."""
    eng, rng = engines[kind], random.Random(11)
    hits = 0
    for trial in range(6):
        prompt, free = rng.choice(list(zip(PROMPTS, free_runs, strict=True)))
        words = re.findall(r"[A-Za-z]{3,}", free["text"])
        w = rng.choice(words[len(words) // 3:])
        patterns = [r"\d{7}Q", re.escape(w) + r"[ ,.;:]{1,2}[A-Za-z]{2}", rf"{re.escape(w[:2])}[a-z]{{{len(w) - 2}}}"]
        rng.shuffle(patterns)
        want = _naive_stop_regex(eng.tokenizer, free["output_ids"][:-1], patterns)
        out = eng.generate(prompt, {**GREEDY, "stop_regex": patterns})
        if want is None:
            assert out["output_ids"] == free["output_ids"], trial
            continue
        j, pattern, start = want
        hits += 1
        assert out["output_ids"] == free["output_ids"][: j + 1], trial
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}, trial
        full = eng.tokenizer.decode(out["output_ids"])
        assert out["text"] == full[:start], (trial, out["text"], full, start)
        kept = eng.generate(prompt, {**GREEDY, "stop_regex": patterns, "no_stop_trim": True})
        assert kept["text"] == full
    assert hits >= 3, hits


@pytest.mark.parametrize("sp,needle", [
    ({"stop_regex": "a("}, "stop_regex[0]='a(' does not compile"),
    ({"stop_regex": ["x", "(?:)"]}, "stop_regex[1]='(?:)' matches only the empty string"),
    ({"stop_regex": [5]}, "stop_regex[0]=5 must be a string"),
    ({"stop_regex": ["a"] * 129}, "stop_regex=[129 patterns] holds more than max_stop_strings=128"),
    ({"stop_regex": "a" * 300}, "holds a pattern of 300 characters, more than max_stop_str_len=256"),
])
def test_bad_stop_regex_names_the_field(engines, sp, needle):
    with pytest.raises(SamplingParamsError) as e:
        engines["plain"].generate("And", sp)
    assert needle in str(e.value) and len(str(e.value)) < 400, str(e.value)


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_stop_strings_see_special_tokens(engines, kind):
    """As SGLang's stop check (its tail_str decodes with the special tokens): a stop string naming a special token
    ends the request there, though the output text (skip_special_tokens) leaves it out. The eos is forced at every
    position (logit_bias) and not a stop token itself (ignore_eos)."""
    eng = engines[kind]
    tok = eng.tokenizer
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True, "logit_bias": {str(tok.eos_token_id): 100}}
    free = eng.generate("And God said,", sp)
    assert free["output_ids"] == [tok.eos_token_id] * 8 and free["meta_info"]["finish_reason"]["type"] == "length"
    for skip in (True, False):
        out = eng.generate("And God said,", {**sp, "stop": [tok.eos_token * 2], "skip_special_tokens": skip})
        assert out["output_ids"] == [tok.eos_token_id] * 2, out
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok.eos_token * 2}
        assert out["text"] == "", out["text"]  # trimmed at the match, or (skip_special_tokens) never shown
    kept = eng.generate("And God said,", {**sp, "stop": [tok.eos_token * 2], "skip_special_tokens": False,
                                          "no_stop_trim": True})
    assert kept["text"] == tok.eos_token * 2


def test_skip_special_tokens(engines):
    eng = engines["plain"]
    tok = eng.tokenizer
    ids = tok.encode("In the beginning")
    r = Request(rid="x", input_ids=[1], params=SamplingParams(max_new_tokens=8, skip_special_tokens=False))
    r.output_ids = [*ids, tok.eos_token_id]
    r.finished_reason = {"type": "length", "length": 8}
    assert eng.output_text(r) == tok.decode(ids) + tok.eos_token
    r.params = SamplingParams(max_new_tokens=8)
    assert eng.output_text(r) == tok.decode(ids)


def test_tokenizer_path_without_a_tokenizer_fails_first(tmp_path, monkeypatch):
    from sglang_eagle3.models import loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: pytest.fail("weights loaded first"))
    with pytest.raises(ConfigError, match=f"tokenizer_path='{tmp_path}' holds no tokenizer"):
        Engine(model_path=TARGET, tokenizer_path=str(tmp_path), device="cpu")


def test_tp_ranks_stop_at_stop_strings(free_runs):
    """Every TP rank runs the scheduler and decodes for stop strings itself (they were ignored under TP)."""
    free = free_runs[0]
    stop = free["text"].split()[4]
    with Engine(model_path=TARGET, device="cpu", tp_size=2) as tp:
        out = tp.generate(PROMPTS[0], {**GREEDY, "stop": stop})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == free["text"][: free["text"].index(stop)]


@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_min_new_tokens_holds_back_stop_strings(engines, free_runs, kind):
    """A stop string met before min_new_tokens tokens does not end the request (SGLang's penalizer holds back only
    stop tokens; a request asking for at least N tokens gets them, as vLLM's min_tokens); met after, it does; and
    with penalties the EAGLE-3 output is the plain one."""
    eng = engines[kind]
    free = free_runs[0]
    stop = eng.tokenizer.decode(free["output_ids"][1:3]).strip()
    first = free["text"].index(stop)
    early = eng.generate(PROMPTS[0], {**GREEDY, "stop": [stop]})
    assert early["text"] == free["text"][:first]
    n = len(early["output_ids"]) + 6
    held = eng.generate(PROMPTS[0], {**GREEDY, "stop": [stop], "min_new_tokens": n})
    assert len(held["output_ids"]) >= n, (n, held["output_ids"])
    assert held["output_ids"][:n] == free["output_ids"][:n]  # greedy, no penalty: the same tokens meanwhile
    pen = {**GREEDY, "frequency_penalty": 0.8, "repetition_penalty": 1.3, "temperature": 0.8, "seed": 4}
    want = engines["plain"].generate(PROMPTS, pen)
    assert [o["output_ids"] for o in eng.generate(PROMPTS, pen)] == [o["output_ids"] for o in want]
