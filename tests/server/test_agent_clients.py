"""The request shapes real agent clients send, on /v1/responses (Codex CLI, the ``openai`` SDK's ``client.responses``)
and /v1/messages (Claude Code, the ``anthropic`` SDK against ``ANTHROPIC_BASE_URL``).

Each body below is written from where the client builds it (cited at the shape). The server must answer them, and
is checked against independent readings only: the chat endpoint's answer to the equivalent chat request written
here by hand (the same prompt tokens, the same calls), the SDKs' own parsing of our answers and of our streams, and
a raw reading of the SSE. Where a shape is refused on purpose, the 400 names the field and says what to change.

The scripted tiny model of test_tools.py (Kimi's call markup, --tool-call-parser kimi_k2; its chat template shows
the tools by name, its context is 256 tokens) writes the calls the random model cannot; the texts here are short.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx2
import openai
import pytest

from .conftest import named_sse_events
from .test_tools import MODEL, SB, SE, call, scripted  # noqa: F401  (scripted: a fixture)

pytestmark = pytest.mark.usefixtures("torch_one_thread")


# -- Codex CLI: POST {base_url}/responses ---------------------------------------------------------------------------
# openai/codex codex-rs/codex-api/src/common.rs (ResponsesApiRequest): model, instructions, input, tools (always a
# list, [] where none), tool_choice "auto" (always), parallel_tool_calls, reasoning ({effort, summary} or null), store
# (false but on Azure), stream true, include (["reasoning.encrypted_content"] where reasoning is on), prompt_cache_key,
# text {verbosity, format json_schema "codex_output_schema"}, service_tier.
# Tools: openai/codex codex-rs/core/src/client_common.rs (ToolSpec): {"type": "function", name, description, strict,
# parameters}, {"type": "local_shell"}, {"type": "web_search"}, {"type": "custom", name, description, format: {type:
# "grammar", syntax: "lark", definition}} (the freeform apply_patch tool).
# Input items: openai/codex codex-rs/protocol/src/models.rs (ResponseItem): message {role, content: input_text /
# output_text parts} (ids not sent), reasoning {summary, content (reasoning_text or "text" parts, or null),
# encrypted_content}, function_call {name, arguments, call_id}, function_call_output {call_id, output: a string or
# input_text parts}, custom_tool_call {status, call_id, name, input}, custom_tool_call_output {call_id, output},
# local_shell_call {call_id, status, action: {type: "exec", command, timeout_ms, working_directory, env, user}}.

SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command.", "strict": False,
         "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}},
                                                         "workdir": {"type": "string"},
                                                         "timeout_ms": {"type": "number"}},
                        "required": ["command"], "additionalProperties": False}}
GRAMMAR = 'start: "*** Begin Patch" LF hunk+ "*** End Patch" LF?\nhunk: /.+/ LF\n%import common.LF'
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
               "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}
LOCAL_SHELL = {"type": "local_shell"}
PATCH = "*** Begin Patch\n*** Add File: a\n+hi\n*** End Patch"


def codex_body(input_items, tools, **more) -> dict:
    return {"model": MODEL, "instructions": "Be Codex.", "input": input_items, "tools": tools, "tool_choice": "auto",
            "parallel_tool_calls": False, "reasoning": {"effort": "medium", "summary": "auto"}, "store": False,
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "0199-a1b2", "text": {"verbosity": "low"},
            "service_tier": "auto", "temperature": 0, **more}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def fn_tool(name: str, parameters: dict, description: str = "") -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def post(app, path: str, body: dict, headers: dict | None = None):
    async def go():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://t", timeout=120) as h:
            return await h.post(path, json=body, headers=headers or {})
    return asyncio.run(go())


def responses_both(holder, script: str | None, body: dict):
    """The non-streamed response (raw and as the SDK parses it), the raw stream's events and the SDK's response
    accumulated from its own stream, for one request whose output is ``script``."""
    async def go():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=holder.app), base_url="http://t",
                                      timeout=120) as h:
            sdk = openai.AsyncOpenAI(api_key="none", base_url="http://t/v1", http_client=h, max_retries=0)
            whole = await h.post("/v1/responses", json={**body, "stream": False})
            streamed = await h.post("/v1/responses", json={**body, "stream": True})
            extra = {k: body[k] for k in ("service_tier",) if k in body}
            args = {k: v for k, v in body.items() if k not in extra and k != "stream"}
            parsed = await sdk.responses.create(**args, extra_body=extra)
            final = None
            async with sdk.responses.stream(**args, extra_body=extra) as s:
                async for _ in s:
                    pass
                if whole.json().get("status") == "completed":  # (the SDK's final response: completed ones only)
                    final = await s.get_final_response()
            return whole, streamed, parsed, final

    holder.script, holder.seen[:] = script, []
    try:
        whole, streamed, parsed, final = asyncio.run(go())
    finally:
        holder.script = None
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    whole = whole.json()
    events = named_sse_events(streamed.text)
    assert [p["sequence_number"] for _, p in events] == list(range(len(events)))
    assert all(name == p["type"] for name, p in events)

    def strip(value, top=True):  # (ids are fresh each time; null fields are what the SDK leaves out)
        if isinstance(value, list):
            return [strip(v, top) for v in value]
        if isinstance(value, dict):
            return {k: strip(v, False) for k, v in value.items() if v is not None and not (top and k == "id")}
        return value
    assert strip(parsed.model_dump(exclude_none=True)["output"]) == strip(whole["output"])
    if final is not None:
        assert strip(final.model_dump(exclude_none=True)["output"]) == strip(whole["output"])
    assert strip(events[-1][1]["response"]["output"]) == strip(whole["output"])
    return whole, events, parsed


def chat_prompt_tokens(holder, body: dict) -> int:
    r = post(holder.app, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


def test_codex_history_renders_as_the_chat(scripted):  # noqa: F811
    """A Codex turn with every item kind its history holds (developer message, reasoning with encrypted_content and
    Codex's "text" content parts, function / custom / local_shell calls and their outputs) and its three client-run
    tool kinds: the prompt is the chat's for the equivalent messages and functions written here."""
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<perm>"}]},
        user("fix it"),
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look"}], "content": None,
         "encrypted_content": "gAAAAABo-opaque"},
        {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        {"type": "custom_tool_call", "status": "completed", "call_id": "c2", "name": "apply_patch", "input": PATCH},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {"type": "local_shell_call", "call_id": "c3", "status": "completed",
         "action": {"type": "exec", "command": ["pwd"], "timeout_ms": None, "working_directory": None, "env": None,
                    "user": None}},
        {"type": "function_call_output", "call_id": "c3", "output": "/w"},
        {"type": "reasoning", "summary": [], "content": [{"type": "text", "text": "ok"}], "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Fixed."}]},
        user("thanks"),
    ]
    body = codex_body(items, [SHELL, APPLY_PATCH, LOCAL_SHELL], max_output_tokens=3)
    whole, _, _ = responses_both(scripted, None, body)
    # The equivalent chat: the custom tool a function taking its text as "input", local_shell one taking the exec
    # action's fields (what the model is offered), each call of the history as the tool call the model made.
    tc = [("c1", "shell", '{"command":["ls"]}'), ("c2", "apply_patch", json.dumps({"input": PATCH})),
          ("c3", "local_shell", '{"command": ["pwd"]}')]
    messages = [{"role": "system", "content": "Be Codex."}, {"role": "developer", "content": "<perm>"},
                {"role": "user", "content": "fix it"}]
    for (cid, name, args), out in zip(tc, ["a.py", "Done!", "/w"], strict=True):
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}],
            **({"reasoning_content": "look"} if cid == "c1" else {})})
        messages.append({"role": "tool", "tool_call_id": cid, "content": out})
    messages += [{"role": "assistant", "content": "Fixed.", "reasoning_content": "ok"},
                 {"role": "user", "content": "thanks"}]
    tools = [fn_tool("shell", SHELL["parameters"]), fn_tool("apply_patch", {}), fn_tool("local_shell", {})]
    assert whole["usage"]["input_tokens"] == chat_prompt_tokens(scripted, {"messages": messages, "tools": tools})
    assert [t["type"] for t in whole["tools"]] == ["function", "custom", "local_shell"]


def test_codex_custom_tool_call_out(scripted):  # noqa: F811
    """The model calls the freeform apply_patch tool (a function with one "input" string): Codex gets a
    custom_tool_call item whose input is the text, the SDK parses it (ResponseCustomToolCall), the stream sends it
    as custom_tool_call_input deltas; the call is the chat's."""
    script = SB + call("functions.apply_patch:0", json.dumps({"input": PATCH})) + SE
    room = len(scripted.tokenizer.encode(script)) + 2
    body = codex_body([user("add a")], [SHELL, APPLY_PATCH], max_output_tokens=room)
    whole, events, parsed = responses_both(scripted, script, body)
    [item] = parsed.output
    assert isinstance(item, openai.types.responses.ResponseCustomToolCall)
    assert (item.name, item.input, item.call_id) == ("apply_patch", PATCH, "functions.apply_patch:0")
    deltas = "".join(p["delta"] for n, p in events if n == "response.custom_tool_call_input.delta")
    [done] = [p for n, p in events if n == "response.custom_tool_call_input.done"]
    assert deltas == done["input"] == PATCH
    scripted.script = script
    try:
        ref = post(scripted.app, "/v1/chat/completions", {
            "model": MODEL, "messages": [{"role": "system", "content": "Be Codex."}, {"role": "user",
                                                                                       "content": "add a"}],
            "tools": [fn_tool("shell", SHELL["parameters"]), fn_tool("apply_patch", {})], "max_tokens": room,
            "temperature": 0}).json()
    finally:
        scripted.script = None
    [tc] = ref["choices"][0]["message"]["tool_calls"]
    assert (tc["id"], json.loads(tc["function"]["arguments"])["input"]) == (item.call_id, item.input)
    assert whole["usage"]["input_tokens"] == ref["usage"]["prompt_tokens"]


def test_codex_local_shell_call_out(scripted):  # noqa: F811
    """The model calls local_shell: a local_shell_call item with the exec action (the SDK parses it)."""
    args = {"command": ["ls", "-la"], "working_directory": "/w"}
    script = SB + call("functions.local_shell:0", json.dumps(args)) + SE
    room = len(scripted.tokenizer.encode(script)) + 2
    whole, events, parsed = responses_both(scripted, script, codex_body([user("list")], [LOCAL_SHELL],
                                                                         max_output_tokens=room))
    [item] = parsed.output
    assert item.type == "local_shell_call" and item.call_id == "functions.local_shell:0"
    assert (item.action.type, item.action.command, item.action.working_directory) == ("exec", ["ls", "-la"], "/w")
    assert [n for n, _ in events if "output_item" in n] == ["response.output_item.added", "response.output_item.done"]


def test_codex_empty_tools_and_effort_values(scripted):  # noqa: F811
    """Codex sends "tools": [] with tool_choice "auto" where it offers none: answered as no tools (the chat's
    prompt); its effort tiers (none ... xhigh) and summary "none" are taken."""
    body = codex_body([user("hi")], [], max_output_tokens=2)
    whole, _, _ = responses_both(scripted, None, body)
    assert whole["usage"]["input_tokens"] == chat_prompt_tokens(scripted, {"messages": [
        {"role": "system", "content": "Be Codex."}, {"role": "user", "content": "hi"}]})
    for effort in ("none", "minimal", "low", "high", "xhigh"):
        r = post(scripted.app, "/v1/responses", {**body, "reasoning": {"effort": effort, "summary": "none"}})
        assert r.status_code == 200, (effort, r.text)
    r = post(scripted.app, "/v1/responses", {**body, "reasoning": None})
    assert r.status_code == 200, r.text


def test_codex_web_search_is_refused_saying_what_to_change(scripted):  # noqa: F811
    """Codex's default web search (cached, a hosted tool: developers.openai.com/codex web-search docs) would run on
    OpenAI's servers: a 400 naming the tool and Codex's setting that turns it off, never a silent drop."""
    for tool in ({"type": "web_search"}, {"type": "web_search", "external_web_access": False}):
        r = post(scripted.app, "/v1/responses", codex_body([user("hi")], [SHELL, tool], max_output_tokens=2))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "tools.1.type" and 'web_search = "disabled"' in err["message"], err


# -- Claude Code: POST {ANTHROPIC_BASE_URL}/v1/messages ----------------------------------------------------------------
# System: text blocks, the first Claude Code's attribution line ("x-anthropic-billing-header: cc_version=...",
# ujisati/claude-code-provider-proxy pull #23), the last with cache_control; cache_control on message blocks and on the
# last tool; empty text blocks (anthropics/claude-code issues #52057, #55689: "cache_control cannot be set for empty
# text blocks"); context_management {edits: [{type: "clear_thinking_20251015", keep: "all"}]} (anthropics/claude-code
# issue #26215, inflaborg/ccrelay pull #104, automazeio/vibeproxy issue #509); metadata {user_id}; thinking enabled
# with a budget; tool input_schemas as zod-to-json-schema writes them ("$schema": draft-07, additionalProperties
# false, format "uri"); tool_result content as text blocks; anthropic-beta / anthropic-version headers
# (claude-code-20250219, interleaved-thinking-2025-05-14, context-management-2025-06-27, ...).

SCHEMA_07 = "http://json-schema.org/draft-07/schema#"
CC_TOOLS = [
    {"name": "Bash", "description": "Run a command.", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}},
        "required": ["command"], "additionalProperties": False, "$schema": SCHEMA_07}},
    {"name": "WebFetch", "description": "Fetch a page.", "input_schema": {
        "type": "object", "properties": {"url": {"type": "string", "format": "uri"}, "prompt": {"type": "string"}},
        "required": ["url", "prompt"], "additionalProperties": False, "$schema": SCHEMA_07},
     "cache_control": {"type": "ephemeral"}},
]
CC_HEADERS = {"anthropic-version": "2023-06-01", "x-app": "cli",
              "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                                "fine-grained-tool-streaming-2025-05-14,context-management-2025-06-27"}
BILLING = "x-anthropic-billing-header: cc_version=2.1.0.abc; cc_entrypoint=cli;"
EPHEMERAL = {"type": "ephemeral"}


def claude_code_body(**more) -> dict:
    return {
        "model": MODEL, "max_tokens": 3, "temperature": 0, "stream": False,
        "system": [{"type": "text", "text": BILLING},
                   {"type": "text", "text": "Be Claude.", "cache_control": EPHEMERAL}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<reminder>"},
                                         {"type": "text", "text": "ls", "cache_control": EPHEMERAL}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "run it", "signature": ""},
                                              {"type": "text", "text": ""},
                                              {"type": "tool_use", "id": "toolu_1", "name": "Bash",
                                               "input": {"command": "ls"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": False,
                                          "content": [{"type": "text", "text": "a.py", "cache_control": EPHEMERAL}]}]},
        ],
        "tools": CC_TOOLS, "metadata": {"user_id": "user_0a1b_account__session_9f8e"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, **more}


CC_EQUIVALENT = [
    {"role": "system", "content": f"{BILLING}\nBe Claude."},
    {"role": "user", "content": [{"type": "text", "text": "<reminder>"}, {"type": "text", "text": "ls"}]},
    {"role": "assistant", "content": "", "reasoning_content": "run it",  # (its empty text block: "")
     "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "Bash",
                                                                     "arguments": '{"command": "ls"}'}}]},
    {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py"},
]
CC_CHAT_TOOLS = [fn_tool(t["name"], t["input_schema"]) for t in CC_TOOLS]
CC_EXTRA = ("temperature", "context_management", "service_tier", "container", "betas", "top_k")


def claude_code_sdk(holder, body: dict) -> tuple:
    """The raw answer (with Claude Code's headers), the raw stream, and the anthropic SDK's message and its
    accumulation of the stream (the fields this SDK has no arguments for go in extra_body, as a client sends them)."""
    async def go():
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=holder.app), base_url="http://t",
                                      timeout=120) as h:
            c = anthropic.AsyncAnthropic(api_key="none", base_url="http://t", http_client=h, max_retries=0)
            whole = await h.post("/v1/messages?beta=true", json=body, headers=CC_HEADERS)
            streamed = await h.post("/v1/messages?beta=true", json={**body, "stream": True}, headers=CC_HEADERS)
            extra = {k: body[k] for k in CC_EXTRA if k in body}
            args = {k: v for k, v in body.items() if k not in extra and k != "stream"}
            msg = await c.messages.create(**args, extra_body=extra, extra_headers=CC_HEADERS)
            async with c.messages.stream(**args, extra_body=extra, extra_headers=CC_HEADERS) as s:
                final = await s.get_final_message()
            return whole, streamed, msg, final
    return asyncio.run(go())


def test_claude_code_turn_renders_as_the_chat(scripted):  # noqa: F811
    """Claude Code's tool-result turn, with all the fields it sends that a local server has no use for (caching
    hints, context_management, metadata, betas, service_tier, container, top_k), is answered; its prompt is the
    chat's for the equivalent messages written here; the SDK parses the answer and the stream."""
    body = claude_code_body(service_tier="auto", container="container_1", betas=["claude-code-20250219"], top_k=5)
    whole, streamed, msg, final = claude_code_sdk(scripted, body)
    assert whole.status_code == 200 and streamed.status_code == 200, (whole.text, streamed.text)
    whole = whole.json()
    assert msg.model_dump(exclude_none=True)["content"] == whole["content"] == \
        final.model_dump(exclude_none=True)["content"]
    names = [n for n, _ in named_sse_events(streamed.text)]
    assert names[0] == "message_start" and names[-1] == "message_stop"
    ref = chat_prompt_tokens(scripted, {"messages": CC_EQUIVALENT, "tools": CC_CHAT_TOOLS,
                                        "chat_template_kwargs": {"thinking": True, "enable_thinking": True}})
    assert whole["usage"]["input_tokens"] == ref
    counted = post(scripted.app, "/v1/messages/count_tokens?beta=true",
                   {k: v for k, v in body.items() if k not in ("max_tokens", "stream", "temperature", "top_k")},
                   CC_HEADERS)
    assert counted.status_code == 200 and counted.json()["input_tokens"] == ref, counted.text


def test_claude_code_tool_use_out(scripted):  # noqa: F811
    """The model calls Bash (schemas with $schema and format uri among the tools): a tool_use block, the chat's."""
    args = {"command": "ls -la"}
    script = SB + call("functions.Bash:1", json.dumps(args)) + SE
    room = len(scripted.tokenizer.encode(script)) + 2
    scripted.script = script
    try:
        _, streamed, msg, final = claude_code_sdk(scripted, claude_code_body(max_tokens=room))
    finally:
        scripted.script = None
    assert streamed.status_code == 200
    [block] = [b for b in msg.content if b.type == "tool_use"]
    assert (block.name, block.input, block.id) == ("Bash", args, "functions.Bash:1")
    assert msg.stop_reason == final.stop_reason == "tool_use"


def test_claude_code_forced_tool_with_draft07_schemas(scripted):  # noqa: F811
    """tool_choice any over Claude Code's schemas ("$schema", format "uri"): the forced call's grammar compiles
    (the chat's answer to the same functions is a 200 too)."""
    body = claude_code_body(thinking={"type": "disabled"}, tool_choice={"type": "any"}, max_tokens=4)
    r = post(scripted.app, "/v1/messages", body, CC_HEADERS)
    ref = post(scripted.app, "/v1/chat/completions", {"model": MODEL, "messages": CC_EQUIVALENT,
                                                      "tools": CC_CHAT_TOOLS, "tool_choice": "required",
                                                      "max_tokens": 4, "temperature": 0})
    assert (r.status_code, ref.status_code) == (200, 200), (r.text, ref.text)
    assert r.json()["usage"]["input_tokens"] == ref.json()["usage"]["prompt_tokens"]


def test_anthropic_empty_tools_and_refused_connectors(scripted):  # noqa: F811
    """tools [] with tool_choice auto: answered as no tools; mcp_servers (tools the API's side would call) and a
    server tool (web_search_20250305: Claude Code's WebSearch sends one to Anthropic) are 400s naming the field."""
    body = claude_code_body(tools=[], tool_choice={"type": "auto"}, thinking={"type": "disabled"},
                            messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    r = post(scripted.app, "/v1/messages", body, CC_HEADERS)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["input_tokens"] == chat_prompt_tokens(scripted, {
        "messages": [CC_EQUIVALENT[0], {"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"thinking": False, "enable_thinking": False}})
    for change, param in (({"mcp_servers": [{"type": "url", "url": "https://mcp.example/sse", "name": "x"}]},
                           "mcp_servers"),
                          ({"tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8}]},
                           "tools.0.type")):
        r = post(scripted.app, "/v1/messages", {**body, **change}, CC_HEADERS)
        assert r.status_code == 400, r.text
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert param in err["error"]["message"], err
