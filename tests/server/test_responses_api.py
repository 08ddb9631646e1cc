"""OpenAI's Responses API (server/responses_api.py): POST /v1/responses.

Checked against independent readings, never against outputs of the code under test written down here:

- the ``openai`` SDK parsing our responses (``client.responses.create``, its ``output_text``), our streams (its own
  accumulation of the events, ``client.responses.stream``) and our errors (its typed exceptions);
- our /v1/chat/completions answer to the equivalent chat request, built here by hand from the Responses request
  (greedy, EAGLE-3 on): the same text, calls, token counts and finish;
- a raw reading of the SSE lines (``event:`` names the payload's type, sequence numbers count from 0, the deltas
  concatenate to the non-streamed items);
- the scripted tiny model of test_tools.py / test_reasoning.py / test_tools_reasoning_parity.py (fixtures imported
  from there) for what the random model cannot write: Kimi's tool-call markup and thinking; the tokenizer's own
  count of the scripted reasoning for ``reasoning_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import random

import httpx
import httpx2
import openai
import pytest

from .conftest import named_sse_events, post_chat, random_words
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


def resp_tool(tool: dict) -> dict:
    """An OpenAI chat tool of test_tools.py as the Responses API writes it (flat)."""
    f = tool["function"]
    return {"type": "function", "name": f["name"], **({"parameters": f["parameters"]} if "parameters" in f else {})}


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def raw_events(text: str) -> list[tuple[str, dict]]:
    """The SSE text as (event name, payload): each name is its payload's type, the sequence numbers 0, 1, 2, ..."""
    out = named_sse_events(text)
    assert [p["sequence_number"] for _, p in out] == list(range(len(out))), out
    return out


def items_of_events(events: list[tuple[str, dict]]) -> tuple[list[dict], dict]:
    """The output items rebuilt by hand from the events (deltas concatenated), and the final response; checks the
    events' order, indexes and item ids."""
    names = [n for n, _ in events]
    assert names[:2] == ["response.created", "response.in_progress"], names
    assert names[-1] in ("response.completed", "response.incomplete", "response.failed"), names
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == [] and created["usage"] is None
    items: list[dict] = []
    texts: dict[tuple, str] = {}
    open_item = None
    for name, p in events[2:-1]:
        if name == "response.output_item.added":
            assert open_item is None and p["output_index"] == len(items), p
            open_item = p["item"]
            items.append(None)
        elif name == "response.output_item.done":
            assert open_item is not None and p["item"]["id"] == open_item["id"], p
            items[p["output_index"]] = p["item"]
            open_item = None
        else:
            assert open_item is not None and p["item_id"] == open_item["id"], (name, p)
            assert p["output_index"] == len(items) - 1, p
            kind = name.removeprefix("response.")
            if kind.endswith(".delta"):
                key = (p["output_index"], kind[:-len(".delta")])
                texts[key] = texts.get(key, "") + p["delta"]
            elif kind in ("output_text.done", "reasoning_text.done", "reasoning_summary_text.done"):
                assert texts.get((p["output_index"], kind[:-len(".done")]), "") == p["text"], (texts, p)
            elif kind == "function_call_arguments.done":
                assert texts[(p["output_index"], "function_call_arguments")] == p["arguments"], p
    assert open_item is None
    # The done items hold what their deltas added up to.
    for i, item in enumerate(items):
        if item["type"] == "message":
            assert item["content"][0]["text"] == texts.get((i, "output_text"), "")
        elif item["type"] == "reasoning":
            assert item["content"][0]["text"] == texts.get((i, "reasoning_text"), "")
        else:
            assert item["arguments"] == texts[(i, "function_call_arguments")]
    return items, events[-1][1]["response"]


def without_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id" and v is not None} for item in items]


def check_stream(text: str, whole: dict) -> None:
    """The stream's text is the non-streamed response ``whole`` (raw events, items rebuilt by hand)."""
    items, final = items_of_events(raw_events(text))
    assert without_ids(items) == without_ids(whole["output"]), (items, whole["output"])
    assert without_ids(final["output"]) == without_ids(whole["output"])
    for k in ("status", "incomplete_details", "usage", "model", "tool_choice", "tools", "error"):
        assert final[k] == whole[k], k
    assert final["id"].startswith("resp_") and final["object"] == "response"


def output_text(resp: dict) -> str:
    return "".join(c["text"] for item in resp["output"] if item["type"] == "message" for c in item["content"])


# -- the live server (random tiny pair, no parsers) -----------------------------------------------------------------

def random_conversation(rng: random.Random) -> tuple[dict, list[dict]]:
    """(the Responses request's instructions / input, the equivalent chat messages) over random words."""
    body, msgs = {}, []
    if rng.random() < 0.5:
        body["instructions"] = random_words(rng, 3)
        msgs.append({"role": "system", "content": body["instructions"]})
    if rng.random() < 0.3:
        body["input"] = random_words(rng, rng.randint(1, 4))
        msgs.append({"role": "user", "content": body["input"]})
        return body, msgs
    items = []
    roles = [rng.choice(["system", "developer"])] if rng.random() < 0.3 else []
    roles += ["user", "assistant", "user"][:rng.choice([1, 3])]
    for role in roles:
        if rng.random() < 0.5:
            text = random_words(rng, rng.randint(1, 4))
            items.append({"role": role, "content": text} if rng.random() < 0.5 else
                         {"type": "message", "role": role, "content": text})
            msgs.append({"role": role, "content": text})
        else:
            texts = [random_words(rng, rng.randint(1, 3)) for _ in range(rng.randint(1, 2))]
            part = "output_text" if role == "assistant" else "input_text"
            items.append({"type": "message", "role": role, "content": [{"type": part, "text": t} for t in texts]})
            msgs.append({"role": role, "content": texts[0] if len(texts) == 1 else
                         [{"type": "text", "text": t} for t in texts]})
    body["input"] = items
    return body, msgs


@pytest.mark.parametrize("seed", range(4))
def test_answers_as_chat_does(server, seed):
    """Random greedy conversations: the SDK parses our response; its text, token counts and status are the chat
    endpoint's for the equivalent chat request; the stream (raw events, and the SDK's own accumulation) is the same
    response."""
    rng = random.Random(seed)
    body, equivalent = random_conversation(rng)
    max_tokens = rng.randint(1, 16)
    body = {"model": MODEL, "max_output_tokens": max_tokens, "temperature": 0, **body,
            "metadata": {"k": "v"}, "user": "u-1", "store": False}  # (accepted)
    c = client(server.url)
    resp = c.responses.create(**body)
    ref = post_chat(server.url, {"messages": equivalent, "max_tokens": max_tokens, "temperature": 0})
    choice = ref["choices"][0]
    assert resp.object == "response" and resp.model == MODEL and resp.id.startswith("resp_")
    assert resp.output_text == choice["message"]["content"]
    assert [item.type for item in resp.output] == (["message"] if resp.output_text else [])
    assert resp.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert resp.usage.output_tokens == ref["usage"]["completion_tokens"] == max_tokens  # (no eos in the tiny pair)
    assert resp.usage.total_tokens == ref["usage"]["total_tokens"]
    assert resp.usage.output_tokens_details.reasoning_tokens == 0
    assert choice["finish_reason"] == "length"
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert (resp.temperature, resp.max_output_tokens, resp.metadata, resp.user) == (0, max_tokens, {"k": "v"}, "u-1")
    assert resp.instructions == body.get("instructions") and resp.store is False
    whole = httpx.post(server.url + "/v1/responses", json=body, timeout=120).json()
    assert without_ids(whole["output"]) == without_ids(resp.model_dump(exclude_none=True)["output"])
    r = httpx.post(server.url + "/v1/responses", json={**body, "stream": True}, timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    check_stream(r.text, whole)
    # The SDK's own reading of the stream: its text deltas, and its events' types.
    streamed, kinds = [], []
    for event in c.responses.create(**body, stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            streamed.append(event.delta)
    assert "".join(streamed) == choice["message"]["content"] and kinds[-1] == "response.incomplete"


def test_logprobs_are_the_chats(server):
    """include message.output_text.logprobs (SGLang 0.5.23's Responses): the first message's output_text carries the
    chat's logprobs of the same request, every generated token's, with top_logprobs alternatives a position;
    top_logprobs alone asks for nothing."""
    rng = random.Random()
    prompt, n, top = " ".join(random_words(rng, rng.randint(2, 8))), rng.randint(2, 9), rng.randint(0, 5)
    body = {"model": MODEL, "input": prompt, "max_output_tokens": n, "temperature": 0,
            "include": ["message.output_text.logprobs"], "top_logprobs": top}
    resp = httpx.post(server.url + "/v1/responses", json=body, timeout=120).json()
    ref = post_chat(server.url, {"messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                                 "temperature": 0, "logprobs": True, "top_logprobs": top})
    [item] = [i for i in resp["output"] if i["type"] == "message"]
    got = item["content"][0]["logprobs"]
    assert got == ref["choices"][0]["logprobs"]["content"] and len(got) == n
    assert all(len(t["top_logprobs"]) == top for t in got)
    assert item["content"][0]["text"] == ref["choices"][0]["message"]["content"]
    # the SDK reads them
    parsed = client(server.url).responses.create(**body)
    assert [t.logprob for t in parsed.output[0].content[0].logprobs] == [t["logprob"] for t in got]
    plain = httpx.post(server.url + "/v1/responses", json={**body, "include": []}, timeout=120).json()
    assert plain["output"][0]["content"][0]["logprobs"] == []


def test_function_call_history_renders_as_the_chat(server):
    """A conversation with reasoning, message, function_call and function_call_output items counts the prompt
    tokens the chat counts for the chat messages written here; tool_choice none answers as the chat does."""
    tools = [resp_tool(PING), resp_tool(COUNT)]
    items = [
        USER,
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hm"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
        {"type": "function_call", "call_id": "call_1", "name": "count", "arguments": '{"n": 3, "tag": "ü"}'},
        {"type": "function_call", "call_id": "call_2", "name": "ping", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "3"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "down"}, {"type": "input_text", "text": "again"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "And now?"}]},
    ]
    equivalent = [
        USER,
        {"role": "assistant", "content": "Let me see.", "reasoning_content": "hm", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "count", "arguments": '{"n": 3, "tag": "ü"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "ping", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2",
         "content": [{"type": "text", "text": "down"}, {"type": "text", "text": "again"}]},
        {"role": "user", "content": "And now?"},
    ]
    chat_tools = [PING, COUNT]
    resp = client(server.url).responses.create(model=MODEL, input=items, tools=tools, tool_choice="none",
                                               max_output_tokens=8, temperature=0)
    ref = post_chat(server.url, {"messages": equivalent, "tools": chat_tools, "tool_choice": "none", "max_tokens": 8,
                            "temperature": 0})
    assert resp.output_text == ref["choices"][0]["message"]["content"]
    assert resp.usage.input_tokens == ref["usage"]["prompt_tokens"]
    # A function_call with no assistant message before it: an assistant message of its own.
    alone = [USER, items[3], items[5]]
    resp = client(server.url).responses.create(model=MODEL, input=alone, tools=tools, tool_choice="none",
                                               max_output_tokens=4, temperature=0)
    ref = post_chat(server.url, {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        equivalent[1]["tool_calls"][0]]}, equivalent[2]], "tools": chat_tools, "tool_choice": "none",
        "max_tokens": 4, "temperature": 0})
    assert resp.usage.input_tokens == ref["usage"]["prompt_tokens"]
    assert resp.output_text == ref["choices"][0]["message"]["content"]


# -- errors --------------------------------------------------------------------------------------------------------

PING_R = resp_tool(PING)
BAD = [  # (changes to a good body, the param the 400 names)
    ({"input": None}, "input"),
    ({"input": []}, "input"),
    ({"input": 5}, "input"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input.0.role"),
    ({"input": [{"role": "user"}]}, "input.0.content"),
    ({"input": ["hi"]}, "input.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/a.png"}]}]},
     "input.0.content.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input.0.content.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input.0.content.0.text"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input.0.type"),
    ({"input": [USER, {"type": "function_call", "name": "ping", "arguments": "{}"}]}, "input.1.call_id"),
    ({"input": [USER, {"type": "function_call", "call_id": "c", "name": "ping", "arguments": {}}]},
     "input.1.arguments"),
    ({"input": [USER, {"type": "function_call_output", "call_id": "c", "output": 5}]}, "input.1.output"),
    ({"input": [USER, {"type": "function_call_output", "call_id": "c",
                       "output": [{"type": "input_image", "image_url": "x"}]}]}, "input.1.output.0.type"),
    ({"input": [{"type": "reasoning", "summary": "x"}, USER]}, "input.0.summary"),
    ({"model": 5}, "model"),
    ({"instructions": 5}, "instructions"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"max_output_tokens": "5"}, "max_output_tokens"),
    ({"max_output_tokens": 10 ** 6}, "max_output_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 5.0}, "top_p"),
    ({"stream": "yes"}, "stream"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"], "stream": True}, "include.0"),  # (as SGLang's)
    ({"include": ["message.output_text.logprobs"], "top_logprobs": -1, "stream": False}, "top_logprobs"),
    ({"include": ["reasoning.encrypted_content", "message.output_text.logprobs"], "tools": [PING_R],
      "tool_choice": "required", "stream": False}, "include.1"),
    ({"include": ["file_search_call.results"]}, "include.0"),
    ({"max_tool_calls": 2}, "max_tool_calls"),
    ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools.0.type"),
    ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools.0.type"),
    ({"tools": [{"type": "function"}]}, "tools.0.name"),
    ({"tools": [{"type": "function", "name": "bad name!"}], "tool_choice": "required"}, "tools.0.name"),
    ({"tools": [PING_R, PING_R], "tool_choice": "required"}, "tools.1.name"),
    ({"tools": [{**PING_R, "strict": "yes"}]}, "tools.0.strict"),
    ({"tools": [PING_R], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"tools": [PING_R], "tool_choice": {"type": "web_search"}}, "tool_choice.type"),
    ({"tools": [PING_R], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [PING_R]}, "tool_choice"),  # (auto, on a server without --tool-call-parser)
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"reasoning": {"summary": "long"}}, "reasoning.summary"),
    ({"text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"metadata": "x"}, "metadata"),
]


@pytest.mark.parametrize("change,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_client_mistakes_are_400_naming_the_field(server, change, param):
    body = {"model": MODEL, "max_output_tokens": 4, "input": "Pack my box", **change}
    body = {k: v for k, v in body.items() if v is not None}
    for stream in (False, True):
        r = httpx.post(server.url + "/v1/responses", json={**body, "stream": stream} if "stream" not in change
                       else body, timeout=60)
        assert r.status_code == 400, (change, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", err
        assert err["param"] == param, (param, err)


def test_errors_the_sdk_reads(server):
    c = client(server.url)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model="gpt-5", input="hi", max_output_tokens=4)
    assert "gpt-5" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "auto"}]}])
    assert e.value.body["param"] == "input.0.content.0.type"
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="hi", previous_response_id="resp_abc")
    assert e.value.body["param"] == "previous_response_id"
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_abc")
    with pytest.raises(openai.NotFoundError):
        c.responses.delete("resp_abc")
    r = httpx.post(server.url + "/v1/responses", content=b"{nope")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


# -- forced tool calls (the live server with the names template and the kimi_k2 parser) ----------------------------

@pytest.mark.parametrize("choice,chat_choice", [
    ("required", "required"),
    ({"type": "function", "name": "count"}, {"type": "function", "function": {"name": "count"}}),
])
def test_forced_calls_are_the_chats(tool_server, choice, chat_choice):  # noqa: F811
    """tool_choice required / a named function: the chat's forced calls (greedy) as function_call items, their
    call_id the chat's ids and their arguments its arguments; parallel_tool_calls false passes on; streamed the
    same; cut short: the chat's text as a message, incomplete."""
    c = client(tool_server.url)
    tools = [resp_tool(t) for t in FORCED_TOOLS]
    outcomes = set()
    for max_tokens, parallel in ((90, None), (90, False), (12, None)):
        messages = [USER]
        body = {"model": MODEL, "max_output_tokens": max_tokens, "temperature": 0, "input": messages,
                "tools": tools, "tool_choice": choice,
                **({"parallel_tool_calls": parallel} if parallel is not None else {})}
        resp = c.responses.create(**body)
        ref = post_chat(tool_server.url, {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                     "tools": FORCED_TOOLS, "tool_choice": chat_choice,
                                     **({"parallel_tool_calls": parallel} if parallel is not None else {})})
        ch = ref["choices"][0]
        outcomes.add(ch["finish_reason"])
        if ch["finish_reason"] == "tool_calls":
            assert resp.status == "completed" and all(i.type == "function_call" for i in resp.output), resp
            assert [(i.call_id, i.name, i.arguments) for i in resp.output] == [
                (t["id"], t["function"]["name"], t["function"]["arguments"]) for t in ch["message"]["tool_calls"]]
            assert all(i.id.startswith("fc_") and i.status == "completed" for i in resp.output)
            assert resp.parallel_tool_calls is (parallel is not False)
        else:
            assert resp.status == "incomplete" and resp.output_text == ch["message"]["content"]
        assert resp.usage.output_tokens == ref["usage"]["completion_tokens"]
        whole = httpx.post(tool_server.url + "/v1/responses", json=body, timeout=120).json()
        r = httpx.post(tool_server.url + "/v1/responses", json={**body, "stream": True}, timeout=120)
        check_stream(r.text, whole)
    assert outcomes == {"tool_calls", "length"}


# -- the scripted model: Kimi's call markup, thinking ----------------------------------------------------------------

def ask(app_holder, script: str | None, body: dict, chat_body: dict | None = None):
    """For one request whose output is ``script``: the raw non-streamed response (checked against the SDK's parse
    and its accumulation of the stream), the raw stream's text (checked against it), and the chat's answer to
    ``chat_body`` (if given)."""
    body = {"model": MODEL, **body}

    async def go():
        transport = httpx2.ASGITransport(app=app_holder.app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://t", timeout=120) as h:
            sdk = openai.AsyncOpenAI(api_key="none", base_url="http://t/v1", http_client=h, max_retries=0)
            whole = await h.post("/v1/responses", json=body)
            streamed = await h.post("/v1/responses", json={**body, "stream": True})
            resp = await sdk.responses.create(**body)
            final = None
            async with sdk.responses.stream(**body) as s:
                async for _ in s:
                    pass
                if whole.json().get("status") == "completed":
                    final = await s.get_final_response()
            ref = None
            if chat_body is not None:
                ref = await h.post("/v1/chat/completions", json={"model": MODEL, **chat_body})
            return whole, streamed, resp, final, ref

    app_holder.script, app_holder.seen[:] = script, []
    try:
        whole, streamed, resp, final, ref = asyncio.run(go())
    finally:
        app_holder.script = None
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    whole = whole.json()
    assert without_ids(resp.model_dump(exclude_none=True)["output"]) == without_ids(whole["output"])
    if final is not None:
        assert without_ids(final.model_dump(exclude_none=True)["output"]) == without_ids(whole["output"])
        assert final.output_text == resp.output_text == output_text(whole)
    check_stream(streamed.text, whole)
    if ref is not None:
        assert ref.status_code == 200, ref.text
        ref = ref.json()
    return whole, streamed.text, ref


AUTO_CALLS = [("get_weather", TRICKY), ("add", {"a": 2, "b": {"c": "}"}})]


def test_auto_function_calls_and_the_turn_after(scripted):  # noqa: F811
    """Kimi's markup read by --tool-call-parser: a message, then function_call items with Kimi's ids as call_id,
    the chat's calls; the client's next turn (the output items back, a function_call_output for each call) renders
    as the chat messages written here (the same input_tokens), and its calls' ids count the earlier ones."""
    room = len(scripted.tokenizer.encode(AUTO_SCRIPT)) + 2
    tools = [resp_tool(WEATHER), resp_tool(ADD)]
    whole, _, ref = ask(scripted, AUTO_SCRIPT, {"max_output_tokens": room, "temperature": 0, "input": [USER],
                                                "tools": tools},
                        {"max_tokens": room, "temperature": 0, "messages": [USER], "tools": [WEATHER, ADD]})
    assert whole["status"] == "completed"
    calls = ref["choices"][0]["message"]["tool_calls"]
    out = whole["output"]
    assert [i["type"] for i in out] == ["message", "function_call", "function_call"]
    assert out[0]["content"][0]["text"] == AUTO_CONTENT == ref["choices"][0]["message"]["content"]
    assert [(i["call_id"], i["name"], i["arguments"]) for i in out[1:]] == [
        (t["id"], t["function"]["name"], t["function"]["arguments"]) for t in calls]
    assert [(i["name"], json.loads(i["arguments"])) for i in out[1:]] == AUTO_CALLS
    assert whole["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]
    assert whole["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
    history = [USER, *out] + [{"type": "function_call_output", "call_id": i["call_id"], "output": f"r{k}"}
                              for k, i in enumerate(out[1:])]
    equivalent = [USER, {"role": "assistant", "content": AUTO_CONTENT, "tool_calls": [
        {k: t[k] for k in ("id", "type", "function")} for t in calls]}] + [
        {"role": "tool", "tool_call_id": t["id"], "content": f"r{k}"} for k, t in enumerate(calls)]
    script = SB + call("functions.add:0", '{"a": 1, "b": 2}') + SE
    room = len(scripted.tokenizer.encode(script)) + 2
    whole2, _, ref2 = ask(scripted, script, {"max_output_tokens": room, "temperature": 0, "input": history,
                                             "tools": tools},
                          {"max_tokens": room, "temperature": 0, "messages": equivalent, "tools": [WEATHER, ADD]})
    assert [i["call_id"] for i in whole2["output"]] == [t["id"] for t in ref2["choices"][0]["message"]["tool_calls"]]
    assert [(i["call_id"], json.loads(i["arguments"])) for i in whole2["output"]] == [
        ("functions.add:2", {"a": 1, "b": 2})]
    assert whole2["usage"]["input_tokens"] == ref2["usage"]["prompt_tokens"]


def test_auto_cut_inside_a_call(scripted):  # noqa: F811
    """Cut inside a call by max_output_tokens: the complete calls before it, status incomplete (the chat's
    finish_reason length)."""
    ids = scripted.tokenizer.encode(AUTO_SCRIPT)
    [ce] = scripted.tokenizer.encode("<|tool_call_end|>")
    cut = ids.index(ce) + 3
    whole, _, ref = ask(scripted, AUTO_SCRIPT, {"max_output_tokens": cut, "temperature": 0, "input": [USER],
                                                "tools": [resp_tool(WEATHER), resp_tool(ADD)]},
                        {"max_tokens": cut, "temperature": 0, "messages": [USER], "tools": [WEATHER, ADD]})
    assert ref["choices"][0]["finish_reason"] == "length"
    assert whole["status"] == "incomplete" and whole["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["call_id"] for i in whole["output"] if i["type"] == "function_call"] == [
        t["id"] for t in ref["choices"][0]["message"]["tool_calls"]]


def test_reasoning_items(thinking):  # noqa: F811
    """--reasoning-parser kimi_k2: a reasoning item with the reasoning (as summary too with reasoning.summary),
    then a message and a function_call, as the chat splits them; reasoning_tokens the tokenizer's count of the
    thinking with its markers; text the model wrote before its thinking comes first."""
    script = THINK + THOUGHT + END + "\n\nLet me look. " + SB + call("functions.get_weather:0", '{"city": "Oslo"}') + SE
    room = len(thinking.tokenizer.encode(script)) + 2
    body = {"max_output_tokens": room, "temperature": 0, "input": [USER], "tools": [resp_tool(WEATHER)]}
    whole, text, ref = ask(thinking, script, body,
                           {"max_tokens": room, "temperature": 0, "messages": [USER], "tools": [WEATHER]})
    msg = ref["choices"][0]["message"]
    assert msg["reasoning_content"] == THOUGHT
    out = whole["output"]
    assert [i["type"] for i in out] == ["reasoning", "message", "function_call"]
    assert out[0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}] and out[0]["summary"] == []
    assert out[1]["content"][0]["text"] == msg["content"]
    assert (out[2]["call_id"], out[2]["name"], json.loads(out[2]["arguments"])) == (
        "functions.get_weather:0", "get_weather", {"city": "Oslo"})
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == len(
        thinking.tokenizer.encode(THINK + THOUGHT + END))
    assert whole["usage"]["output_tokens"] == ref["usage"]["completion_tokens"]
    assert "response.reasoning_text.delta" in text and "reasoning_summary" not in text
    summarized, text, _ = ask(thinking, script, {**body, "reasoning": {"summary": "auto"},
                                                 "include": ["reasoning.encrypted_content"]})
    assert summarized["output"][0]["summary"] == [{"type": "summary_text", "text": THOUGHT}]
    assert "response.reasoning_summary_text.delta" in text
    # The reasoning item back in the next turn: the assistant message's reasoning_content.
    history = [USER, *whole["output"], {"type": "function_call_output", "call_id": out[2]["call_id"], "output": "9"}]
    equivalent = [USER, {"role": "assistant", "content": msg["content"], "reasoning_content": THOUGHT,
                         "tool_calls": [{k: t[k] for k in ("id", "type", "function")} for t in msg["tool_calls"]]},
                  {"role": "tool", "tool_call_id": out[2]["call_id"], "content": "9"}]
    nxt, _, ref2 = ask(thinking, "Sunny.", {"max_output_tokens": 20, "temperature": 0, "input": history,
                                           "tools": [resp_tool(WEATHER)]},
                       {"max_tokens": 20, "temperature": 0, "messages": equivalent, "tools": [WEATHER]})
    assert nxt["usage"]["input_tokens"] == ref2["usage"]["prompt_tokens"] and output_text(nxt) == "Sunny."
    assert nxt["status"] == "completed" and nxt["usage"]["output_tokens_details"]["reasoning_tokens"] == 0
    # Text before the reasoning: message, reasoning, message.
    whole, _, ref = ask(thinking, "Hi " + THINK + "a b" + END + "c", {"max_output_tokens": 40, "temperature": 0,
                                                                      "input": [USER]},
                        {"max_tokens": 40, "temperature": 0, "messages": [USER]})
    assert (ref["choices"][0]["message"]["reasoning_content"], ref["choices"][0]["message"]["content"]) == (
        "a b", "Hi c")
    assert [(i["type"], i["content"][0]["text"]) for i in whole["output"]] == [
        ("message", "Hi "), ("reasoning", "a b"), ("message", "c")]
    # Cut inside the thinking: all reasoning, incomplete, every output token a reasoning token.
    cut = len(thinking.tokenizer.encode(THINK + THOUGHT[:20]))
    whole, _, _ = ask(thinking, script, {**body, "max_output_tokens": cut})
    assert [i["type"] for i in whole["output"]] == ["reasoning"] and whole["status"] == "incomplete"
    assert whole["output"][0]["status"] == "incomplete"
    assert THOUGHT.startswith(whole["output"][0]["content"][0]["text"])
    assert whole["usage"]["output_tokens_details"]["reasoning_tokens"] == whole["usage"]["output_tokens"] == cut


def test_reasoning_effort_switches_kimi_thinking(k25):  # noqa: F811
    """Kimi-K2.5's template opens the thinking unless told not to: reasoning.effort left out or high -> a reasoning
    item; effort none -> the template closes it and the answer is a message; the prompts are the chat's with the
    same reasoning_effort (the same input_tokens)."""
    thought = "Sunny, I think."
    for effort in (None, "high"):
        body = {"max_output_tokens": 30, "temperature": 0, "input": [USER],
                **({"reasoning": {"effort": effort}} if effort else {})}
        whole, _, ref = ask(k25, thought + END + "Yes.", body,
                            {"max_tokens": 30, "temperature": 0, "messages": [USER],
                             **({"reasoning_effort": effort} if effort else {})})
        assert [(i["type"], i["content"][0]["text"]) for i in whole["output"]] == [
            ("reasoning", thought), ("message", "Yes.")], effort
        assert whole["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
        assert whole["reasoning"]["effort"] == effort
    whole, _, ref = ask(k25, "Just text.", {"max_output_tokens": 30, "temperature": 0, "input": [USER],
                                            "reasoning": {"effort": "none"}},
                        {"max_tokens": 30, "temperature": 0, "messages": [USER], "reasoning_effort": "none"})
    assert [(i["type"], i["content"][0]["text"]) for i in whole["output"]] == [("message", "Just text.")]
    assert whole["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]
