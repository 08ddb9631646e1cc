"""Structured output (json_schema / regex / ebnf, OpenAI's response_format) through the live server (tiny random
EAGLE-3 pair, speculation on).

Checked against: Python's ``regex`` (full matching of a finished output, partial matching of one cut by
max_tokens) with a pattern written here for each grammar, ``json.loads``, and /generate's own output for the
same prompt ids and parameters (the OpenAI endpoints, streams, n and a concurrent batch must equal it). The tiny
model has no eos: a grammar's output ends (finish_reason "stop") at the first token where the grammar is
complete. Outputs are read from their tokens (the tokenizer's decode of output_ids, or the chat logprobs'
bytes); test_finished_grammar_text_keeps_its_last_token checks the text itself.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import regex

from sglang_eagle3.tokenizer import load_tokenizer

from .conftest import running_server

pytest.importorskip("xgrammar")

MODEL = "tiny"
CHAT = [{"role": "user", "content": "Name a quick fox."}]
PROMPTS = ["The quick", "Pack my box", "How vexingly", "Sphinx of black"]
WS = r"[ \t\n\r]*"  # JSON's whitespace
INT = r"-?(0|[1-9][0-9]*)"

# Each grammar with a pattern for Python's regex module accepting (at least) its language.
REGEX_WORDS = r"[a-z]{1,6}( [a-z]{1,6}){0,3}\."
REGEX_ANSWER = r"(yes|no|maybe)[.!]{1,3}"
REGEX_SYLLABLES = r"(ju|mp|ck){15}"  # tokens the tiny draft proposes: some rounds accept drafts under the mask
EBNF_ANIMAL = ('root ::= animal (" " verb)? "!"\nanimal ::= "fox" | "dog" | "zebra"\n'
               'verb ::= "jumps" | "runs" | "sleeps"')
EBNF_ANIMAL_RE = r"(fox|dog|zebra)( (jumps|runs|sleeps))?!"
EBNF_LISTS = 'root ::= "[" (item ("," item)*)? "]"\nitem ::= [0-9] | root'  # nested lists: not regular
EBNF_LISTS_RE = r"(?<l>\[((?:[0-9]|(?&l))(,(?:[0-9]|(?&l)))*)?\])"
SCHEMA_FLAG = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
               "additionalProperties": False}
SCHEMA_FLAG_RE = rf'\{{{WS}"a"{WS}:{WS}(true|false){WS}\}}'
SCHEMA_INTS = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}
SCHEMA_INTS_RE = rf"\[{WS}({INT}({WS},{WS}{INT})?)?{WS}\]"
SCHEMA_ENUM = {"enum": ["fox", "dog", "box"]}
SCHEMA_ENUM_RE = r'"(fox|dog|box)"'
# A structural tag (xgrammar's shape, as SGLang's response_format takes it): a fixed text, then a tagged JSON value.
TAG_FLAG = {"type": "structural_tag", "format": {"type": "sequence", "elements": [
    {"type": "const_string", "value": "fox: "},
    {"type": "tag", "begin": "<a>", "content": {"type": "json_schema", "json_schema": SCHEMA_FLAG}, "end": "</a>"}]}}
TAG_FLAG_RE = rf"fox: <a>{SCHEMA_FLAG_RE}</a>"

# (id, sampling params of /generate, pattern, the JSON schema the output must satisfy when finished)
GRAMMARS = [
    ("regex-words", {"regex": REGEX_WORDS}, REGEX_WORDS, None),
    ("regex-answer", {"regex": REGEX_ANSWER}, REGEX_ANSWER, None),
    ("regex-syllables", {"regex": REGEX_SYLLABLES}, REGEX_SYLLABLES, None),
    ("ebnf-animal", {"ebnf": EBNF_ANIMAL}, EBNF_ANIMAL_RE, None),
    ("ebnf-lists", {"ebnf": EBNF_LISTS}, EBNF_LISTS_RE, None),
    ("json-flag", {"json_schema": json.dumps(SCHEMA_FLAG)}, SCHEMA_FLAG_RE, SCHEMA_FLAG),
    ("json-ints", {"json_schema": json.dumps(SCHEMA_INTS)}, SCHEMA_INTS_RE, SCHEMA_INTS),
    ("json-enum", {"json_schema": json.dumps(SCHEMA_ENUM)}, SCHEMA_ENUM_RE, SCHEMA_ENUM),
    ("structural_tag", {"structural_tag": json.dumps(TAG_FLAG)}, TAG_FLAG_RE, None),
]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return load_tokenizer(tiny_model.target)


def _post(url: str, path: str, body: dict):
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _error(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    return r.json()["error"]


def _stream(url: str, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        events = [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def _satisfies(value, schema: dict) -> bool:
    """The few schema keywords the tests use, checked by hand."""
    if "enum" in schema:
        return value in schema["enum"]
    if schema["type"] == "boolean":
        return isinstance(value, bool)
    if schema["type"] == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if schema["type"] == "array":
        return (isinstance(value, list) and len(value) <= schema.get("maxItems", len(value))
                and all(_satisfies(v, schema["items"]) for v in value))
    props = schema["properties"]
    return (isinstance(value, dict) and set(schema["required"]) <= set(value) <= set(props)
            and all(_satisfies(v, props[k]) for k, v in value.items()))


def check_output(tok, ids: list[int], reason: str, max_new: int, pattern: str | None, schema=None) -> None:
    """A grammar's output (its tokens' text): finished -> complete, and complete at no earlier token (the tiny
    model has no eos: the grammar ends it where it first may); cut by max_tokens -> a prefix of a match."""
    text = tok.decode(ids)
    if reason == "stop":
        if pattern is not None:
            assert regex.fullmatch(pattern, text), (text, pattern)
            assert not any(regex.fullmatch(pattern, tok.decode(ids[:k])) for k in range(1, len(ids))), text
        if schema is not None:
            assert _satisfies(json.loads(text), schema), text
    else:
        assert reason == "length" and len(ids) == max_new, (reason, len(ids))
        if pattern is not None:
            assert regex.fullmatch(pattern, text, partial=True), (text, pattern)


def _generate(url: str, body: dict) -> list[dict]:
    out = _post(url, "/generate", body)
    return out if isinstance(out, list) else [out]


# -- /generate ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("sp,pattern,schema", [g[1:] for g in GRAMMARS], ids=[g[0] for g in GRAMMARS])
def test_generate_output_follows_the_grammar(server, tok, sp, pattern, schema):
    """Greedy and sampled, up to 32 tokens (most finish) and 4 (most are cut): every output is in the grammar."""
    samplings = [{"max_new_tokens": 32, "temperature": 0}, {"max_new_tokens": 4, "temperature": 0},
                 {"max_new_tokens": 32, "temperature": 1.0, "seed": 7}]
    prompts = [p for p in PROMPTS for _ in samplings]
    params = [{**sp, **s} for _ in PROMPTS for s in samplings]
    outs = _generate(server.url, {"text": prompts, "sampling_params": params})
    assert len(outs) == len(prompts)
    reasons = []
    for out, p in zip(outs, params, strict=True):
        meta = out["meta_info"]
        reasons.append(meta["finish_reason"]["type"])
        assert meta["completion_tokens"] == len(out["output_ids"])
        check_output(tok, out["output_ids"], reasons[-1], p["max_new_tokens"], pattern, schema)
    assert "stop" in reasons  # the finished branch is exercised for every grammar
    if sp.get("regex") == REGEX_SYLLABLES:  # drafts accepted: verify rows past the first were masked and taken
        assert any(o["meta_info"]["spec_verify_ct"] < o["meta_info"]["completion_tokens"] - 1 for o in outs)


def test_json_object_any_value(server, tok):
    """SGLang's "$$ANY$$": any JSON value; a finished output parses."""
    outs = _generate(server.url, {"text": PROMPTS, "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                        "json_schema": "$$ANY$$"}})
    reasons = [o["meta_info"]["finish_reason"]["type"] for o in outs]
    assert "stop" in reasons
    for o, reason in zip(outs, reasons, strict=True):
        if reason == "stop":
            json.loads(tok.decode(o["output_ids"]))


def test_finished_grammar_text_keeps_its_last_token(server, tok):
    out = _generate(server.url, {"text": "The quick", "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                                                           "regex": REGEX_ANSWER}})[0]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert regex.fullmatch(REGEX_ANSWER, out["text"]), out
    # (a schema this model completes within the limit: its json_object output does not)
    fmt = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "boolean"}}}
    res = _post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 24,
                                                     "temperature": 0, "response_format": fmt})
    assert res["choices"][0]["finish_reason"] == "stop", res["choices"][0]["message"]
    assert res["choices"][0]["matched_stop"] is None
    assert isinstance(json.loads(res["choices"][0]["message"]["content"]), bool), res["choices"][0]["message"]


def test_grammar_complete_before_any_token_is_no_abort(server, tok):
    r = httpx.post(server.url + "/generate", json={"text": "a", "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "regex": "a*"}}, timeout=60)
    if r.status_code == 400:  # refused up front, naming the field: a fix too
        assert r.json()["error"]["param"] == "regex", r.text
        return
    out = r.json()
    reason = out["meta_info"]["finish_reason"]["type"]
    assert reason in ("stop", "length"), out
    check_output(tok, out["output_ids"], reason, 4, "a*")


# -- the OpenAI endpoints -------------------------------------------------------------------------------------------

# (id, the OpenAI fields, the /generate sampling params they mean, pattern, schema)
OPENAI_FORMS = [
    ("regex", {"regex": REGEX_WORDS}, {"regex": REGEX_WORDS}, REGEX_WORDS, None),
    ("ebnf", {"ebnf": EBNF_ANIMAL}, {"ebnf": EBNF_ANIMAL}, EBNF_ANIMAL_RE, None),
    ("json_schema", {"json_schema": json.dumps(SCHEMA_INTS)}, {"json_schema": json.dumps(SCHEMA_INTS)},
     SCHEMA_INTS_RE, SCHEMA_INTS),
    ("response_format-json_object", {"response_format": {"type": "json_object"}},
     {"json_schema": '{"type": "object"}'}, None, None),
    ("response_format-json_schema",
     {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_FLAG}}},
     {"json_schema": json.dumps(SCHEMA_FLAG)}, SCHEMA_FLAG_RE, SCHEMA_FLAG),
    ("response_format-text-and-regex", {"response_format": {"type": "text"}, "regex": REGEX_ANSWER},
     {"regex": REGEX_ANSWER}, REGEX_ANSWER, None),
    ("response_format-structural_tag", {"response_format": TAG_FLAG}, {"structural_tag": json.dumps(TAG_FLAG)},
     TAG_FLAG_RE, None),
]


def _finished(tok, out: dict, pattern, schema, max_new: int) -> None:
    reason = out["meta_info"]["finish_reason"]["type"]
    check_output(tok, out["output_ids"], reason, max_new, pattern, schema)
    if reason == "stop" and pattern is None:
        json.loads(tok.decode(out["output_ids"]))


@pytest.mark.parametrize("fields,sp,pattern,schema", [f[1:] for f in OPENAI_FORMS], ids=[f[0] for f in OPENAI_FORMS])
def test_openai_endpoints_equal_generate(server, tok, fields, sp, pattern, schema):
    greedy = {"max_tokens": 24, "temperature": 0}
    gsp = {"max_new_tokens": 24, "temperature": 0, **sp}
    chat_ids = tok.encode_chat(CHAT)
    prompt_ids = tok.encode(PROMPTS[1])
    want_chat, want_cmpl = _generate(server.url, {"input_ids": [chat_ids, prompt_ids], "sampling_params": gsp})
    for out in (want_chat, want_cmpl):
        _finished(tok, out, pattern, schema, 24)
    # The unconstrained output differs: the grammar did something (so equality below means it was passed on).
    plain = _generate(server.url, {"input_ids": chat_ids, "sampling_params": {"max_new_tokens": 24,
                                                                              "temperature": 0}})[0]
    assert plain["output_ids"] != want_chat["output_ids"]

    chat = _post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, **greedy, **fields})
    cmpl = _post(server.url, "/v1/completions", {"model": MODEL, "prompt": prompt_ids, **greedy, **fields})
    for res, want, text in ((chat, want_chat, chat["choices"][0]["message"]["content"]),
                            (cmpl, want_cmpl, cmpl["choices"][0]["text"])):
        assert text == want["text"]
        assert res["choices"][0]["finish_reason"] == want["meta_info"]["finish_reason"]["type"]
        assert res["usage"]["completion_tokens"] == len(want["output_ids"])
    # Chat's logprobs name every output token: their bytes are the whole output (decoded by the tokenizer).
    lp = _post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, **greedy, **fields,
                                                    "logprobs": True})["choices"][0]["logprobs"]["content"]
    assert b"".join(bytes(c["bytes"]) for c in lp).decode() == tok.decode(want_chat["output_ids"])


@pytest.mark.parametrize("fields", [{"regex": REGEX_WORDS}, {"response_format": {"type": "json_object"}}],
                         ids=["regex", "json_object"])
def test_streamed_chunks_join_to_the_unstreamed_text(server, tok, fields):
    """Finished and cut by max_tokens: the chunks' text joins to the unstreamed text."""
    reasons = set()
    for max_tokens in (32, 3):
        for path, body, text_of in (
                ("/v1/completions", {"model": MODEL, "prompt": PROMPTS[0]}, lambda c: c.get("text")),
                ("/v1/chat/completions", {"model": MODEL, "messages": CHAT}, lambda c: c["delta"].get("content"))):
            body = {**body, **fields, "max_tokens": max_tokens, "temperature": 0}
            full = _post(server.url, path, body)["choices"][0]
            chunks = [c["choices"][0] for c in _stream(server.url, path, body) if c["choices"]]
            assert "".join(text_of(c) or "" for c in chunks) == full.get("text", (full.get("message") or {}).get(
                "content")), (path, body)
            assert chunks[-1]["finish_reason"] == full["finish_reason"], (path, body)
            reasons.add(full["finish_reason"])
    assert reasons == {"stop", "length"}


def test_generate_stream_ends_with_the_unstreamed_result(server, tok):
    """/generate's stream: every chunk is the output so far; the last is the unstreamed result."""
    body = {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 32, "temperature": 0, "ebnf": EBNF_LISTS}}
    full = _post(server.url, "/generate", body)
    chunks = _stream(server.url, "/generate", body)
    assert chunks[-1]["output_ids"] == full["output_ids"] and chunks[-1]["text"] == full["text"]
    assert all(full["output_ids"][:len(c["output_ids"])] == c["output_ids"] for c in chunks)
    check_output(tok, full["output_ids"], full["meta_info"]["finish_reason"]["type"], 32, EBNF_LISTS_RE)


@pytest.mark.parametrize("fields,sp,pattern,schema", [
    ({"regex": REGEX_WORDS}, {"regex": REGEX_WORDS}, REGEX_WORDS, None),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_INTS}}},
     {"json_schema": json.dumps(SCHEMA_INTS)}, SCHEMA_INTS_RE, SCHEMA_INTS)], ids=["regex", "response_format"])
def test_n_seeded_samples_are_each_valid(server, tok, fields, sp, pattern, schema):
    """n=2 with a seed: both choices follow the grammar; each equals /generate's sample of the same seed rule."""
    ids = tok.encode(PROMPTS[2])
    sampled = {"temperature": 1.0, "seed": 11}
    outs = _generate(server.url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 24, "n": 2, **sampled,
                                                                        **sp}})
    assert len(outs) == 2
    for o in outs:
        check_output(tok, o["output_ids"], o["meta_info"]["finish_reason"]["type"], 24, pattern, schema)
    res = _post(server.url, "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 24, "n": 2, **sampled,
                                                **fields})
    assert [c["text"] for c in res["choices"]] == [o["text"] for o in outs]
    assert [c["finish_reason"] for c in res["choices"]] == [o["meta_info"]["finish_reason"]["type"] for o in outs]
    chat = _post(server.url, "/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 24, "n": 2,
                                                      "logprobs": True, **sampled, **fields})
    for c in chat["choices"]:
        text = b"".join(bytes(t["bytes"]) for t in c["logprobs"]["content"]).decode()
        if c["finish_reason"] == "stop":
            assert regex.fullmatch(pattern, text), text
            if schema is not None:
                assert _satisfies(json.loads(text), schema)
        else:
            assert regex.fullmatch(pattern, text, partial=True), text


# -- errors -----------------------------------------------------------------------------------------------------------

_CMPL = {"model": MODEL, "prompt": "a", "max_tokens": 4}
_CHAT = {"model": MODEL, "messages": CHAT, "max_tokens": 4}
_BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "nonsense"}}}
_LONG = "x" * 5000 + "("
BAD = [
    # (id, path, body, param, words the message must hold)
    ("generate-regex", "/generate", {"text": "a", "sampling_params": {"regex": "(ab"}}, "regex", ["'(ab'"]),
    ("cmpl-regex", "/v1/completions", {**_CMPL, "regex": "[a-"}, "regex", ["'[a-'", "does not compile"]),
    ("chat-regex-long", "/v1/chat/completions", {**_CHAT, "regex": _LONG}, "regex", ["xxxxx", "does not compile"]),
    ("chat-ebnf", "/v1/chat/completions", {**_CHAT, "ebnf": "root ::= foo"}, "ebnf", ["root ::= foo"]),
    ("cmpl-json_schema", "/v1/completions", {**_CMPL, "json_schema": "{not json"}, "json_schema", ["{not json"]),
    ("generate-json_schema-object", "/generate", {"text": "a", "sampling_params": {"json_schema": {"type": "object"}}},
     "json_schema", ["'type': 'object'", "string"]),
    ("generate-regex-int", "/generate", {"text": "a", "sampling_params": {"regex": 5}}, "regex", ["regex=5"]),
    ("cmpl-json_schema-object", "/v1/completions", {**_CMPL, "json_schema": {"type": "object"}}, "json_schema",
     ["'type': 'object'"]),
    ("chat-response_format-bad-schema", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": _BAD_SCHEMA}}},
     "response_format", ["nonsense"]),
    ("cmpl-response_format-bad-ref", "/v1/completions",
     {**_CMPL, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
         "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format", ["nowhere"]),
    ("chat-response_format-false", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": False}}},
     "response_format", ["false"]),
    ("chat-response_format-structural_tag-empty", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "structural_tag"}}, "response_format", ["neither structures", "format"]),
    ("cmpl-response_format-structural_tag-unenforced", "/v1/completions",
     {**_CMPL, "response_format": {"type": "structural_tag", "triggers": ["<a"], "structures": [
         {"begin": "<a>", "schema": {"type": "object", "properties": {"a": {"not": {}}}}, "end": "</a>"}]}},
     "response_format", ["structures[0].schema", "not would be ignored"]),
    ("generate-structural_tag-bad-format", "/generate",
     {"text": "a", "sampling_params": {"structural_tag": json.dumps({"format": {"type": "nope"}})}},
     "structural_tag", ["does not compile", "nope"]),
    ("chat-structural_tag-and-regex", "/v1/chat/completions", {**_CHAT, "regex": "a+", "response_format": TAG_FLAG},
     "response_format", ["regex", "response_format"]),
    ("cmpl-response_format-xml", "/v1/completions", {**_CMPL, "response_format": {"type": "xml"}},
     "response_format.type", ["xml"]),
    ("chat-response_format-string", "/v1/chat/completions", {**_CHAT, "response_format": "json_object"},
     "response_format", ["json_object"]),
    ("chat-json_schema-both-ways", "/v1/chat/completions",
     {**_CHAT, "json_schema": "{}", "response_format": {"type": "json_object"}}, "response_format",
     ["json_schema", "response_format"]),
    ("chat-response_format-json_schema-string", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "json_schema", "json_schema": "abc"}}, "response_format.json_schema",
     ["'abc'"]),
    ("cmpl-response_format-schema-number", "/v1/completions",
     {**_CMPL, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
     "response_format.json_schema.schema", ["=5"]),
    # SGLang 0.5.23: "schema_ is required for json_schema response format request" (it was any JSON here)
    ("chat-response_format-no-schema", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema", ["no schema", "json_object"]),
    ("chat-regex-and-response_format", "/v1/chat/completions",
     {**_CHAT, "regex": "a", "response_format": {"type": "json_object"}}, "response_format",
     ["response_format", "regex"]),
    ("chat-regex-and-ebnf", "/v1/chat/completions", {**_CHAT, "regex": "a", "ebnf": 'root ::= "a"'}, "regex",
     ["regex", "ebnf"]),
    ("generate-min_new_tokens", "/generate", {"text": "a", "sampling_params": {"regex": "a+", "min_new_tokens": 2}},
     "min_new_tokens", ["min_new_tokens=2", "regex"]),
    ("cmpl-min_tokens", "/v1/completions", {**_CMPL, "regex": "a+", "min_tokens": 2}, "min_tokens",
     ["min_tokens=2", "regex"]),
    # The client set response_format, not json_schema: the message names what it sent.
    ("chat-min_tokens-response_format", "/v1/chat/completions",
     {**_CHAT, "response_format": {"type": "json_object"}, "min_tokens": 2}, "min_tokens",
     ["min_tokens=2", "response_format"]),
    ("cmpl-batch-regex", "/v1/completions", {**_CMPL, "prompt": ["a", "b"], "regex": "(ab"}, "regex",
     ["'(ab'", "prompt 0"]),
]


@pytest.mark.parametrize("path,body,param,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_grammars_are_400_naming_field_and_value(server, path, body, param, words):
    err = _error(server.url, path, body)
    assert err["param"] == param, err
    assert all(w in err["message"] for w in words), err
    assert len(err["message"]) < 1000, err
    if param in ("response_format", "min_tokens") and "json_schema" not in body:  # never a field not sent
        assert not regex.search(r"(?<![.\w])json_schema\b", err["message"]), err
    # The server goes on serving, grammars included.
    out = _generate(server.url, {"text": "a", "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                                  "regex": REGEX_ANSWER}})[0]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"


# -- a mixed concurrent batch ------------------------------------------------------------------------------------

def test_mixed_concurrent_batch(server, tok):
    """Grammar requests of every kind, plain ones, a stream and a bad grammar, sent at once: each equals its own
    request sent alone (greedy), the bad one is a 400, and the grammar outputs are valid."""
    jobs = []  # (path, body, pattern or None for a plain request, schema)
    for i, (_, sp, pattern, schema) in enumerate(GRAMMARS):
        jobs.append(("/generate", {"text": PROMPTS[i % 4], "sampling_params": {"max_new_tokens": 24,
                                                                               "temperature": 0, **sp}},
                     pattern, schema))
    for p in PROMPTS:
        jobs.append(("/generate", {"text": p, "sampling_params": {"max_new_tokens": 16, "temperature": 0}}, None,
                     None))
    jobs.append(("/v1/completions", {"model": MODEL, "prompt": PROMPTS[3], "max_tokens": 16, "temperature": 0,
                                     "regex": REGEX_WORDS}, REGEX_WORDS, None))
    jobs.append(("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 16, "temperature": 0},
                 None, None))
    jobs.append(("/v1/chat/completions", {"model": MODEL, "messages": CHAT, "max_tokens": 16, "temperature": 0,
                                          "response_format": {"type": "json_object"}}, None, None))
    streamed = ("/v1/completions", {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 16, "temperature": 0,
                                    "ebnf": EBNF_ANIMAL, "stream": True})
    bad = ("/v1/completions", {"model": MODEL, "prompt": PROMPTS[0], "regex": "(("})

    def answer(path: str, r: httpx.Response):
        assert r.status_code == 200, r.text
        if path == "/generate":
            return r.json()["output_ids"], r.json()["meta_info"]["finish_reason"]["type"]
        c = r.json()["choices"][0]
        return c.get("text", (c.get("message") or {}).get("content")), c["finish_reason"]

    alone = [answer(path, httpx.post(server.url + path, json=body, timeout=60)) for path, body, _, _ in jobs]
    alone_stream = "".join(c["choices"][0]["text"] for c in _stream(server.url, *streamed) if c["choices"])

    async def send_all():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            async def stream(path, body):
                async with client.stream("POST", path, json=body) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines() if line.startswith("data: {")]
                return "".join(c["choices"][0]["text"] for c in map(lambda s: json.loads(s[6:]), lines)
                               if c["choices"])
            return await asyncio.gather(*[client.post(path, json=body) for path, body, _, _ in jobs],
                                        stream(*streamed), client.post(bad[0], json=bad[1]))

    *responses, got_stream, bad_response = asyncio.run(send_all())
    together = [answer(path, r) for (path, _, _, _), r in zip(jobs, responses, strict=True)]
    assert together == alone
    assert got_stream == alone_stream
    assert bad_response.status_code == 400 and bad_response.json()["error"]["param"] == "regex"
    for (path, _, pattern, schema), (out, reason) in zip(jobs, together, strict=True):
        if path == "/generate" and (pattern is not None or schema is not None):
            check_output(tok, out, reason, 24, pattern, schema)
        elif path == "/generate":
            assert reason == "length" and len(out) == 16


def test_grammar_draft_steps_are_counted(server):
    """/metrics counts the draft's proposals under grammars (the server runs EAGLE-3) and the refilled ones among
    them, as server info has them."""
    from .test_server import metric_samples

    _post(server.url, "/generate", {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                                                                          "regex": REGEX_WORDS}})
    info = httpx.get(server.url + "/get_server_info", timeout=30).json()
    samples = metric_samples(server.url)
    proposed = samples['sglang:grammar_draft_steps_total{outcome="proposed"}']
    assert proposed > 0 and proposed >= samples['sglang:grammar_draft_steps_total{outcome="refilled"}']
    assert info["grammar_proposals"]["proposed"] >= proposed


# -- the flags ----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def no_grammar_server(tiny_model, tmp_path_factory):
    with running_server(tiny_model, str(tmp_path_factory.mktemp("no_grammar_logs")), "--grammar-backend", "none",
                        "--constrained-json-disable-any-whitespace", "--served-model-name", MODEL) as srv:
        yield srv


def test_grammar_backend_none_refuses_grammars_naming_the_field(server, no_grammar_server):
    args = httpx.get(no_grammar_server.url + "/get_server_info", timeout=30).json()["args"]
    assert args["grammar_backend"] == "none" and args["constrained_json_disable_any_whitespace"] is True
    args = httpx.get(server.url + "/get_server_info", timeout=30).json()["args"]
    assert args["grammar_backend"] == "xgrammar" and args["constrained_json_disable_any_whitespace"] is False
    url = no_grammar_server.url
    for path, body, param in [
            ("/generate", {"text": "a", "sampling_params": {"regex": "a"}}, "regex"),
            ("/generate", {"text": ["a", "b"], "sampling_params": {"json_schema": "{}"}}, "json_schema"),
            ("/v1/completions", {**_CMPL, "ebnf": 'root ::= "a"'}, "ebnf"),
            ("/v1/completions", {**_CMPL, "json_schema": "{}"}, "json_schema"),
            ("/v1/chat/completions", {**_CHAT, "response_format": {"type": "json_object"}}, "response_format"),
            ("/v1/chat/completions", {**_CHAT, "response_format": {
                "type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA_FLAG}}}, "response_format")]:
        err = _error(url, path, body)
        assert err["param"] == param, err
        assert err["message"].startswith(param) or "prompt 0" in err["message"], err
        assert "grammar_backend='none'" in err["message"], err
    # Requests without a grammar are served (response_format text is none).
    res = _post(url, "/v1/chat/completions", {**_CHAT, "response_format": {"type": "text"}, "temperature": 0})
    assert res["choices"][0]["finish_reason"] == "length"
    assert len(_post(url, "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 3}})["output_ids"]) == 3


def test_a_schema_holding_nan_is_a_400_naming_it(server):
    """Python's JSON reader takes NaN / Infinity literals; a schema holding one reached xgrammar, whose "Failed to
    parse JSON" named neither the field nor the value."""
    fmt = '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "maximum": NaN}}}'
    body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 2, "response_format": "FMT"}).replace('"FMT"', fmt)
    r = httpx.post(server.url + "/v1/completions", content=body, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema" and "NaN" in err["message"], err
