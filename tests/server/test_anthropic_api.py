"""Anthropic's Messages API (server/anthropic_api.py): POST /v1/messages and /v1/messages/count_tokens.

Checked against independent readings, never against outputs of the code under test written down here:

- the ``anthropic`` SDK parsing our answers, our streams (its own accumulation of the events into a message) and
  our errors (its typed exceptions);
- our /v1/chat/completions answer to the equivalent chat request, built here by hand from the Anthropic request
  (greedy, EAGLE-3 on): the same text, calls, token counts; /v1/tokenize's count of the same chat for count_tokens;
- ``json.loads`` of the streamed ``partial_json`` for tool inputs, a raw reading of the SSE lines (``event:`` names
  the payload's type; the deltas concatenate to the non-streamed blocks);
- the scripted tiny model of test_tools.py / test_reasoning.py / test_tools_reasoning_parity.py (fixtures imported
  from there) for what the random model cannot write: Kimi's tool-call markup and thinking.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import anthropic
import httpx
import httpx2
import pytest

from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

from .conftest import named_sse_events, post_chat, random_words, spec_engine
from .test_reasoning import END, THINK, THOUGHT, thinking  # noqa: F401  (a fixture)
from .test_tools import (
    ADD,
    AUTO_CONTENT,
    AUTO_SCRIPT,
    COUNT,
    FORCED_TOOLS,
    MODEL,
    PING,
    SB,
    SE,
    TRICKY,
    WEATHER,
    call,
    scripted,  # noqa: F401  (a fixture)
    tool_server,  # noqa: F401  (a fixture)
)
from .test_tools_reasoning_parity import k25  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

USER = {"role": "user", "content": "Pack my box"}


def anthropic_tool(tool: dict) -> dict:
    """An OpenAI tool of test_tools.py as Anthropic writes it."""
    f = tool["function"]
    return {"name": f["name"], "input_schema": f.get("parameters", {"type": "object", "properties": {}})}


def chat_tool(tool: dict) -> dict:
    """An Anthropic tool as the chat's function (its input_schema the parameters)."""
    return {"type": "function", "function": {"name": tool["name"], "parameters": tool["input_schema"]}}


def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)


raw_events = named_sse_events


def blocks_of_events(events: list[tuple[str, dict]]) -> tuple[list[dict], dict, dict]:
    """Content blocks rebuilt from the events by hand (deltas concatenated, tool input from the partial JSON),
    with the message_start message and the message_delta; checks the events' order and indexes."""
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"], names
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    blocks: list[dict] = []
    partial: dict[int, str] = {}
    open_index = None
    for name, p in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and p["index"] == len(blocks), (p, len(blocks))
            open_index = p["index"]
            blocks.append(dict(p["content_block"]))
        elif name == "content_block_delta":
            assert p["index"] == open_index, p
            d, b = p["delta"], blocks[open_index]
            if d["type"] == "text_delta":
                b["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                b["thinking"] += d["thinking"]
            else:
                assert d["type"] == "input_json_delta" and b["type"] == "tool_use", p
                partial[open_index] = partial.get(open_index, "") + d["partial_json"]
        else:
            assert name == "content_block_stop" and p["index"] == open_index, (name, p)
            open_index = None
    assert open_index is None
    for i, text in partial.items():
        blocks[i]["input"] = json.loads(text)
    return blocks, start, events[-2][1]


def check_stream(url_or_post, body: dict, whole: dict) -> None:
    """The stream of ``body`` equals the non-streamed answer ``whole`` (raw events, rebuilt by hand)."""
    text = url_or_post(body)
    blocks, start, end = blocks_of_events(raw_events(text))
    assert blocks == whole["content"], (blocks, whole["content"])
    assert start["usage"]["input_tokens"] == whole["usage"]["input_tokens"] == end["usage"]["input_tokens"]
    assert end["usage"]["output_tokens"] == whole["usage"]["output_tokens"]
    assert end["delta"] == {"stop_reason": whole["stop_reason"], "stop_sequence": whole["stop_sequence"]}


def live_stream(url: str):
    def post(body: dict) -> str:
        r = httpx.post(url + "/v1/messages", json={**body, "stream": True}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
        return r.text
    return post


def sdk(body: dict) -> dict:
    """The SDK's arguments for a request body: this SDK (2.x) has no temperature, top_p or top_k arguments (newer
    Claude models take none): they go in extra_body, as a client sends them to other servers."""
    extra = {k: body[k] for k in ("temperature", "top_p", "top_k") if k in body}
    rest = {k: v for k, v in body.items() if k not in extra}
    return {**rest, "extra_body": extra} if extra else rest


def sdk_dump(message) -> dict:
    return message.model_dump(exclude_none=True)


# -- the live server (random tiny pair, no parsers) -----------------------------------------------------------------

def random_conversation(rng: random.Random) -> tuple[dict, dict]:
    """(an Anthropic request, the equivalent chat request) over random words: a system prompt (string or text
    blocks) or none, 1-3 turns, each a string or text blocks."""
    anth, msgs = {}, []
    kind = rng.choice(["none", "string", "blocks"])
    if kind == "string":
        anth["system"] = random_words(rng, 3)
        msgs.append({"role": "system", "content": anth["system"]})
    elif kind == "blocks":
        texts = [random_words(rng, 2) for _ in range(rng.randint(1, 2))]
        anth["system"] = [{"type": "text", "text": t} for t in texts]
        msgs.append({"role": "system", "content": "\n".join(texts)})  # (joined by a newline, as SGLang)
    turns = []
    for i in range(rng.choice([1, 3])):
        role = "user" if i % 2 == 0 else "assistant"
        if rng.random() < 0.5:
            text = random_words(rng, rng.randint(1, 4))
            turns.append({"role": role, "content": text})
            msgs.append({"role": role, "content": text})
        else:
            texts = [random_words(rng, rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
            turns.append({"role": role, "content": [{"type": "text", "text": t} for t in texts]})
            msgs.append({"role": role, "content": texts[0] if len(texts) == 1 else
                         [{"type": "text", "text": t} for t in texts]})
    anth["messages"] = turns
    return anth, {"messages": msgs}


@pytest.mark.parametrize("seed", range(4))
def test_answers_as_chat_does(server, seed):
    """Random greedy conversations: the SDK parses our message; its text, token counts and stop reason are the chat
    endpoint's for the equivalent chat request; count_tokens is its input_tokens; the stream (raw events, and the
    SDK's own accumulation) is the same message."""
    rng = random.Random(seed)
    anth, equivalent = random_conversation(rng)
    max_tokens = rng.randint(1, 16)
    body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, **anth,
            "metadata": {"user_id": "u-1"}}  # (accepted, not read)
    c = client(server.url)
    msg = c.messages.create(**sdk(body))
    ref = post_chat(server.url, {**equivalent, "max_tokens": max_tokens, "temperature": 0})
    choice = ref["choices"][0]
    assert msg.type == "message" and msg.role == "assistant" and msg.model == MODEL and msg.id.startswith("msg_")
    assert all(b.type == "text" for b in msg.content) and len(msg.content) <= 1, msg
    assert "".join(b.text for b in msg.content) == choice["message"]["content"]
    assert msg.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert msg.usage.output_tokens == ref["usage"]["completion_tokens"] == max_tokens  # (no eos in the tiny pair)
    assert (msg.stop_reason, msg.stop_sequence) == ("max_tokens", None) and choice["finish_reason"] == "length"
    counted = c.messages.count_tokens(model=MODEL, messages=anth["messages"],
                                      **({"system": anth["system"]} if "system" in anth else {}))
    assert counted.input_tokens == msg.usage.input_tokens
    whole = httpx.post(server.url + "/v1/messages", json=body, timeout=120).json()
    assert whole["content"] == sdk_dump(msg)["content"] and whole["usage"]["cache_read_input_tokens"] == 0
    check_stream(live_stream(server.url), body, whole)
    with c.messages.stream(**sdk(body)) as s:
        streamed_text = "".join(s.text_stream)
        final = s.get_final_message()
    assert sdk_dump(final)["content"] == sdk_dump(msg)["content"] and streamed_text == choice["message"]["content"]
    assert (final.stop_reason, final.usage.output_tokens, final.usage.input_tokens) == (
        msg.stop_reason, msg.usage.output_tokens, msg.usage.input_tokens)


def test_stop_sequences(server):
    """A stop string taken from the greedy output itself ends it there: stop_reason stop_sequence naming it, the text
    before it (the chat's with the same stop), streamed the same; a stop string that never comes changes nothing."""
    c = client(server.url)
    found = None
    for prompt in ("Pack my box", "The quick brown fox", "Sphinx of black quartz", "How vexingly"):
        body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": prompt}]}
        text = c.messages.create(**sdk(body)).content[0].text
        for i in range(2, len(text) - 2):
            stop = text[i:i + 2]
            if stop.isascii() and stop.isprintable() and stop.strip() and text.find(stop) == i:
                found = body, text, stop
                break
        if found:
            break
    assert found, "no printable two-character piece in the greedy outputs"
    body, text, stop = found
    msg = c.messages.create(**sdk(body), stop_sequences=["\x00never", stop])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == text[:text.index(stop)]
    ref = post_chat(server.url, {"messages": body["messages"], "max_tokens": 16, "temperature": 0,
                            "stop": ["\x00never", stop]})["choices"][0]
    assert ref["message"]["content"] == msg.content[0].text and ref["matched_stop"] == stop
    whole = httpx.post(server.url + "/v1/messages", json={**body, "stop_sequences": ["\x00never", stop]}).json()
    check_stream(live_stream(server.url), {**body, "stop_sequences": ["\x00never", stop]}, whole)
    unmatched = c.messages.create(**sdk(body), stop_sequences=["\x00never"])
    assert unmatched.content[0].text == text and unmatched.stop_reason == "max_tokens"


def test_prefill_continues_the_last_assistant_message(server):
    """A last assistant message is continued (Anthropic's prefill): the chat's continue_final_message answer."""
    c = client(server.url)
    messages = [USER, {"role": "assistant", "content": "The quick"}]
    msg = c.messages.create(**sdk({"model": MODEL, "max_tokens": 10, "temperature": 0, "messages": messages}))
    ref = post_chat(server.url, {"messages": messages, "max_tokens": 10, "temperature": 0,
                            "continue_final_message": True})
    assert msg.content[0].text == ref["choices"][0]["message"]["content"]
    assert msg.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert c.messages.count_tokens(model=MODEL, messages=messages).input_tokens == msg.usage.input_tokens


def test_tool_history_renders_as_the_chat(server):
    """A conversation with tool_use / tool_result blocks (string and block results, is_error, thinking and
    redacted_thinking history) counts the tokens /v1/tokenize counts for the chat messages written here; tool_choice
    none answers as plain chat (the tools left out of the prompt)."""
    tools = [anthropic_tool(PING), anthropic_tool(COUNT)]
    messages = [
        USER,
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Let me see."},
            {"type": "tool_use", "id": "call_1", "name": "count", "input": {"n": 3, "tag": "ü"}},
            {"type": "tool_use", "id": "call_2", "name": "ping", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1", "content": "3", "cache_control": {"type": "ephemeral"}},
            {"type": "tool_result", "tool_use_id": "call_2", "is_error": True,
             "content": [{"type": "text", "text": "down"}, {"type": "text", "text": "again"}]},
            {"type": "text", "text": "And now?"}]},
    ]
    equivalent = [
        USER,
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "hm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "count", "arguments": '{"n": 3, "tag": "ü"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "is_error": True,
         "content": [{"type": "text", "text": "down"}, {"type": "text", "text": "again"}]},
        {"role": "user", "content": "And now?"},
    ]
    chat_tools = [chat_tool(t) for t in tools]
    c = client(server.url)
    for choice, chat_choice in (({"type": "auto"}, "auto"), ({"type": "none"}, "none"),
                                ({"type": "tool", "name": "ping"}, {"type": "function", "function": {"name": "ping"}})):
        counted = c.messages.count_tokens(model=MODEL, messages=messages, tools=tools, tool_choice=choice)
        r = httpx.post(server.url + "/v1/tokenize", json={"model": MODEL, "messages": equivalent, "tools": chat_tools,
                                                          "tool_choice": chat_choice})
        assert r.status_code == 200, r.text
        assert counted.input_tokens == r.json()["count"], choice
    msg = c.messages.create(**sdk({"model": MODEL, "max_tokens": 8, "temperature": 0, "messages": messages,
                                   "tools": tools, "tool_choice": {"type": "none"}}))
    ref = post_chat(server.url, {"messages": equivalent, "tools": chat_tools, "tool_choice": "none", "max_tokens": 8,
                            "temperature": 0})
    assert msg.content[0].text == ref["choices"][0]["message"]["content"]
    assert msg.usage.input_tokens == ref["usage"]["prompt_tokens"]


# -- errors --------------------------------------------------------------------------------------------------------

PING_A = anthropic_tool(PING)
BAD = [  # (changes to a good body, a piece of the message: the field it names)
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens=0"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 10 ** 6}, "max_tokens"),  # (past what the context leaves)
    ({"model": 5}, "model"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages.0.content.0.text"),
    ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages.0.content.0"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type":
                                                                             "image/png", "data": "AAAA"}}]}]},
     "messages.0.content.0.type='image'"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "b", "input": {}}]}]},
     "messages.0.content.0.type='tool_use'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages.0.content.0.tool_use_id"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.type"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "ping",
                                                            "input": [1]}]}, USER]}, "messages.1.content.0.input"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]},
     "messages.1.content.0.type"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "ping",
                                                            "input": {}}]}]}, "messages.1"),
    ({"messages": [USER, {"role": "assistant", "content": "Sure"}],
      "thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"system": [{"type": "image", "source": {}}]}, "system.0.type"),
    ({"system": 5}, "system"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 5.0}, "top_p"),
    ({"top_k": -3}, "top_k"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"stop_sequences": ["x" * 1000]}, "stop_sequences"),
    ({"stream": "yes"}, "stream"),
    ({"tools": [{"name": "x"}]}, "tools.0.input_schema"),
    ({"tools": [{"name": "x", "input_schema": {"type": "string"}}]}, "tools.0.input_schema.type"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"name": "bad name!", "input_schema": {}}], "tool_choice": {"type": "any"}}, "tools[0].name"),
    ({"tools": [PING_A, PING_A], "tool_choice": {"type": "any"}}, "tools[1].name"),
    ({"tools": [PING_A], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [PING_A], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({"tools": [PING_A], "tool_choice": {"type": "any", "disable_parallel_tool_use": "yes"}},
     "disable_parallel_tool_use"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [PING_A]}, "--tool-call-parser"),  # (auto, on a server without a parser)
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "disabled", "budget_tokens": 2048}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "thinking.type"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048, "display": "loud"}}, "thinking.display"),
    ({"output_config": {"effort": "enormous"}}, "output_config.effort"),
    ({"output_config": {"format": {"type": "xml"}}}, "output_config.format"),
]


@pytest.mark.parametrize("change,needle", BAD, ids=[str(i) for i in range(len(BAD))])
def test_client_mistakes_are_400_in_anthropics_shape(server, change, needle):
    body = {"model": MODEL, "max_tokens": 4, "messages": [USER], **change}
    body = {k: v for k, v in body.items() if v is not None}
    for stream in (False, True):
        r = httpx.post(server.url + "/v1/messages", json={**body, "stream": stream} if "stream" not in change
                       else body, timeout=60)
        assert r.status_code == 400, (change, r.text)
        err = r.json()
        assert set(err) == {"type", "error"} and err["type"] == "error", err
        assert set(err["error"]) == {"type", "message"} and err["error"]["type"] == "invalid_request_error", err
        assert needle in err["error"]["message"], (needle, err)


def test_count_tokens_refuses_what_messages_refuses(server):
    for change, needle in BAD:
        if any(k in change for k in ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream")) \
                or needle == "--tool-call-parser":
            continue  # (not count_tokens' fields; it counts tools whatever the server's parser)
        body = {"model": MODEL, "messages": [USER], **change}
        r = httpx.post(server.url + "/v1/messages/count_tokens", json=body, timeout=60)
        assert r.status_code == 400 and needle in r.json()["error"]["message"], (change, r.text)


def test_errors_the_sdk_reads(server):
    c = client(server.url)
    with pytest.raises(anthropic.NotFoundError) as e:
        c.messages.create(model="claude-sonnet-4-5", max_tokens=4, messages=[USER])
    assert e.value.status_code == 404 and e.value.body["error"]["type"] == "not_found_error"
    assert "claude-sonnet-4-5" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.messages.count_tokens(model="nope", messages=[USER])
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        with c.messages.stream(model=MODEL, max_tokens=4, messages=[USER], extra_body={"temperature": -1.0}) as s:
            s.get_final_message()
    # Not JSON, an unknown route under /v1/messages, a wrong method: Anthropic's shape too; OpenAI's elsewhere.
    for method, path, content, status in (("POST", "/v1/messages", b"{nope", 400),
                                          ("POST", "/v1/messages/batches", b"{}", 404),
                                          ("GET", "/v1/messages", b"", 405)):
        r = httpx.request(method, server.url + path, content=content, headers={"content-type": "application/json"})
        assert r.status_code == status and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{nope")
    assert r.status_code == 400 and set(r.json()) == {"error"} and r.json()["error"]["code"] == "invalid_json"


# -- forced tool use (the live server with the names template and the kimi_k2 parser) ------------------------------

@pytest.mark.parametrize("choice,chat_choice,parallel", [
    ({"type": "any"}, "required", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "tool", "name": "count"}, {"type": "function", "function": {"name": "count"}}, None),
])
def test_forced_tool_use_is_the_chats_calls(tool_server, choice, chat_choice, parallel):  # noqa: F811
    """tool_choice any / tool: the chat's forced calls (greedy), as tool_use blocks whose input is the call's
    arguments parsed, stop_reason tool_use; streamed the same; a cut output is text, max_tokens."""
    c = client(tool_server.url)
    tools = [anthropic_tool(t) for t in FORCED_TOOLS]
    outcomes = set()
    for max_tokens in (90, 12):
        for prompt in ("Pack my box", "Sphinx of black quartz"):
            messages = [{"role": "user", "content": prompt}]
            body = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0, "messages": messages,
                    "tools": tools, "tool_choice": choice}
            msg = c.messages.create(**sdk(body))
            ref = post_chat(tool_server.url, {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                         "tools": [chat_tool(t) for t in tools], "tool_choice": chat_choice,
                                         **({"parallel_tool_calls": parallel} if parallel is not None else {})})
            ch = ref["choices"][0]
            outcomes.add(ch["finish_reason"])
            if ch["finish_reason"] == "tool_calls":
                assert msg.stop_reason == "tool_use" and all(b.type == "tool_use" for b in msg.content), msg
                assert [(b.id, b.name, b.input) for b in msg.content] == [
                    (t["id"], t["function"]["name"], json.loads(t["function"]["arguments"]))
                    for t in ch["message"]["tool_calls"]]
                if parallel is False:
                    assert len(msg.content) == 1, msg
            else:
                assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content] == ["text"]
                assert msg.content[0].text == ch["message"]["content"]
            assert msg.usage.output_tokens == ref["usage"]["completion_tokens"]
            whole = httpx.post(tool_server.url + "/v1/messages", json=body, timeout=120).json()
            check_stream(live_stream(tool_server.url), body, whole)
            with c.messages.stream(**sdk(body)) as s:
                assert sdk_dump(s.get_final_message())["content"] == sdk_dump(msg)["content"]
    assert "tool_calls" in outcomes


# -- the scripted model: Kimi's call markup, thinking ----------------------------------------------------------------

def ask_anthropic(app_holder, script: str | None, body: dict, chat_body: dict | None = None):
    """For one request whose output is ``script``: the raw non-streamed answer, the raw stream's text, the SDK's
    message and its accumulation of the stream, and the chat's answer to ``chat_body`` (if given)."""
    body = {"model": MODEL, **body}

    async def go():
        transport = httpx2.ASGITransport(app=app_holder.app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://t", timeout=120) as h:
            client_ = anthropic.AsyncAnthropic(api_key="none", base_url="http://t", http_client=h, max_retries=0)
            whole = await h.post("/v1/messages", json=body)
            streamed = await h.post("/v1/messages", json={**body, "stream": True})
            msg = await client_.messages.create(**sdk(body))
            async with client_.messages.stream(**sdk(body)) as s:
                final = await s.get_final_message()
            ref = None
            if chat_body is not None:
                ref = await h.post("/v1/chat/completions", json={"model": MODEL, **chat_body})
            return whole, streamed, msg, final, ref

    app_holder.script, app_holder.seen[:] = script, []
    try:
        whole, streamed, msg, final, ref = asyncio.run(go())
    finally:
        app_holder.script = None
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    whole = whole.json()
    assert sdk_dump(msg)["content"] == whole["content"] == sdk_dump(final)["content"], (whole, msg, final)
    assert (final.stop_reason, final.stop_sequence) == (whole["stop_reason"], whole["stop_sequence"])
    check_stream(lambda _: streamed.text, body, whole)
    if ref is not None:
        assert ref.status_code == 200, ref.text
        ref = ref.json()
    return whole, streamed.text, ref


AUTO_CALLS = [("get_weather", TRICKY), ("add", {"a": 2, "b": {"c": "}"}})]


def test_auto_tool_use_and_the_turn_after(scripted):  # noqa: F811
    """Kimi's markup read by --tool-call-parser: text, then tool_use blocks with Kimi's ids and the arguments as
    objects, stop_reason tool_use (the chat's calls); the client's next turn, tool results and all, renders as the
    chat messages written here (count_tokens = /v1/tokenize's count) and its calls' ids count the earlier ones."""
    room = len(scripted.tokenizer.encode(AUTO_SCRIPT)) + 2
    tools = [anthropic_tool(WEATHER), anthropic_tool(ADD)]
    whole, _, ref = ask_anthropic(scripted, AUTO_SCRIPT,
                                  {"max_tokens": room, "temperature": 0, "messages": [USER], "tools": tools},
                                  {"max_tokens": room, "temperature": 0, "messages": [USER],
                                   "tools": [chat_tool(t) for t in tools]})
    assert whole["stop_reason"] == "tool_use" and whole["stop_sequence"] is None
    calls = ref["choices"][0]["message"]["tool_calls"]
    assert whole["content"] == [{"type": "text", "text": AUTO_CONTENT}] + [
        {"type": "tool_use", "id": t["id"], "name": t["function"]["name"],
         "input": json.loads(t["function"]["arguments"])} for t in calls]
    assert [(b["name"], b["input"]) for b in whole["content"][1:]] == AUTO_CALLS
    assert whole["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]
    # The next turn: the assistant's blocks back, a tool_result for each call.
    history = [USER, {"role": "assistant", "content": whole["content"]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b["id"], "content": f"r{i}"}
                                            for i, b in enumerate(whole["content"][1:])]}]
    equivalent = [USER, {"role": "assistant", "content": AUTO_CONTENT, "tool_calls": [
        {k: t[k] for k in ("id", "type", "function")} for t in calls]}] + [
        {"role": "tool", "tool_call_id": t["id"], "content": f"r{i}"} for i, t in enumerate(calls)]
    script = SB + call("functions.add:0", '{"a": 1, "b": 2}') + SE  # (the context is 256 tokens)
    room = len(scripted.tokenizer.encode(script)) + 2
    whole2, _, ref2 = ask_anthropic(scripted, script,
                                    {"max_tokens": room, "temperature": 0, "messages": history, "tools": tools},
                                    {"max_tokens": room, "temperature": 0, "messages": equivalent,
                                     "tools": [chat_tool(t) for t in tools]})
    assert [b["id"] for b in whole2["content"]] == [t["id"] for t in ref2["choices"][0]["message"]["tool_calls"]]
    assert [(b["id"], b["input"]) for b in whole2["content"]] == [("functions.add:2", {"a": 1, "b": 2})]
    assert whole2["usage"]["input_tokens"] == ref2["usage"]["prompt_tokens"]

    async def counts():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scripted.app), base_url="http://t") as h:
            a = await h.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": history, "tools": tools})
            b = await h.post("/v1/tokenize", json={"model": MODEL, "messages": equivalent,
                                                   "tools": [chat_tool(t) for t in tools]})
            return a.json(), b.json()

    a, b = asyncio.run(counts())
    assert a["input_tokens"] == b["count"] == whole2["usage"]["input_tokens"]


def test_auto_text_only_and_cut(scripted):  # noqa: F811
    """No calls: one text block, end_turn; cut inside a call by max_tokens: the complete calls before it, and
    stop_reason max_tokens (as the chat's finish_reason length)."""
    text = "Nothing to call: <|tool is not a marker {}."
    whole, _, _ = ask_anthropic(scripted, text, {"max_tokens": 200, "temperature": 0, "messages": [USER],
                                                 "tools": [anthropic_tool(WEATHER)]})
    assert whole["content"] == [{"type": "text", "text": text}] and whole["stop_reason"] == "end_turn"
    ids = scripted.tokenizer.encode(AUTO_SCRIPT)
    [ce] = scripted.tokenizer.encode("<|tool_call_end|>")
    cut = ids.index(ce) + 3
    whole, _, ref = ask_anthropic(scripted, AUTO_SCRIPT,
                                  {"max_tokens": cut, "temperature": 0, "messages": [USER],
                                   "tools": [anthropic_tool(WEATHER), anthropic_tool(ADD)]},
                                  {"max_tokens": cut, "temperature": 0, "messages": [USER], "tools": [WEATHER, ADD]})
    assert ref["choices"][0]["finish_reason"] == "length"
    assert whole["stop_reason"] == "max_tokens"
    assert [(b["name"], b["input"]) for b in whole["content"] if b["type"] == "tool_use"] == AUTO_CALLS[:1]


def test_thinking_blocks(thinking):  # noqa: F811
    """--reasoning-parser kimi_k2: a thinking block with the reasoning, then text and tool_use, as the chat splits
    them; display omitted: the block without its text; text the model wrote before its thinking comes first."""
    script = THINK + THOUGHT + END + "\n\nLet me look. " + SB + call("functions.get_weather:0", '{"city": "Oslo"}') + SE
    room = len(thinking.tokenizer.encode(script)) + 2
    body = {"max_tokens": room, "temperature": 0, "messages": [USER], "tools": [anthropic_tool(WEATHER)]}
    whole, text, ref = ask_anthropic(thinking, script, body,
                                     {"max_tokens": room, "temperature": 0, "messages": [USER], "tools": [WEATHER]})
    msg = ref["choices"][0]["message"]
    assert msg["reasoning_content"] == THOUGHT
    assert whole["content"] == [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                {"type": "text", "text": msg["content"]},
                                {"type": "tool_use", "id": "functions.get_weather:0", "name": "get_weather",
                                 "input": {"city": "Oslo"}}]
    assert whole["stop_reason"] == "tool_use"
    omitted, text, _ = ask_anthropic(thinking, script, {**body, "thinking": {"type": "enabled", "budget_tokens": 1024,
                                                                              "display": "omitted"}})
    assert omitted["content"] == [{**whole["content"][0], "thinking": ""}] + whole["content"][1:]
    assert "thinking_delta" not in text
    # Text before the reasoning (a kimi_k2 output the template did not open): text, thinking, text.
    whole, _, ref = ask_anthropic(thinking, "Hi " + THINK + "a b" + END + "c", {"max_tokens": 40, "temperature": 0,
                                                                                 "messages": [USER]},
                                  {"max_tokens": 40, "temperature": 0, "messages": [USER]})
    assert (ref["choices"][0]["message"]["reasoning_content"], ref["choices"][0]["message"]["content"]) == ("a b",
                                                                                                            "Hi c")
    assert [(b["type"], b.get("text", b.get("thinking"))) for b in whole["content"]] == [
        ("text", "Hi "), ("thinking", "a b"), ("text", "c")]
    # Cut inside the thinking: all thinking, max_tokens.
    cut = len(thinking.tokenizer.encode(THINK + THOUGHT[:20]))
    whole, _, _ = ask_anthropic(thinking, script, {**body, "max_tokens": cut})
    assert [b["type"] for b in whole["content"]] == ["thinking"] and whole["stop_reason"] == "max_tokens"
    assert THOUGHT.startswith(whole["content"][0]["thinking"])


def test_thinking_switch(k25):  # noqa: F811
    """Kimi-K2.5's template opens the thinking unless told not to: thinking enabled (or left out) -> a thinking
    block; disabled -> the template closes it and the answer is text; the prompts are the chat's with
    chat_template_kwargs thinking true / false (count_tokens = /v1/tokenize's count)."""
    thought = "Sunny, I think."
    enabled = {"type": "enabled", "budget_tokens": 2048}
    for setting in (enabled, None, {"type": "adaptive"}):
        body = {"max_tokens": 30, "temperature": 0, "messages": [USER],
                **({"thinking": setting} if setting else {})}
        whole, _, _ = ask_anthropic(k25, thought + END + "Yes.", body)
        assert whole["content"] == [{"type": "thinking", "thinking": thought, "signature": ""},
                                    {"type": "text", "text": "Yes."}], setting
    whole, _, _ = ask_anthropic(k25, "Just text.", {"max_tokens": 30, "temperature": 0, "messages": [USER],
                                                    "thinking": {"type": "disabled"}})
    assert whole["content"] == [{"type": "text", "text": "Just text."}] and whole["stop_reason"] == "end_turn"

    async def counts():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=k25.app), base_url="http://t") as h:
            out = []
            for on, thinking_param in ((True, enabled), (False, {"type": "disabled"})):
                a = await h.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": [USER],
                                                                    "thinking": thinking_param})
                b = await h.post("/v1/tokenize", json={"model": MODEL, "messages": [USER], "chat_template_kwargs": {
                    "thinking": on, "enable_thinking": on}})
                out.append((a.json()["input_tokens"], b.json()["count"]))
            return out

    (on_a, on_b), (off_a, off_b) = asyncio.run(counts())
    assert on_a == on_b and off_a == off_b and off_a > on_a  # (disabled: the template writes <think></think>)


# -- the API key and the body limit (an in-process app) ---------------------------------------------------------

@pytest.fixture(scope="module")
def keyed(tiny_model):
    with spec_engine(tiny_model, log_level="warning") as eng:
        driver = EngineDriver(eng, max_inflight=4)
        app = create_app(eng, driver, ServerConfig(served_model_name=MODEL, api_key="sekrit",
                                                   max_request_bytes=4096))
        driver.start()
        try:
            yield app
        finally:
            driver.stop()


def test_api_key_and_body_limit(keyed):
    """Anthropic's SDK sends the key as x-api-key (or Bearer with auth_token): both pass on /v1/messages; a wrong
    key is its AuthenticationError; x-api-key is not taken elsewhere; a body over the limit is a 413 in Anthropic's
    shape."""
    async def go():
        transport = httpx2.ASGITransport(app=keyed)
        async with httpx2.AsyncClient(transport=transport, base_url="http://t", timeout=120) as h:
            body = {"model": MODEL, "max_tokens": 3, "temperature": 0, "messages": [USER]}
            good = anthropic.AsyncAnthropic(api_key="sekrit", base_url="http://t", http_client=h, max_retries=0)
            bearer = anthropic.AsyncAnthropic(auth_token="sekrit", base_url="http://t", http_client=h, max_retries=0)
            bad = anthropic.AsyncAnthropic(api_key="wrong", base_url="http://t", http_client=h, max_retries=0)
            a = await good.messages.create(**sdk(body))
            b = await bearer.messages.create(**sdk(body))
            assert sdk_dump(a)["content"] == sdk_dump(b)["content"] and a.usage.output_tokens == 3
            # Anthropic's request-id header, which the SDK keeps: fresh a request, on its refusals too (below)
            ids = {a._request_id, b._request_id}
            assert len(ids) == 2 and all(re.fullmatch(r"req_[0-9a-f]{32}", i) for i in ids), ids
            assert (await good.messages.count_tokens(model=MODEL, messages=[USER])).input_tokens == a.usage.input_tokens
            with pytest.raises(anthropic.AuthenticationError) as e:
                await bad.messages.create(**sdk(body))
            assert e.value.body["error"]["type"] == "authentication_error"
            assert re.fullmatch(r"req_[0-9a-f]{32}", e.value.request_id) and e.value.request_id not in ids
            r = await h.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 3, "messages": [USER]},
                             headers={"x-api-key": "sekrit"})
            assert r.status_code == 401 and "error" in r.json() and "type" not in r.json()
            assert "request-id" not in r.headers  # (Anthropic's header: its endpoints alone)
            big = {**body, "messages": [{"role": "user", "content": "x" * 5000}]}
            r = await h.post("/v1/messages", json=big, headers={"x-api-key": "sekrit"})
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large", r.text
            assert r.headers["request-id"].startswith("req_")
            with pytest.raises(anthropic.APIStatusError) as e:
                await good.messages.create(**sdk(big))
            assert e.value.status_code == 413

    asyncio.run(go())
