"""SGLang 0.5.23's tokenizer endpoints (``POST /v1/tokenize``, ``/tokenize``, ``/v1/detokenize``, ``/detokenize``;
its openai/protocol.py TokenizeRequest / DetokenizeRequest and serving_tokenize.py), checked against the engine's
own tokenizer and chat rendering and against /v1/chat/completions' ``usage.prompt_tokens`` for the same messages:
never hard-coded ids. Bad input is a 400 in the server's error shape (never a 500), and the server keeps serving."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

from .conftest import CONTEXT, spec_engine

MODEL = "tiny"
KEY = "sekret-key"
TOKENIZE = ("/v1/tokenize", "/tokenize")
DETOKENIZE = ("/v1/detokenize", "/detokenize")
CHAT = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "The quick brown fox"}]
# (short: the tiny model's context is 256 tokens, and its byte-level BPE spends about one token a character of JSON)
TOOLS = [{"type": "function", "function": {"name": "fox", "parameters": {"type": "object"}}},
         {"type": "function", "function": {"name": "dog"}}]
TEXTS = ["The quick brown fox jumps over the lazy dog.", "naïve café €uro — 狐狸 🦊", "  two  spaces\nand\ttabs ", ""]


@pytest.fixture(scope="module")
def engine(tiny_model):
    with spec_engine(tiny_model, max_running_requests=2) as eng:
        yield eng


@pytest.fixture(scope="module")
def apps(engine):
    """(app, app with --api-key) over the module's engine and one driver (two drivers would both step the one
    scheduler: a request could finish on the other's thread, its client never answered)."""
    driver = EngineDriver(engine, max_inflight=8)
    out = [create_app(engine, driver, ServerConfig(served_model_name=MODEL, **cfg)) for cfg in ({}, {"api_key": KEY})]
    driver.start()
    yield out
    driver.stop()


@pytest.fixture(scope="module")
def app(apps):
    return apps[0]


def _call(app, path: str, body=None, *, method: str = "POST", headers=None, content=None) -> httpx.Response:
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.request(method, path, json=body, headers=headers, content=content)

    return asyncio.run(go())


def _ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def _error(r: httpx.Response, status: int = 400) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    return err


def _prompt_tokens(app, **chat) -> int:
    """/v1/chat/completions' usage.prompt_tokens for a chat request (one token generated)."""
    return _ok(_call(app, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "temperature": 0,
                                                   **chat}))["usage"]["prompt_tokens"]


# -- prompt ---------------------------------------------------------------------------------------------------

def test_prompt_text_is_the_tokenizers_ids(app, engine):
    tok = engine.tokenizer
    for path in TOKENIZE:
        for text in TEXTS:
            out = _ok(_call(app, path, {"model": MODEL, "prompt": text}))
            want = tok.encode(text, add_special_tokens=True)  # SGLang's default: add_special_tokens true
            assert out == {"tokens": want, "count": len(want), "max_model_len": CONTEXT}, (path, text, out)
            plain = _ok(_call(app, path, {"prompt": text, "add_special_tokens": False}))  # model left out: "default"
            assert plain["tokens"] == tok.encode(text, add_special_tokens=False), (path, text)
    # max_model_len is what /v1/models says
    assert _ok(_call(app, "/v1/models", method="GET"))["data"][0]["max_model_len"] == CONTEXT


def test_prompt_count_is_what_a_completion_counts(app, engine):
    """Our completions encode a prompt without the tokenizer's special tokens: add_special_tokens false counts it."""
    text = TEXTS[0]
    usage = _ok(_call(app, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}))["usage"]
    assert _ok(_call(app, "/v1/tokenize", {"prompt": text, "add_special_tokens": False}))["count"] == \
        usage["prompt_tokens"] == len(engine.tokenizer.encode(text))


def test_prompt_batch(app, engine):
    tok = engine.tokenizer
    out = _ok(_call(app, "/v1/tokenize", {"model": MODEL, "prompt": TEXTS}))
    want = [tok.encode(t, add_special_tokens=True) for t in TEXTS]
    assert out == {"tokens": want, "count": [len(w) for w in want], "max_model_len": CONTEXT}
    # One text in a list is still a batch; an empty list is an empty batch (SGLang's answer: 200, not an error)
    assert _ok(_call(app, "/tokenize", {"prompt": [TEXTS[0]]}))["tokens"] == [want[0]]
    assert _ok(_call(app, "/v1/tokenize", {"prompt": []})) == {"tokens": [], "count": [], "max_model_len": CONTEXT}


def test_a_prompt_past_the_context_is_counted_not_refused(app, engine):
    """Clients tokenize to learn whether a prompt fits: the count comes back with max_model_len (as SGLang's), where
    a completion of the same prompt is refused."""
    text = TEXTS[0] * 20
    out = _ok(_call(app, "/v1/tokenize", {"prompt": text, "add_special_tokens": False}))
    assert out["count"] == len(engine.tokenizer.encode(text)) > out["max_model_len"] == CONTEXT
    err = _error(_call(app, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1}))
    assert err["code"] == "context_length_exceeded", err


def test_special_token_text_becomes_its_id(app, engine):
    tok = engine.tokenizer
    [bos] = tok.encode("<|bos|>")
    assert bos in tok.special_ids  # the fixture's tokenizer holds it as a special token
    text = "fox <|bos|> dog"
    ids = _ok(_call(app, "/v1/tokenize", {"prompt": text}))["tokens"]
    assert ids == tok.encode(text, add_special_tokens=True) and bos in ids
    # detokenize skips it by default (SGLang's skip_special_tokens: true) and keeps it when asked
    assert _ok(_call(app, "/v1/detokenize", {"tokens": ids}))["text"] == tok.decode(ids) != text
    kept = _ok(_call(app, "/v1/detokenize", {"tokens": ids, "skip_special_tokens": False}))["text"]
    assert kept == tok.decode(ids, skip_special_tokens=False) == text


# -- detokenize -------------------------------------------------------------------------------------------------

def test_round_trip(app, engine):
    for tok_path, detok_path in zip(TOKENIZE, DETOKENIZE, strict=True):
        for text in TEXTS:
            ids = _ok(_call(app, tok_path, {"prompt": text}))["tokens"]
            assert _ok(_call(app, detok_path, {"model": MODEL, "tokens": ids})) == {"text": text}, (detok_path, text)
        batch = _ok(_call(app, tok_path, {"prompt": TEXTS}))["tokens"]
        assert _ok(_call(app, detok_path, {"tokens": batch})) == {"text": TEXTS}
        assert _ok(_call(app, detok_path, {"tokens": batch}))["text"] == [engine.tokenizer.decode(b) for b in batch]


def test_detokenize_empty_forms(app):
    """As SGLang: [] is one empty text, [[]] a batch of one empty text."""
    assert _ok(_call(app, "/v1/detokenize", {"tokens": []})) == {"text": ""}
    assert _ok(_call(app, "/v1/detokenize", {"tokens": [[]]})) == {"text": [""]}
    assert _ok(_call(app, "/detokenize", {"tokens": [[], [5]]}))["text"][0] == ""


def test_detokenize_accepts_the_whole_model_vocabulary(app, engine, tiny_model):
    """Every id the model can emit (/generate's output_ids) decodes; the last one of the vocabulary too."""
    ids = _ok(_call(app, "/generate", {"text": "The quick", "sampling_params": {"max_new_tokens": 8,
                                                                                "temperature": 0}}))["output_ids"]
    assert _ok(_call(app, "/v1/detokenize", {"tokens": ids}))["text"] == engine.tokenizer.decode(ids)
    last = tiny_model.vocab_size - 1
    assert _ok(_call(app, "/v1/detokenize", {"tokens": [last]}))["text"] == engine.tokenizer.decode([last])


# -- messages ---------------------------------------------------------------------------------------------------

def test_messages_are_the_chat_prompt(app, engine):
    tok = engine.tokenizer
    for path in TOKENIZE:
        out = _ok(_call(app, path, {"model": MODEL, "messages": CHAT}))
        assert out["tokens"] == tok.encode_chat(CHAT, True), path
        assert out["count"] == len(out["tokens"]) == _prompt_tokens(app, messages=CHAT)
        assert out["max_model_len"] == CONTEXT
    # content as text parts, and a message's extra keys, as chat reads them
    parts = [{"role": "user", "content": [{"type": "text", "text": "fox"}, {"type": "text", "text": "dog"}],
              "name": "ann"}]
    assert _ok(_call(app, "/v1/tokenize", {"messages": parts}))["count"] == _prompt_tokens(app, messages=parts)


def test_add_generation_prompt_and_special_tokens(app, engine):
    tok = engine.tokenizer
    without = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "add_generation_prompt": False}))["tokens"]
    assert without == tok.encode_chat(CHAT, False)
    assert without == _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "add_generation_prompt": False,
                                                       "add_special_tokens": False}))["tokens"]
    assert len(without) < _prompt_tokens(app, messages=CHAT)
    assert len(without) == _prompt_tokens(app, messages=CHAT, add_generation_prompt=False)
    # add_special_tokens is read only with add_generation_prompt given and only where the client set it (SGLang)
    explicit = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "add_generation_prompt": True,
                                               "add_special_tokens": True}))["tokens"]
    assert explicit == tok.encode(tok.apply_chat_template(CHAT, True), add_special_tokens=True)
    assert _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "add_special_tokens": True}))["tokens"] == \
        tok.encode_chat(CHAT, True)


def test_continue_final_message(app, engine):
    tok = engine.tokenizer
    msgs = [*CHAT, {"role": "assistant", "content": "It jumps over"}]
    out = _ok(_call(app, "/v1/tokenize", {"messages": msgs, "continue_final_message": True}))
    want = tok.encode(tok.apply_chat_template(CHAT, True) + "It jumps over")
    assert out["tokens"] == want
    assert out["count"] == _prompt_tokens(app, messages=msgs, continue_final_message=True)
    # without it the assistant message renders as any other, as chat renders it
    plain = _ok(_call(app, "/v1/tokenize", {"messages": msgs}))
    assert plain["tokens"] == tok.encode_chat(msgs, True) and plain["count"] == _prompt_tokens(app, messages=msgs)
    # SGLang: continue_final_message with add_generation_prompt false cannot open the assistant turn
    err = _error(_call(app, "/v1/tokenize", {"messages": msgs, "continue_final_message": True,
                                             "add_generation_prompt": False}))
    assert err["param"] == "add_generation_prompt" and "continue_final_message" in err["message"], err


def test_tools_render_as_chat_shows_them(app, engine):
    tok = engine.tokenizer
    required = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": TOOLS, "tool_choice": "required"}))
    assert required["tokens"] == tok.encode_chat(CHAT, True, TOOLS)
    assert required["count"] == _prompt_tokens(app, messages=CHAT, tools=TOOLS, tool_choice="required")
    named = {"type": "function", "function": {"name": "dog"}}
    one = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": TOOLS, "tool_choice": named}))
    assert one["tokens"] == tok.encode_chat(CHAT, True, [TOOLS[1]])  # a named function alone, as chat shows it
    assert one["count"] == _prompt_tokens(app, messages=CHAT, tools=TOOLS, tool_choice=named) < required["count"]
    none = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": TOOLS, "tool_choice": "none"}))
    assert none["tokens"] == tok.encode_chat(CHAT, True)
    assert none["count"] == _prompt_tokens(app, messages=CHAT, tools=TOOLS, tool_choice="none")
    # "auto" (the default with tools) needs a parser to read calls back, not to render them: counted with the tools
    auto = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": TOOLS}))
    assert auto["tokens"] == required["tokens"]
    assert _error(_call(app, "/v1/chat/completions", {"messages": CHAT, "tools": TOOLS}))["param"] == "tool_choice"
    # the tools' own checks are chat's
    err = _error(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": TOOLS,
                                             "tool_choice": {"type": "function", "function": {"name": "nope"}}}))
    assert err["param"] == "tool_choice", err
    assert _error(_call(app, "/v1/tokenize", {"messages": CHAT, "tool_choice": "required"}))["param"] == "tool_choice"
    assert _error(_call(app, "/v1/tokenize", {"messages": CHAT, "tools": []}))["param"] == "tools"


def test_chat_template_kwargs(app, engine):
    # the server's own variables are chat's 400
    err = _error(_call(app, "/v1/tokenize", {"messages": CHAT, "chat_template_kwargs": {"messages": []}}))
    assert err["param"] == "chat_template_kwargs", err
    # others reach the template (the tiny model's reads none of them: the prompt is unchanged, as chat's)
    kw = {"thinking": True}
    out = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "chat_template_kwargs": kw}))
    assert out["tokens"] == engine.tokenizer.encode_chat(CHAT, True, None, kw)
    assert out["count"] == _prompt_tokens(app, messages=CHAT, chat_template_kwargs=kw)


def test_a_template_that_reads_kwargs_and_refuses(app, engine, monkeypatch):
    """chat_template_kwargs change what a template writes, and a template's raise_exception is a 400."""
    tok = engine.tokenizer
    template = ("{% if mode == 'fail' %}{{ raise_exception('no such mode') }}{% endif %}"
                "{% for m in messages %}[{{ m.role }}{% if mode %}:{{ mode }}{% endif %}]{{ m.content }}{% endfor %}"
                "{% if add_generation_prompt %}[assistant]{% endif %}")
    monkeypatch.setattr(tok, "chat_template", template)
    monkeypatch.setattr(tok, "_compiled_template", None)
    out = _ok(_call(app, "/v1/tokenize", {"messages": CHAT, "chat_template_kwargs": {"mode": "x"}}))
    assert out["tokens"] == tok.encode("[system:x]Answer briefly.[user:x]The quick brown fox[assistant]")
    assert out["count"] == _prompt_tokens(app, messages=CHAT, chat_template_kwargs={"mode": "x"})
    err = _error(_call(app, "/v1/tokenize", {"messages": CHAT, "chat_template_kwargs": {"mode": "fail"}}))
    assert err["param"] == "messages" and "no such mode" in err["message"], err


# -- refusals ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path,body,param", [
    ("/v1/tokenize", {"model": MODEL}, "prompt"),  # neither prompt nor messages
    ("/v1/tokenize", {"prompt": "fox", "messages": CHAT}, "prompt"),  # both
    ("/tokenize", {"prompt": None, "messages": None}, "prompt"),
    ("/v1/tokenize", {"prompt": ["fox", 5]}, "prompt"),  # a list mixing texts and ids
    ("/v1/tokenize", {"prompt": [1, 2, 3]}, "prompt"),  # ids are no prompt to tokenize (SGLang: str or list[str])
    ("/v1/tokenize", {"prompt": 5}, "prompt"),
    ("/v1/tokenize", {"messages": []}, "messages"),  # SGLang: "Messages cannot be empty."
    ("/v1/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/v1/tokenize", {"messages": [{"role": "user"}]}, "messages.0.content"),
    ("/v1/tokenize", {"prompt": "fox", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/v1/detokenize", {}, "tokens"),
    ("/v1/detokenize", {"tokens": [1, [2]]}, "tokens"),  # a list mixing ints and lists
    ("/detokenize", {"tokens": [[1], 2]}, "tokens"),
    ("/v1/detokenize", {"tokens": [True, 2]}, "tokens"),  # strict: true is no id
    ("/v1/detokenize", {"tokens": ["3"]}, "tokens"),
    ("/v1/detokenize", {"tokens": [[[1]]]}, "tokens"),
    ("/v1/detokenize", {"tokens": [1], "skip_special_tokens": 1}, "skip_special_tokens"),
])
def test_bad_input_is_a_400(app, path, body, param):
    err = _error(_call(app, path, body))
    assert err["type"] == "invalid_request_error" and err["param"] is not None, err
    assert err["param"].split(".")[0] == param.split(".")[0] and err["param"].startswith(param), err


def test_ids_outside_the_vocabulary_are_a_400(app, tiny_model):
    """SGLang drops an id past the tokenizer's vocabulary without a word (Hugging Face's decode skips it) and fails
    with a 500 on a negative one; both are the client's mistake here, named by position."""
    vocab = tiny_model.vocab_size
    for tokens, param in (([vocab], "tokens.0"), ([5, -1], "tokens.1"), ([[1], [2, vocab + 5]], "tokens.1.1"),
                          ([2 ** 40], "tokens.0")):
        err = _error(_call(app, "/v1/detokenize", {"tokens": tokens}))
        assert err["param"] == param and f"[0, {vocab})" in err["message"], (tokens, err)
    r = _call(app, "/v1/detokenize", {"tokens": [2 ** 70]})  # past any integer type: refused either way, no 500
    assert r.status_code == 400, r.text


def test_malformed_bodies_model_and_methods(app):
    for path in (*TOKENIZE, *DETOKENIZE):
        assert _error(_call(app, path, content=b"{not json"))["code"] == "invalid_json"
        assert _error(_call(app, path, content=b""))["code"] == "invalid_json"
        assert _error(_call(app, path, method="GET"), 405)["code"] == "method_not_allowed"
        body = {"prompt": "fox"} if "/tokenize" in path else {"tokens": [1]}
        err = _error(_call(app, path, {**body, "model": "other"}), 404)
        assert err["code"] == "model_not_found" and err["param"] == "model", err
    # the served name, the model path and "default" are all accepted, as elsewhere
    assert _call(app, "/v1/tokenize", {"prompt": "fox", "model": "default"}).status_code == 200


def test_server_keeps_serving_after_refusals(app):
    for body in ({"prompt": ["a", 1]}, {}, {"prompt": "a", "messages": CHAT}):
        _error(_call(app, "/v1/tokenize", body))
    for body in ({"tokens": [1, [2]]}, {"tokens": [-1]}):
        _error(_call(app, "/v1/detokenize", body))
    assert _call(app, "/health", method="GET").status_code == 200
    assert _ok(_call(app, "/v1/tokenize", {"prompt": "fox"}))["count"] > 0
    out = _ok(_call(app, "/generate", {"text": "fox", "sampling_params": {"max_new_tokens": 2}}))
    assert len(out["output_ids"]) == 2


def test_api_key(apps):
    keyed = apps[1]
    for path, body in (("/v1/tokenize", {"prompt": "fox"}), ("/tokenize", {"prompt": "fox"}),
                       ("/v1/detokenize", {"tokens": [5]}), ("/detokenize", {"tokens": [5]})):
        assert _error(_call(keyed, path, body), 401)["code"] == "invalid_api_key"
        assert _error(_call(keyed, path, body, headers={"Authorization": "Bearer wrong"}), 401)
        _ok(_call(keyed, path, body, headers={"Authorization": f"Bearer {KEY}"}))


def test_tokenizing_runs_off_the_event_loop(app, engine, monkeypatch):
    """A prompt of megabytes takes seconds to encode (and a chat to render): meanwhile /health is served."""
    tok = engine.tokenizer
    for name, path, body in (("encode", "/v1/tokenize", {"prompt": "fox"}),
                             ("apply_chat_template", "/v1/tokenize", {"messages": CHAT}),
                             ("decode", "/v1/detokenize", {"tokens": [5, 6]})):
        real = getattr(tok, name)
        entered, release = threading.Event(), threading.Event()
        blocked = []

        def slow(*args, _real=real, _entered=entered, _release=release, _blocked=blocked, **kwargs):
            _blocked.append(True)
            _entered.set()
            _release.wait(5)  # set once /health answered: on the event loop it could not have been
            _blocked.append(False)
            return _real(*args, **kwargs)

        monkeypatch.setattr(tok, name, slow)

        async def scenario(path=path, body=body, entered=entered, release=release, blocked=blocked):
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                         timeout=60) as c:
                call = asyncio.create_task(c.post(path, json=body))
                await asyncio.to_thread(entered.wait, 5)
                health = await c.get("/health")
                still_blocked = blocked[-1]
                release.set()
                return health, still_blocked, await call

        health, still_blocked, r = asyncio.run(scenario())
        monkeypatch.setattr(tok, name, real)
        assert health.status_code == 200 and still_blocked, f"/health waited for {name}"
        assert r.status_code == 200, r.text


# -- without a tokenizer ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizerless(tiny_model):
    with spec_engine(tiny_model, max_running_requests=2, skip_tokenizer_init=True) as eng:
        driver = EngineDriver(eng, max_inflight=8)
        app = create_app(eng, driver, ServerConfig(served_model_name=MODEL))
        driver.start()
        yield app
        driver.stop()


def test_without_a_tokenizer_is_a_400_naming_the_flag(tokenizerless):
    """SGLang fails /v1/tokenize with a 500 (its tokenizer is None) there; a 400 naming why here."""
    for path, body, param in (("/v1/tokenize", {"prompt": "fox"}, "prompt"),
                              ("/tokenize", {"prompt": ["a"]}, "prompt"),
                              ("/v1/tokenize", {"messages": CHAT}, "messages"),
                              ("/v1/detokenize", {"tokens": [5]}, "tokens"),
                              ("/detokenize", {"tokens": [[5]]}, "tokens")):
        err = _error(_call(tokenizerless, path, body))
        assert err["param"] == param and "--skip-tokenizer-init" in err["message"], (path, err)
    # the request's own mistakes are still named first
    assert _error(_call(tokenizerless, "/v1/tokenize", {}))["param"] == "prompt"
    assert _call(tokenizerless, "/health", method="GET").status_code == 200
