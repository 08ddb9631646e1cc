"""Anthropic's Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, for Anthropic-API clients
(Claude Code style agents) of a Kimi-K2.5 + EAGLE-3 server, as SGLang 0.5.23 serves them.

A Messages request is read into the equivalent /v1/chat/completions request (``to_chat``) and answered by the chat
path itself (openai_api.start_chat / ChatCall), its answer and its stream read back into Anthropic's shapes: the same
prompt, sampling, tool calls (``--tool-call-parser``) and reasoning split (``--reasoning-parser``) as the chat, so the
output is the chat's, token for token (speculative decoding stays exact).

The translation:

- ``system`` (a string or text blocks, joined by a newline) -> a system message first; ``messages`` (user / assistant,
  content a string or blocks): ``text`` -> text, ``tool_use`` (assistant) -> ``tool_calls`` (``input`` as the
  arguments), ``tool_result`` (user) -> a ``tool`` message (its text; ``is_error: true`` reaches the chat template
  as the tool message's ``is_error``), ``thinking`` (assistant) -> ``reasoning_content``, ``redacted_thinking``
  (Anthropic's encrypted thinking, which no other model can read) left out. Image and document blocks are a 400: the
  model reads text only. A last assistant message is a prefill: the answer continues it (``continue_final_message``,
  the template's thinking off, as Anthropic allows no thinking with a prefill).
- ``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_sequences`` -> the chat's sampling fields.
- Claude Code's fields a local server has no use for (``cache_control``, ``context_management``, ``container``,
  ``service_tier``, ``betas``, ``metadata``) are ignored; ``mcp_servers`` naming servers is a 400 (their tools would
  be called by the API's side).
- ``tools`` (``{name, description, input_schema, strict}``; ``[]``: none) -> functions (``strict``: the chat's);
  ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` -> ``auto`` / ``required`` / a named function / ``none``
  (``auto`` / ``none`` without tools: nothing), ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
- ``thinking`` ``enabled`` (``budget_tokens`` >= 1024) / ``adaptive`` / ``disabled`` -> the template's thinking switch
  (``chat_template_kwargs`` ``thinking`` and ``enable_thinking``); left out, the template's default. ``budget_tokens``
  is enforced only where the engine runs strict thinking (``--enable-strict-thinking``): it is then the chat's
  ``custom_params.thinking_budget``, and the thinking's end marker is forced once the thinking holds that many tokens
  (SGLang 0.5.23 enforces it in no case). Without strict thinking it is accepted and not enforced: the thinking runs
  until the model ends it or ``max_tokens`` does.
  ``output_config.effort`` -> ``reasoning_effort``, ``output_config.format`` -> ``response_format``.

The answer: ``content`` blocks in output order (``thinking`` with the reasoning the parser split off, ``text``,
``tool_use`` with ``input`` the call's arguments as an object), ``stop_reason`` (``end_turn``, ``max_tokens``,
``stop_sequence`` with ``stop_sequence`` the string matched, ``tool_use``), ``usage`` (``input_tokens`` the prompt's,
``output_tokens`` the generated tokens). Streams are Anthropic's events (``message_start``, ``ping``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``), whose deltas add up to the
non-streamed answer. Errors are ``{"type": "error", "error": {"type", "message"}}`` (``error_body``) on every path
under /v1/messages, the middleware's 401 and 413 included.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator

from fastapi import Request as HTTPRequest
from pydantic import ValidationError

from sglang_eagle3.runtime.sampling import short_repr
from sglang_eagle3.server import openai_api
from sglang_eagle3.server.protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    APIError,
    ChatCompletionRequest,
    parse_body,
    validation_error,
)
from sglang_eagle3.server.reasoning import ReasoningSplitter
from sglang_eagle3.server.serving import Serving, sse
from sglang_eagle3.server.tools import TOOL_CALL_PARSERS

logger = logging.getLogger(__name__)

PREFIX = "/v1/messages"
# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors); any other 4xx is
# invalid_request_error, any other 5xx api_error. 503 (the queue is full, the server shuts down) is Anthropic's
# overloaded_error, sent with our 503 (Anthropic's own is 529; SGLang's answer is 503 too).
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
_BUDGET_MIN = 1024  # Anthropic's least thinking.budget_tokens
_MEDIA_BLOCKS = ("image", "document")


def is_anthropic_path(path: str) -> bool:
    """Whether ``path`` is one of this API's (its errors then take Anthropic's shape)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    return _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def error_body(e: APIError) -> dict:
    """An APIError in Anthropic's shape."""
    return {"type": "error", "error": {"type": error_type(e.status), "message": e.message}}


def _bad(msg: str, param: str) -> APIError:
    return APIError(400, msg, param=param)


# -- request translation ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Translated:
    chat: ChatCompletionRequest
    origins: list[str]  # chat message k -> the Anthropic field it came from ("system", "messages.3")
    tool_names: list[str]
    omit_thinking: bool  # thinking.display "omitted": thinking blocks without their text


def _block_type(block, where: str) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if not isinstance(kind, str):
        raise _bad(f"{where}={short_repr(block)} must be a content block object with a \"type\" (a text block: "
                   "{\"type\": \"text\", \"text\": \"...\"})", f"{where}.type")
    return kind


def _text(block: dict, where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise _bad(f"{where}.text={short_repr(text)} must be a string", f"{where}.text")
    return text


def _refuse_block(kind: str, where: str, role: str) -> APIError:
    if kind in _MEDIA_BLOCKS:
        return _bad(f"{where}.type={kind!r}: this model reads text only (text blocks); image and document blocks are "
                    "not supported", f"{where}.type")
    if kind in ("tool_use", "thinking", "redacted_thinking") and role == "user":
        return _bad(f"{where}.type={kind!r} is an assistant's block: it may not be in a user message",
                    f"{where}.type")
    if kind == "tool_result" and role == "assistant":
        return _bad(f"{where}.type='tool_result' belongs in a user message (the turn after the assistant's tool_use)",
                    f"{where}.type")
    return _bad(f"{where}.type={short_repr(kind)} is not a content block this server reads (text, tool_use, "
                "tool_result, thinking, redacted_thinking)", f"{where}.type")


def _as_content(texts: list[str]):
    """Text blocks as a chat message's content: one text as a string, several as text parts (as SGLang hands them
    on: a template that loops over the parts gets them, any other their texts joined), none as ""."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts] if texts else ""


def _tool_result(block: dict, where: str) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.tool_use_id={short_repr(call_id)} must be the id of the tool_use it answers",
                   f"{where}.tool_use_id")
    content = block.get("content")
    if content is None or isinstance(content, str):
        texts = [content or ""]
    elif isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            at = f"{where}.content.{k}"
            kind = _block_type(part, at)
            if kind != "text":
                if kind in _MEDIA_BLOCKS:
                    raise _bad(f"{at}.type={kind!r}: this model reads text only; a tool result may hold text blocks "
                               "only", f"{at}.type")
                raise _bad(f"{at}.type={short_repr(kind)}: a tool result's content holds text blocks only",
                           f"{at}.type")
            texts.append(_text(part, at))
    else:
        raise _bad(f"{where}.content={short_repr(content)} must be a string or a list of text blocks",
                   f"{where}.content")
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _bad(f"{where}.is_error={short_repr(is_error)} must be a boolean", f"{where}.is_error")
    msg = {"role": "tool", "tool_call_id": call_id, "content": _as_content(texts)}
    if is_error:
        msg["is_error"] = True  # (for a template that reads it; Kimi's does not)
    return msg


def _user(i: int, content, out: list[dict], origins: list[str]) -> None:
    """User message ``i`` as chat messages: its text, and a tool message for each tool_result, in their order."""
    where = f"messages.{i}"
    if isinstance(content, str):
        out.append({"role": "user", "content": content})
        origins.append(where)
        return
    if not content:
        raise _bad(f"{where}.content is an empty list: give a string or at least one block", f"{where}.content")
    texts: list[str] = []

    def flush():
        if texts:
            out.append({"role": "user", "content": _as_content(texts)})
            origins.append(where)
            texts.clear()

    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_result":
            flush()
            out.append(_tool_result(block, at))
            origins.append(where)
        else:
            raise _refuse_block(kind, at, "user")
    flush()


def _assistant(i: int, content) -> dict:
    where = f"messages.{i}"
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts, calls, thoughts = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content.{j}"
        kind = _block_type(block, at)
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{at}.id={short_repr(call_id)} must be the call's id (a non-empty string)", f"{at}.id")
            if not isinstance(name, str) or not name:
                raise _bad(f"{at}.name={short_repr(name)} must be the tool's name", f"{at}.name")
            if not isinstance(args, dict):
                raise _bad(f"{at}.input={short_repr(args)} must be an object", f"{at}.input")
            try:
                arguments = json.dumps(args, ensure_ascii=False, allow_nan=False)
            except ValueError:
                raise _bad(f"{at}.input holds NaN or Infinity, which JSON has no value for", f"{at}.input") from None
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind == "thinking":
            thought = block.get("thinking")
            if not isinstance(thought, str):
                raise _bad(f"{at}.thinking={short_repr(thought)} must be a string", f"{at}.thinking")
            if thought:
                thoughts.append(thought)
        elif kind == "redacted_thinking":
            continue  # Anthropic's encrypted thinking: nothing a local model can read
        else:
            raise _refuse_block(kind, at, "assistant")
    msg = {"role": "assistant", "content": _as_content(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    return msg


def _system(system) -> str | None:
    if system is None or isinstance(system, str):
        return system if system and system.strip() else None
    texts = []
    for j, block in enumerate(system):
        at = f"system.{j}"
        kind = _block_type(block, at)
        if kind != "text":
            raise _bad(f"{at}.type={short_repr(kind)}: a system prompt holds text blocks only", f"{at}.type")
        texts.append(_text(block, at))
    text = "\n".join(t for t in texts if t)
    return text if text.strip() else None


def _tools(tools: list | None) -> tuple[list[dict] | None, list[str]]:
    if not tools:  # (an empty list offers none, as on Anthropic's API)
        return None, []
    out, names = [], []
    for i, tool in enumerate(tools):
        at = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _bad(f"{at}={short_repr(tool)} must be a tool object ({{\"name\", \"description\", "
                       "\"input_schema\"}})", at)
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise _bad(f"{at}.type={short_repr(kind)}: Anthropic's server tools (web search, web fetch, code "
                       "execution, bash, text editor, computer use, ...) run on Anthropic's servers, and this server "
                       "runs none; give the tool as a custom tool with an input_schema, for your client to run",
                       f"{at}.type")
        name, schema, description = tool.get("name"), tool.get("input_schema"), tool.get("description")
        if not isinstance(name, str):
            raise _bad(f"{at}.name={short_repr(name)} must be a string", f"{at}.name")
        if not isinstance(schema, dict):
            raise _bad(f"{at}.input_schema={short_repr(schema)} must be a JSON schema object", f"{at}.input_schema")
        if "type" not in schema:
            schema = {"type": "object", **schema}
        elif schema["type"] != "object":
            raise _bad(f"{at}.input_schema.type={short_repr(schema['type'])} must be 'object' (a tool's input is "
                       "an object)", f"{at}.input_schema.type")
        fn = {"name": name, "parameters": schema}
        if description is not None:
            if not isinstance(description, str):
                raise _bad(f"{at}.description={short_repr(description)} must be a string", f"{at}.description")
            fn["description"] = description
        strict = tool.get("strict")
        if strict is not None:  # (Anthropic's strict tool use: the input follows the schema)
            if not isinstance(strict, bool):
                raise _bad(f"{at}.strict={short_repr(strict)} must be a boolean", f"{at}.strict")
            fn["strict"] = strict
        out.append({"type": "function", "function": fn})
        names.append(name)
    return out, names


def _tool_choice(choice: dict | None, names: list[str], has_tools: bool) -> tuple[str | dict | None, bool | None]:
    """(the chat's tool_choice, its parallel_tool_calls)."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = choice.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise _bad(f"tool_choice.disable_parallel_tool_use={short_repr(parallel)} must be a boolean",
                   "tool_choice.disable_parallel_tool_use")
    if kind not in ("auto", "any", "tool", "none"):
        raise _bad(f"tool_choice.type={short_repr(kind)} must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")
    if kind in ("auto", "none") and not has_tools:
        return None, None  # (nothing to choose from: auto and none ask for nothing)
    if not has_tools:
        raise _bad(f"tool_choice {{\"type\": {kind!r}}} needs tools", "tool_choice")
    chat: str | dict = {"auto": "auto", "any": "required", "none": "none"}.get(kind, "")
    if kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or name not in names:
            raise _bad(f"tool_choice.name={short_repr(name)} must name one of the tools ({', '.join(names)})",
                       "tool_choice.name")
        chat = {"type": "function", "function": {"name": name}}
    return chat, (False if parallel else None)


def _thinking(thinking: dict | None) -> tuple[bool | None, bool, int | None]:
    """(the template's thinking switch, None: its default; whether the thinking's text is left out; budget_tokens,
    None unless thinking is enabled)."""
    if thinking is None:
        return None, False, None
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise _bad(f"thinking.type={short_repr(kind)} must be 'enabled', 'adaptive' or 'disabled'", "thinking.type")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (not isinstance(budget, int) or isinstance(budget, bool) or budget < _BUDGET_MIN):
        raise _bad(f"thinking.budget_tokens={short_repr(budget)} must be an integer >= {_BUDGET_MIN} (Anthropic's "
                   "rule)", "thinking.budget_tokens")
    if kind != "enabled" and budget is not None:
        raise _bad(f"thinking.budget_tokens is only allowed with thinking.type 'enabled' (got {kind!r})",
                   "thinking.budget_tokens")
    display = thinking.get("display")
    if display not in (None, "summarized", "omitted"):
        raise _bad(f"thinking.display={short_repr(display)} must be 'summarized' or 'omitted'", "thinking.display")
    if kind == "disabled" and display is not None:
        raise _bad("thinking.display is only allowed with thinking on", "thinking.display")
    return kind != "disabled", display == "omitted", budget if kind == "enabled" else None


def _output_config(config: dict | None) -> tuple[object, dict | None]:
    """(the chat's reasoning_effort, its response_format)."""
    if config is None:
        return None, None
    effort, fmt = config.get("effort"), config.get("format")
    response_format = None
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise _bad(f"output_config.format={short_repr(fmt)} must be {{\"type\": \"json_schema\", \"schema\": "
                       "{...}}", "output_config.format")
        response_format = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}
    return effort, response_format


def to_chat(body: AnthropicCountTokensRequest, *, stream: bool = False, rid: str | None = None,
            strict_thinking: bool = False) -> Translated:
    """The /v1/chat/completions request equivalent to ``body`` (a Messages or count_tokens request); 400s naming the
    Anthropic field for what it does not take. ``strict_thinking``: the engine enforces thinking budgets, and
    ``thinking.budget_tokens`` becomes the chat's ``custom_params.thinking_budget`` (else it is not read)."""
    messages: list[dict] = []
    origins: list[str] = []
    system = _system(body.system)
    if system is not None:
        messages.append({"role": "system", "content": system})
        origins.append("system")
    for i, m in enumerate(body.messages):
        if m.role == "user":
            _user(i, m.content, messages, origins)
        else:
            messages.append(_assistant(i, m.content))
            origins.append(f"messages.{i}")
    if body.mcp_servers:
        raise _bad("mcp_servers (Anthropic's MCP connector: its servers' tools called by Anthropic's servers) is not "
                   "supported: this server calls no tools itself; give the MCP tools as tools, for your client to "
                   "run (Claude Code does so with its own MCP servers)", "mcp_servers")
    tools, names = _tools(body.tools)
    choice, parallel = _tool_choice(body.tool_choice, names, tools is not None)
    thinking, omitted, budget = _thinking(body.thinking)
    effort, response_format = _output_config(body.output_config)
    last = len(body.messages) - 1
    prefill = body.messages[last].role == "assistant"
    if prefill:
        # Anthropic's prefill: the answer continues the last assistant message's text. Anthropic takes no thinking
        # with it; the template's thinking is off (Kimi-K2.5's would put the prefill inside an opened <think>).
        if messages[-1].get("tool_calls"):
            raise _bad(f"messages.{last} (the last message, an assistant's) holds a tool_use: give its tool_result "
                       "in a user message after it", f"messages.{last}")
        if thinking:
            raise _bad("thinking cannot be on with a last assistant message (a prefill), as on Anthropic's API",
                       "thinking")
        thinking = False
    d: dict = {"model": body.model, "messages": messages, "stream": stream, "rid": rid,
               "continue_final_message": prefill, "separate_reasoning": not prefill}
    if thinking is not None:
        d["chat_template_kwargs"] = {"thinking": thinking, "enable_thinking": thinking}
    if strict_thinking and budget is not None:
        d["custom_params"] = {"thinking_budget": budget}
    if tools is not None:
        d["tools"] = tools
    if choice is not None:
        d["tool_choice"] = choice
    if parallel is not None:
        d["parallel_tool_calls"] = parallel
    if effort is not None:
        d["reasoning_effort"] = effort
    if response_format is not None:
        d["response_format"] = response_format
    if isinstance(body, AnthropicMessagesRequest):
        d["max_tokens"] = body.max_tokens
        for name in ("temperature", "top_p", "top_k"):
            if getattr(body, name) is not None:
                d[name] = getattr(body, name)
        if body.stop_sequences is not None:
            d["stop"] = body.stop_sequences
        if stream:
            d["stream_options"] = {"include_usage": True}  # (the output's token count, for message_delta)
    try:
        chat = ChatCompletionRequest.model_validate(d)
    except ValidationError as e:  # (a value a client gave that the chat's model refuses)
        raise _renamed(validation_error(e), origins) from None
    return Translated(chat, origins, names, omitted)


# The chat's field names -> the Anthropic request's, for an error the chat path raises.
_PARAMS = (("stop", "stop_sequences"), ("reasoning_effort", "output_config.effort"),
           ("response_format", "output_config.format"), ("chat_template_kwargs", "thinking"),
           ("custom_params.thinking_budget", "thinking.budget_tokens"), ("continue_final_message", "messages"),
           ("parallel_tool_calls", "tool_choice.disable_parallel_tool_use"))
_TOOL_FIELD = re.compile(r"(tools[.\[]\d+\]?)\.function\.(name|parameters)")


def _tool_field(g) -> str:
    return f"{g.group(1)}.{'name' if g.group(2) == 'name' else 'input_schema'}"


def _renamed(e: APIError, origins: list[str]) -> APIError:
    """An error of the chat path with the Anthropic request's names for its fields."""
    msg = e.message.replace("tool_choice 'required'", "tool_choice any")
    return openai_api.renamed_error(APIError(e.status, msg, param=e.param, code=e.code, type=e.type), origins,
                                    _PARAMS, _TOOL_FIELD, _tool_field, keep_rest=False)


# -- the endpoints ------------------------------------------------------------------------------------------------

async def messages(serving: Serving, request: HTTPRequest):
    body: AnthropicMessagesRequest = parse_body(AnthropicMessagesRequest,  # type: ignore[assignment]
                                                await request.body())
    serving.check_model(body.model)
    rid = f"msg_{uuid.uuid4().hex}"  # the engine request's id too: /abort_request takes it
    tr = to_chat(body, stream=bool(body.stream), rid=rid, strict_thinking=serving.strict_thinking)
    has_tools = tr.chat.tools is not None and tr.chat.tool_choice in (None, "auto")
    if has_tools and serving.config.tool_call_parser is None:
        raise _bad("tools with tool_choice auto (the default) need the server's --tool-call-parser (one of "
                   f"{', '.join(TOOL_CALL_PARSERS)}) to read the model's calls; tool_choice {{\"type\": \"any\"}} or "
                   "{\"type\": \"tool\", \"name\": ...} work without one (the output is constrained to calls)",
                   "tool_choice")
    try:
        call = await openai_api.start_chat(serving, tr.chat)
    except APIError as e:
        raise _renamed(e, tr.origins) from None
    stops = body.stop_sequences or []
    if body.stream:
        return await serving.stream(call.sub, request, _events(call, tr, stops), failure=_failure_events)
    finals = await serving.wait(call.sub, request)
    [u] = finals
    [choice] = call.choices(finals)
    msg = choice["message"]
    content, reasoning = msg.get("content") or "", msg.get("reasoning_content")
    blocks = []
    if reasoning and call.thinking is not None:
        # Text the model wrote before its reasoning comes first, as the stream sends it.
        start = ReasoningSplitter(call.thinking).parts(u.text, True).start
        before = u.text[:start] if start else ""
        if before and content.startswith(before):
            blocks.append({"type": "text", "text": before})
            content = content[len(before):]
    if reasoning:
        blocks.append(_thinking_block("" if tr.omit_thinking else reasoning))
    if content:
        blocks.append({"type": "text", "text": content})
    for tc in msg.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": tc["id"], "name": tc["function"]["name"],
                       "input": json.loads(tc["function"]["arguments"])})
    stop_reason, stop_sequence = _stop(choice["finish_reason"], choice["matched_stop"], stops)
    return {"id": call.cid, "type": "message", "role": "assistant", "model": body.model, "content": blocks,
            "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": _usage(len(call.ids), len(u.result["output_ids"]))}


async def count_tokens(serving: Serving, request: HTTPRequest):
    """``{"input_tokens"}``: the prompt's tokens as /v1/messages renders it (its ``usage.input_tokens``)."""
    body: AnthropicCountTokensRequest = parse_body(AnthropicCountTokensRequest,  # type: ignore[assignment]
                                                   await request.body())
    serving.check_model(body.model)
    tr = to_chat(body)
    try:
        prompt = openai_api.tokenize_chat_prompt(serving, tr.chat)
        ids = await serving.off_loop(prompt.encode, serving, True)
    except APIError as e:
        raise _renamed(e, tr.origins) from None
    return {"input_tokens": len(ids)}


def _usage(input_tokens: int, output_tokens: int) -> dict:
    # (no prompt cache here: nothing is ever written to or read from one)
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def _thinking_block(text: str) -> dict:
    # (Anthropic signs its thinking for its own servers to check; there is nothing to sign or check here)
    return {"type": "thinking", "thinking": text, "signature": ""}


def _stop(reason: str | None, matched, stops: list[str]) -> tuple[str, str | None]:
    """The chat's finish_reason and matched_stop as Anthropic's (stop_reason, stop_sequence): a stop string of
    stop_sequences matched is stop_sequence; an eos or stop token, or a request aborted (/abort_request), end_turn."""
    if reason == "tool_calls":
        return "tool_use", None
    if reason == "length":
        return "max_tokens", None
    if reason == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _event(name: str, payload: dict) -> bytes:
    return sse(payload, event=name)


def _failure_events(e: APIError) -> list[bytes]:
    return [_event("error", error_body(e))]


async def _events(call: openai_api.ChatCall, tr: Translated, stops: list[str]) -> AsyncIterator[bytes]:
    """The chat stream's chunks as Anthropic's events. A block opens with its first text (thinking, text) and
    closes when another kind comes; each tool call (the chat sends it whole) is a tool_use block with its input in
    one input_json_delta. message_start goes out with the first chunk (at the first tokens: a failure before that is
    an HTTP error, serving.stream)."""
    index, open_kind = -1, None

    def start() -> list[bytes]:
        message = {"id": call.cid, "type": "message", "role": "assistant", "model": call.body.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": _usage(len(call.ids), 0)}
        return [_event("message_start", {"type": "message_start", "message": message}),
                _event("ping", {"type": "ping"})]

    def close() -> list[bytes]:
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": index})]

    def open_block(kind: str, block: dict) -> list[bytes]:
        nonlocal index, open_kind
        if open_kind == kind:
            return []
        out = close()
        index += 1
        open_kind = kind
        return out + [_event("content_block_start", {"type": "content_block_start", "index": index,
                                                     "content_block": block})]

    def delta(d: dict) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})

    async for piece in call.pieces():
        kind = piece[0]
        if kind == "start":
            out = start()
        elif kind == "reasoning":
            out = open_block("thinking", _thinking_block(""))
            if not tr.omit_thinking:
                out.append(delta({"type": "thinking_delta", "thinking": piece[1]}))
        elif kind == "content":
            out = open_block("text", {"type": "text", "text": ""})
            out.append(delta({"type": "text_delta", "text": piece[1]}))
        elif kind == "tool_call":
            tc = piece[1]
            out = close() + open_block("tool_use", {"type": "tool_use", "id": tc["id"],
                                                    "name": tc["function"]["name"], "input": {}})
            out.append(delta({"type": "input_json_delta", "partial_json": tc["function"]["arguments"]}))
            out += close()
        else:  # "end"
            _, reason, matched, output_tokens = piece
            out = close()
        for e in out:
            yield e
    stop_reason, stop_sequence = _stop(reason, matched, stops)
    yield _event("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                   "usage": {"input_tokens": len(call.ids), "output_tokens": output_tokens}})
    yield _event("message_stop", {"type": "message_stop"})
