"""OpenAI's Responses API: ``POST /v1/responses``, for Responses-API clients (Codex-CLI style agents, the ``openai``
SDK's ``client.responses``) of a Kimi-K2.5 + EAGLE-3 server, as SGLang 0.5.23 serves it.

As the Anthropic endpoint (server/anthropic_api.py), a Responses request is read into the equivalent
/v1/chat/completions request (``to_chat``) and answered by the chat path itself (openai_api.start_chat / ChatCall),
its answer and its stream read back into the Responses shapes: the same prompt, sampling, tool calls
(``--tool-call-parser``) and reasoning split (``--reasoning-parser``) as the chat, so the output is the chat's, token
for token (speculative decoding stays exact).

The translation:

- ``instructions`` -> a system message first; ``input`` a string -> one user message; a list of items, in order:
  messages (``role`` user / system / developer / assistant, ``content`` a string or ``input_text`` / ``output_text``
  / ``refusal`` parts) -> chat messages of that role; ``function_call`` {call_id, name, arguments} -> a tool call of
  the assistant message before it (one of its own where none is), ``function_call_output`` {call_id, output} -> a
  ``tool`` message; ``reasoning`` items (their ``content`` text, else their ``summary`` text) -> the
  ``reasoning_content`` of the next assistant message (left out where no assistant turn follows);
  ``custom_tool_call`` / ``local_shell_call`` -> tool calls of the functions those tools are offered as (below),
  their outputs -> ``tool`` messages. Image, file and audio parts are a 400 (the model reads text only), as are items
  that need stored state (``item_reference``) or a hosted tool's calls.
- ``max_output_tokens``, ``temperature``, ``top_p`` -> ``max_tokens``, ``temperature``, ``top_p``.
- ``tools`` (``{type: function, name, description, parameters, strict}``) -> functions; the kinds Codex runs itself
  are offered as functions too: ``custom`` (freeform) tools as a function of one string ``input`` (a grammar format
  shown in its description, not enforced), ``local_shell`` as a function taking the exec action; their calls come
  back as ``custom_tool_call`` / ``local_shell_call`` items. Hosted tools (web search, file search, code interpreter,
  computer use, MCP, ...) are a 400: this server runs none. ``tool_choice`` auto /
  none / required / ``{type: function, name}`` and ``parallel_tool_calls`` -> the chat's.
- ``reasoning.effort`` -> ``reasoning_effort`` (the template's thinking switch: effort ``none`` turns Kimi-K2.5's
  thinking off); ``reasoning.summary`` set: reasoning items carry the reasoning as their summary too.
- ``text.format`` text / json_object / json_schema {name, schema, strict} -> ``response_format``.
- Refused with a 400 naming the field: ``previous_response_id``, ``conversation``, ``store: true`` and ``background:
  true`` (nothing is stored: there is no conversation state, and GET /v1/responses/{id} is a 404 saying so),
  ``prompt`` (stored prompt templates), ``include`` other than ``reasoning.encrypted_content`` (accepted; reasoning
  items then carry ``encrypted_content: null``, as there is nothing to encrypt for) and
  ``message.output_text.logprobs`` (below), ``max_tool_calls``, ``truncation`` other than ``disabled``.
- ``include: ["message.output_text.logprobs"]`` (``top_logprobs``: 0 to --max-top-logprobs-num a position): the
  chat's ``logprobs``, every generated token's as SGLang's Responses give them, on the first message's
  ``output_text``; refused with a stream (as in SGLang) and with tools (as on the chat); ``top_logprobs`` without it
  asks for nothing.

The answer: a ``response`` object whose ``output`` items come in output order (``reasoning`` with the reasoning the
parser split off as ``reasoning_text`` content, ``message`` with ``output_text`` content, ``function_call`` items
with the chat's call ids as ``call_id``), ``status`` completed, or incomplete (``incomplete_details.reason``
``max_output_tokens``) where max_output_tokens cut it, or failed where the request was aborted (/abort_request);
``usage`` (the prompt's tokens, the generated tokens, of them the reasoning's up to its end marker, as SGLang counts
them); the request's fields echoed. Streams are Responses events (``event:`` lines, ``sequence_number`` from 0):
response.created, response.in_progress, per item output_item.added / content_part.added / the deltas /
output_text.done (reasoning_text.done, function_call_arguments.done) / content_part.done / output_item.done, then
response.completed (response.incomplete, response.failed); their deltas add up to the non-streamed output.
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
from sglang_eagle3.server.driver import Update
from sglang_eagle3.server.protocol import (
    APIError,
    ChatCompletionRequest,
    ResponsesRequest,
    parse_body,
    validation_error,
)
from sglang_eagle3.server.reasoning import ReasoningSplitter
from sglang_eagle3.server.serving import Serving, sse

logger = logging.getLogger(__name__)

PREFIX = "/v1/responses"
_MEDIA_PARTS = ("input_image", "input_file", "input_audio")
_TEXT_PARTS = ("input_text", "output_text")
_ROLES = ("user", "system", "developer", "assistant")
_SUMMARIES = ("auto", "concise", "detailed")
_LOGPROBS = "message.output_text.logprobs"
_INCLUDES = ("reasoning.encrypted_content", _LOGPROBS)


def _bad(msg: str, param: str) -> APIError:
    return APIError(400, msg, param=param)


def _hex() -> str:
    return uuid.uuid4().hex


# -- request translation ----------------------------------------------------------------------------------------

@dataclasses.dataclass
class Translated:
    chat: ChatCompletionRequest
    origins: list[str]  # chat message k -> the Responses field it came from ("instructions", "input.3")
    summary: bool  # reasoning.summary set: reasoning items carry the reasoning as their summary too
    kinds: dict[str, str] = dataclasses.field(default_factory=dict)  # function name -> "custom" / "local_shell"


def _as_content(texts: list[str]):
    """Text parts as a chat message's content: one text as a string, several as text parts (as the Anthropic
    endpoint hands them on), none as ""."""
    if len(texts) == 1:
        return texts[0]
    return [{"type": "text", "text": t} for t in texts] if texts else ""


def _part_type(part, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(kind, str):
        raise _bad(f"{where}={short_repr(part)} must be a content part object with a \"type\" (a text part: "
                   "{\"type\": \"input_text\", \"text\": \"...\"})", f"{where}.type")
    return kind


def _text_of_parts(content, where: str, what: str) -> list[str]:
    """The texts of a string or a list of text parts; 400 naming the part for anything else."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise _bad(f"{where}={short_repr(content)} must be a string or a list of {what} parts", where)
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.{j}"
        kind = _part_type(part, at)
        if kind in _TEXT_PARTS or kind == "refusal":
            key = "refusal" if kind == "refusal" else "text"
            text = part.get(key)
            if not isinstance(text, str):
                raise _bad(f"{at}.{key}={short_repr(text)} must be a string", f"{at}.{key}")
            texts.append(text)
        elif kind in _MEDIA_PARTS:
            raise _bad(f"{at}.type={kind!r}: this model reads text only (input_text parts); image, file and audio "
                       "inputs are not supported", f"{at}.type")
        else:
            raise _bad(f"{at}.type={short_repr(kind)} is not a content part this server reads (input_text, "
                       "output_text)", f"{at}.type")
    return texts


def _string(item: dict, key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise _bad(f"{at}.{key}={short_repr(value)} must be a non-empty string", f"{at}.{key}")
    return value


def _reasoning_text(item: dict, at: str) -> str:
    """A reasoning item's text: its content's reasoning_text (or text) parts, else its summary's summary_text parts.
    (``encrypted_content``, another server's encrypted reasoning, is not read: no model here can read it.)"""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise _bad(f"{at}.{key}={short_repr(parts)} must be a list of {part_type} parts", f"{at}.{key}")
        texts = []
        for j, part in enumerate(parts):
            kind = _part_type(part, f"{at}.{key}.{j}")
            if kind == "text" and key == "content":  # (Codex's history writes reasoning content parts so too)
                kind = part_type
            if kind != part_type or not isinstance(part.get("text"), str):
                raise _bad(f"{at}.{key}.{j}={short_repr(part)} must be {{\"type\": \"{part_type}\", \"text\": "
                           "\"...\"}", f"{at}.{key}.{j}")
            texts.append(part["text"])
        if any(texts):
            return "\n".join(t for t in texts if t)
    return ""


def _input(items, out: list[dict], origins: list[str]) -> None:
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        origins.append("input")
        return
    if not items:
        raise _bad("input is an empty list: give a string or at least one item", "input")
    pending = ""  # a reasoning item's text, for the next assistant message
    turn = False  # the last chat message is an assistant's that a function_call may join

    def assistant(msg: dict, at: str) -> None:
        nonlocal pending
        if pending:
            msg["reasoning_content"] = pending
            pending = ""
        out.append(msg)
        origins.append(at)

    for i, item in enumerate(items):
        at = f"input.{i}"
        if not isinstance(item, dict):
            raise _bad(f"{at}={short_repr(item)} must be an input item object (a message: {{\"role\": \"user\", "
                       "\"content\": \"...\"})", at)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise _bad(f"{at}.role={short_repr(role)} must be one of {', '.join(_ROLES)}", f"{at}.role")
            if "content" not in item:
                raise _bad(f"{at} has no content", f"{at}.content")
            content = _as_content(_text_of_parts(item["content"], f"{at}.content", "text"))
            if role == "assistant":
                assistant({"role": "assistant", "content": content}, at)
                turn = True
            else:
                out.append({"role": role, "content": content})
                origins.append(at)
                turn = False
        elif kind in _CALLS:
            # A call the client ran: a function's, or one of the tools offered to the model as functions (a custom
            # tool's {"input"}, local_shell's exec action: _tools), as the tool call the model wrote for it.
            if kind == "local_shell_call":
                call_id = item.get("call_id") or item.get("id")
                if not isinstance(call_id, str) or not call_id:
                    raise _bad(f"{at}.call_id={short_repr(call_id)} must be a non-empty string", f"{at}.call_id")
                name, args = LOCAL_SHELL, _local_shell_arguments(item.get("action"), f"{at}.action")
            else:
                call_id, name = _string(item, "call_id", at), _string(item, "name", at)
                key = "arguments" if kind == "function_call" else "input"
                args = item.get(key)
                if not isinstance(args, str):
                    what = "the call's JSON arguments" if key == "arguments" else "the tool's input text"
                    raise _bad(f"{at}.{key}={short_repr(args)} must be a string ({what})", f"{at}.{key}")
                if kind == "custom_tool_call":
                    args = json.dumps({"input": args}, ensure_ascii=False)
            tc = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if turn and not pending:
                out[-1].setdefault("tool_calls", []).append(tc)
            else:
                assistant({"role": "assistant", "content": "", "tool_calls": [tc]}, at)
                turn = True
        elif kind in _OUTPUTS:
            call_id = item.get("call_id") or (item.get("id") if kind == "local_shell_call_output" else None)
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{at}.call_id={short_repr(call_id)} must be a non-empty string", f"{at}.call_id")
            output = item.get("output")
            content = _as_content(_text_of_parts(output, f"{at}.output", "input_text"))
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
            origins.append(at)
            turn = False
        elif kind == "reasoning":
            text = _reasoning_text(item, at)
            if text:
                pending = f"{pending}\n{text}" if pending else text
            turn = False
        elif kind == "item_reference":
            raise _bad(f"{at}.type='item_reference': this server stores no responses or items to refer to; give the "
                       "item itself", f"{at}.type")
        else:
            raise _bad(f"{at}.type={short_repr(kind)} is not an input item this server reads (message, "
                       "function_call, function_call_output, custom_tool_call, custom_tool_call_output, "
                       "local_shell_call, local_shell_call_output, reasoning); the calls of tools that run on "
                       "OpenAI's servers (web search, file search, ...) are not supported", f"{at}.type")


def _local_shell_arguments(action, at: str) -> str:
    """A local_shell_call's exec action as the arguments of the local_shell function the model called."""
    if not isinstance(action, dict) or action.get("type", "exec") != "exec":
        raise _bad(f"{at}={short_repr(action)} must be an exec action ({{\"type\": \"exec\", \"command\": "
                   "[...]}})", at)
    args = {k: v for k, v in action.items() if k != "type" and v is not None}
    try:
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except ValueError:
        raise _bad(f"{at} holds NaN or Infinity, which JSON has no value for", at) from None


def _custom_function(tool: dict, at: str) -> dict:
    """A custom (freeform) tool as the function offered to the model: one string parameter, ``input``, the text the
    tool takes; a grammar format is shown in the description (not enforced: the model's text is handed on)."""
    description, fmt = tool.get("description"), tool.get("format")
    if description is not None and not isinstance(description, str):
        raise _bad(f"{at}.description={short_repr(description)} must be a string", f"{at}.description")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is not None and kind not in ("text", "grammar"):
        raise _bad(f"{at}.format={short_repr(fmt)} must be {{\"type\": \"text\"}} or {{\"type\": \"grammar\", "
                   "\"syntax\", \"definition\"}}", f"{at}.format")
    about = "The tool's input: free text, written as is (not JSON)."
    if kind == "grammar":
        definition, syntax = fmt.get("definition"), fmt.get("syntax")
        if not isinstance(definition, str) or not isinstance(syntax, str):
            raise _bad(f"{at}.format: a grammar format needs \"syntax\" and \"definition\" (strings)", f"{at}.format")
        about = f"The tool's input, written as is (not JSON); it must follow this {syntax} grammar:\n{definition}"
    return {"name": tool.get("name"), "description": description or "",
            "parameters": {"type": "object", "properties": {"input": {"type": "string", "description": about}},
                           "required": ["input"], "additionalProperties": False}}


LOCAL_SHELL = "local_shell"
# Codex's local_shell tool (codex-rs: ToolSpec::LocalShell) offered as a function whose arguments are the
# local_shell_call's exec action (LocalShellExecAction: command an argv list, the rest optional).
_LOCAL_SHELL_FUNCTION = {
    "name": LOCAL_SHELL,
    "description": "Runs a command on the user's machine and returns its output.",
    "parameters": {"type": "object", "properties": {
        "command": {"type": "array", "items": {"type": "string"}, "description": "The command and its arguments"},
        "working_directory": {"type": "string"}, "timeout_ms": {"type": "integer"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}}, "user": {"type": "string"}},
        "required": ["command"], "additionalProperties": False}}
_CLIENT_TOOLS = ("custom", LOCAL_SHELL)  # tool kinds the client runs itself, offered to the model as functions
_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _tools(tools: list | None) -> tuple[list[dict] | None, list[str], dict[str, str]]:
    """(the chat's functions, their names, the names of those that are custom / local_shell tools -> the kind)."""
    if not tools:  # (Codex sends "tools": [] where it offers none)
        return None, [], {}
    out, names, kinds = [], [], {}
    for i, tool in enumerate(tools):
        at = f"tools.{i}"
        if not isinstance(tool, dict):
            raise _bad(f"{at}={short_repr(tool)} must be a tool object ({{\"type\": \"function\", \"name\", "
                       "\"parameters\"}})", at)
        kind = tool.get("type")
        if kind == LOCAL_SHELL:
            out.append({"type": "function", "function": dict(_LOCAL_SHELL_FUNCTION)})
            names.append(LOCAL_SHELL)
            kinds[LOCAL_SHELL] = LOCAL_SHELL
            continue
        if kind == "custom":
            fn = _custom_function(tool, at)
            if not isinstance(fn["name"], str):
                raise _bad(f"{at}.name={short_repr(fn['name'])} must be a string", f"{at}.name")
            out.append({"type": "function", "function": fn})
            names.append(fn["name"])
            kinds[fn["name"]] = "custom"
            continue
        if kind != "function":
            hint = (" (Codex: turn its web search off, web_search = \"disabled\" in config.toml)"
                    if isinstance(kind, str) and kind.startswith("web_search") else "")
            raise _bad(f"{at}.type={short_repr(kind)}: this server runs no hosted tools; OpenAI's built-in tools "
                       "(web_search, file_search, code_interpreter, computer_use, image_generation, mcp, shell, ...) "
                       "run on OpenAI's servers: leave them out of tools" + hint + ". Function, custom and "
                       "local_shell tools, which the client runs, are supported", f"{at}.type")
        name, params, description, strict = (tool.get(k) for k in ("name", "parameters", "description", "strict"))
        if not isinstance(name, str):
            raise _bad(f"{at}.name={short_repr(name)} must be a string", f"{at}.name")
        fn: dict = {"name": name}
        if params is not None:
            fn["parameters"] = params
        if description is not None:
            if not isinstance(description, str):
                raise _bad(f"{at}.description={short_repr(description)} must be a string", f"{at}.description")
            fn["description"] = description
        if strict is not None:
            if not isinstance(strict, bool):
                raise _bad(f"{at}.strict={short_repr(strict)} must be a boolean", f"{at}.strict")
            fn["strict"] = strict
        out.append({"type": "function", "function": fn})
        names.append(name)
    return out, names, kinds


def _tool_choice(choice, names: list[str]) -> str | dict | None:
    if choice in ("auto", "none") and not names:
        return None  # (nothing to choose from: as OpenAI, auto and none ask for nothing; Codex sends auto always)
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, str):
        raise _bad(f"tool_choice={short_repr(choice)} must be 'auto', 'none', 'required' or {{\"type\": "
                   "\"function\", \"name\": ...}", "tool_choice")
    kind = choice.get("type")
    if kind == LOCAL_SHELL:
        choice = {"name": LOCAL_SHELL}
    elif kind not in ("function", "custom"):
        raise _bad(f"tool_choice.type={short_repr(kind)}: only {{\"type\": \"function\" (or \"custom\"), "
                   "\"name\": ...}} or {\"type\": \"local_shell\"} is supported (no built-in tools; allowed_tools "
                   "is not supported)", "tool_choice.type")
    name = choice.get("name")
    if not isinstance(name, str) or name not in names:
        given = ", ".join(names) or "none given"
        raise _bad(f"tool_choice.name={short_repr(name)} must name one of the tools ({given})", "tool_choice.name")
    return {"type": "function", "function": {"name": name}}


def _reasoning(reasoning: dict | None) -> tuple[object, bool]:
    """(the chat's reasoning_effort, whether reasoning items carry a summary)."""
    if reasoning is None:
        return None, False
    summary = reasoning.get("summary", reasoning.get("generate_summary"))
    if summary is not None and summary not in _SUMMARIES and summary != "none":
        raise _bad(f"reasoning.summary={short_repr(summary)} must be one of {', '.join(_SUMMARIES)} or none",
                   "reasoning.summary")
    return reasoning.get("effort"), summary not in (None, "none")  # (Codex's summary "none": no summary)


def _text_format(text: dict | None) -> dict | None:
    if text is None or text.get("format") is None:
        return None
    fmt = text["format"]
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = {"name": fmt.get("name") or "output", "schema": fmt.get("schema")}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise _bad(f"text.format={short_repr(fmt)} must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
               "{\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}", "text.format.type")


def _refuse_state(body: ResponsesRequest) -> None:
    """The fields this server cannot honour, unless given their neutral value."""
    nothing_stored = ("this server stores no responses (no conversation state: send the whole conversation in "
                      "input)")
    if body.previous_response_id is not None:
        raise _bad(f"previous_response_id is not supported: {nothing_stored}", "previous_response_id")
    if body.conversation is not None:
        raise _bad(f"conversation is not supported: {nothing_stored}", "conversation")
    if body.store:
        raise _bad(f"store=true is not supported: {nothing_stored}; send store: false or leave it out", "store")
    if body.background:
        raise _bad("background=true is not supported (it needs stored responses); send background: false or leave "
                   "it out", "background")
    if body.prompt is not None:
        raise _bad("prompt (a stored prompt template) is not supported: give instructions and input", "prompt")
    if body.truncation not in (None, "disabled"):
        raise _bad(f"truncation={short_repr(body.truncation)} is not supported: only 'disabled' (a prompt over the "
                   "context is a 400)", "truncation")
    for k, value in enumerate(body.include or []):
        if value not in _INCLUDES:
            raise _bad(f"include.{k}={short_repr(value)} is not supported (only {', '.join(_INCLUDES)})",
                       f"include.{k}")
    if body.stream and _LOGPROBS in (body.include or []):
        raise _bad(f"include {_LOGPROBS} is not supported with stream=true (as SGLang's; the answer of a "
                   "non-streamed request carries them)", f"include.{body.include.index(_LOGPROBS)}")
    if body.max_tool_calls is not None:
        raise _bad("max_tool_calls is not supported (the calls of one response are the model's)", "max_tool_calls")
    for name in ("reasoning", "text"):
        if getattr(body, name) is not None and not isinstance(getattr(body, name), dict):
            raise _bad(f"{name} must be an object", name)


def to_chat(body: ResponsesRequest, *, stream: bool = False, rid: str | None = None) -> Translated:
    """The /v1/chat/completions request equivalent to ``body``; 400s naming the Responses field for what it does
    not take."""
    _refuse_state(body)
    messages: list[dict] = []
    origins: list[str] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
        origins.append("instructions")
    _input(body.input, messages, origins)
    if not messages:
        raise _bad("input holds no message (only reasoning items)", "input")
    tools, names, kinds = _tools(body.tools)
    choice = _tool_choice(body.tool_choice, names)
    effort, summary = _reasoning(body.reasoning)
    response_format = _text_format(body.text)
    d: dict = {"model": body.model, "messages": messages, "stream": stream, "rid": rid}
    for name in ("temperature", "top_p", "parallel_tool_calls", "chat_template_kwargs"):
        if getattr(body, name) is not None:
            d[name] = getattr(body, name)
    if body.max_output_tokens is not None:
        d["max_tokens"] = body.max_output_tokens
    if tools is not None:
        d["tools"] = tools
    if choice is not None:
        d["tool_choice"] = choice
    if effort is not None:
        d["reasoning_effort"] = effort
    if response_format is not None:
        d["response_format"] = response_format
    if _LOGPROBS in (body.include or []):  # (top_logprobs alone asks for nothing, as in SGLang)
        if tools is not None:
            raise _bad(f"include {_LOGPROBS} with tools is not supported (as logprobs on the chat: the calls are read "
                       "out of the text the tokens make)", f"include.{body.include.index(_LOGPROBS)}")
        d["logprobs"] = True
        if body.top_logprobs is not None:
            d["top_logprobs"] = body.top_logprobs
    if stream:
        d["stream_options"] = {"include_usage": True}  # (the output's token count, for usage)
    try:
        chat = ChatCompletionRequest.model_validate(d)
    except ValidationError as e:  # (a value a client gave that the chat's model refuses)
        raise _renamed(validation_error(e), origins) from None
    return Translated(chat, origins, summary, kinds)


# The chat's field names -> the Responses request's, for an error the chat path raises.
_PARAMS = (("max_tokens", "max_output_tokens"), ("reasoning_effort", "reasoning.effort"),
           ("response_format.json_schema.schema", "text.format.schema"), ("response_format", "text.format"))
_TOOL_FIELD = re.compile(r"(tools[.\[]\d+\]?)\.function\.")


def _renamed(e: APIError, origins: list[str]) -> APIError:
    """An error of the chat path with the Responses request's names for its fields."""
    return openai_api.renamed_error(e, origins, _PARAMS, _TOOL_FIELD, r"\1.", keep_rest=True)


# -- the answer ---------------------------------------------------------------------------------------------------

def _status(reason: str | None) -> tuple[str, dict | None, dict | None]:
    """The chat's finish_reason as (status, incomplete_details, error)."""
    if reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    if reason == "abort":
        return "failed", None, {"code": "server_error", "message": "the request was aborted (/abort_request)"}
    return "completed", None, None


def _reasoning_tokens(serving: Serving, call: openai_api.ChatCall, u: Update | None) -> int:
    """The output's tokens from its reasoning's start to its end marker's end (all of them where it never ended;
    0 without reasoning), as SGLang counts ``reasoning_tokens``: by the text the output ids decode to."""
    if call.thinking is None or u is None or u.result is None:
        return 0
    parts = ReasoningSplitter(call.thinking).parts(u.text, True)
    if parts.reasoning is None:
        return 0
    ids = u.result["output_ids"]
    tok = serving.tokenizer

    def tokens_to(pos: int) -> int:  # the fewest leading ids whose text reaches ``pos`` characters
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(tok.decode(ids[:mid], skip_special_tokens=call.skip_special)) >= pos:
                hi = mid
            else:
                lo = mid + 1
        return lo

    start = tokens_to(parts.start) if parts.start else 0
    end = tokens_to(parts.end) if parts.end is not None else len(ids)
    return max(0, end - start)


def _usage(input_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict:
    # (no prompt cache is reported here: cached_tokens 0)
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def _response(body: ResponsesRequest, rid: str, created: int, status: str, output: list[dict], usage: dict | None,
              incomplete: dict | None = None, error: dict | None = None) -> dict:
    """The response object, the request's fields echoed as OpenAI's does (the defaults where they were left out)."""
    tools = []
    for t in body.tools or []:  # (validated by to_chat: function, custom and local_shell tools)
        if t["type"] == "function":
            tools.append({"type": "function", "name": t["name"], "description": t.get("description"),
                          "parameters": t.get("parameters"), "strict": t.get("strict")})
        elif t["type"] == "custom":
            tools.append({"type": "custom", "name": t["name"], "description": t.get("description"),
                          "format": t.get("format") or {"type": "text"}})
        else:
            tools.append({"type": t["type"]})
    reasoning = body.reasoning or {}
    fmt = (body.text or {}).get("format") or {"type": "text"}
    return {"id": rid, "object": "response", "created_at": created, "status": status, "background": False,
            "error": error, "incomplete_details": incomplete, "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens, "max_tool_calls": None, "model": body.model,
            "output": output, "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": {"effort": reasoning.get("effort"),
                          "summary": reasoning.get("summary", reasoning.get("generate_summary"))},
            "store": False, "temperature": body.temperature, "text": {"format": fmt},
            "tool_choice": body.tool_choice if body.tool_choice is not None else "auto", "tools": tools,
            "top_p": body.top_p, "truncation": "disabled", "usage": usage, "user": body.user,
            "metadata": body.metadata or {}}


def _message_item(text: str, status: str, item_id: str | None = None, logprobs: list | None = None) -> dict:
    return {"id": item_id or f"msg_{_hex()}", "type": "message", "role": "assistant", "status": status,
            "content": [_output_text(text, logprobs)]}


def _output_text(text: str, logprobs: list | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def _reasoning_item(text: str, summary: bool, status: str, encrypted: bool, item_id: str | None = None) -> dict:
    item = {"id": item_id or f"rs_{_hex()}", "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if summary else [],
            "content": [{"type": "reasoning_text", "text": text}], "status": status}
    if encrypted:
        item["encrypted_content"] = None  # (nothing is encrypted here: the reasoning is in content)
    return item


def _call_item(tc: dict, kinds: dict[str, str], item_id: str | None = None) -> dict:
    """A call's output item: a function_call, or for a tool offered as a function (_tools) the item its kind's
    client reads: a custom_tool_call with the ``input`` text, a local_shell_call with the exec action."""
    f = tc["function"]
    kind = kinds.get(f["name"])
    if kind is None:
        return {"id": item_id or f"fc_{_hex()}", "type": "function_call", "call_id": tc["id"], "name": f["name"],
                "arguments": f["arguments"], "status": "completed"}
    args = json.loads(f["arguments"])  # (a JSON object: the tool-call reader hands on no other)
    if kind == "custom":
        text = args.get("input")
        return {"id": item_id or f"ctc_{_hex()}", "type": "custom_tool_call", "call_id": tc["id"], "name": f["name"],
                "input": text if isinstance(text, str) else f["arguments"], "status": "completed"}
    action = {"type": "exec", "command": args.get("command"), "timeout_ms": args.get("timeout_ms"),
              "working_directory": args.get("working_directory"), "env": args.get("env"), "user": args.get("user")}
    return {"id": item_id or f"lsh_{_hex()}", "type": "local_shell_call", "call_id": tc["id"], "action": action,
            "status": "completed"}


def _encrypted(body: ResponsesRequest) -> bool:
    return "reasoning.encrypted_content" in (body.include or [])


async def responses(serving: Serving, request: HTTPRequest):
    body: ResponsesRequest = parse_body(ResponsesRequest, await request.body())  # type: ignore[assignment]
    serving.check_model(body.model)
    rid = f"resp_{_hex()}"  # the engine request's id too: /abort_request takes it
    tr = to_chat(body, stream=bool(body.stream), rid=rid)
    try:
        call = await openai_api.start_chat(serving, tr.chat)
    except APIError as e:
        raise _renamed(e, tr.origins) from None
    if body.stream:
        events = _Events(serving, call, tr, body)
        return await serving.stream(call.sub, request, events.events(), failure=events.failure)
    finals = await serving.wait(call.sub, request)
    [u] = finals
    [choice] = call.choices(finals)
    msg = choice["message"]
    content, reasoning = msg.get("content") or "", msg.get("reasoning_content")
    status, incomplete, error = _status(choice["finish_reason"])
    kinds: list[tuple[str, object]] = []  # (kind, text or call) in output order
    if reasoning and call.thinking is not None:
        # Text the model wrote before its reasoning comes first, as the stream sends it (an empty reasoning opens
        # no item: the text around it is one message).
        start = ReasoningSplitter(call.thinking).parts(u.text, True).start
        before = u.text[:start] if start else ""
        if before and content.startswith(before):
            kinds.append(("message", before))
            content = content[len(before):]
    if reasoning:
        kinds.append(("reasoning", reasoning))
    if content:
        kinds.append(("message", content))
    kinds += [("function_call", tc) for tc in msg.get("tool_calls") or []]
    output = []
    # With include message.output_text.logprobs: every generated token's (the chat's logprobs, as SGLang's
    # Responses give them), on the first message's text.
    logprobs = (choice["logprobs"] or {}).get("content")
    for i, (kind, what) in enumerate(kinds):
        # (an item the end closes takes the response's status, as the stream's last item does)
        item_status = "incomplete" if status == "incomplete" and i == len(kinds) - 1 else "completed"
        if kind == "message":
            output.append(_message_item(what, item_status, logprobs=logprobs))  # type: ignore[arg-type]
            logprobs = None
        elif kind == "reasoning":
            output.append(_reasoning_item(what, tr.summary, item_status, _encrypted(body)))  # type: ignore[arg-type]
        else:
            output.append(_call_item(what, tr.kinds))  # type: ignore[arg-type]
    usage = _usage(len(call.ids), len(u.result["output_ids"]),
                   await serving.off_loop(_reasoning_tokens, serving, call, u))
    return _response(body, rid, call.created, status, output, usage, incomplete, error)


def _sse(name: str, payload: dict) -> bytes:
    return sse(payload, event=name)


class _Events:
    """The chat stream's chunks as Responses events. An item opens with its first text (reasoning, message) and
    closes when another kind comes; each tool call (the chat sends it whole) is a function_call item with its
    arguments in one delta. response.created goes out with the first chunk (at the first tokens: a failure before
    that is an HTTP error, serving.stream); a failure after it is a response.failed event."""

    def __init__(self, serving: Serving, call: openai_api.ChatCall, tr: Translated, body: ResponsesRequest):
        self.serving, self.call, self.tr, self.body = serving, call, tr, body
        self.seq = 0
        self.output: list[dict] = []  # items closed, in output order
        self.open: dict | None = None  # the item open: its object (its text so far in "text")
        self.kind: str | None = None

    def event(self, event_type: str, /, **payload) -> bytes:
        out = _sse(event_type, {"type": event_type, "sequence_number": self.seq, **payload})
        self.seq += 1
        return out

    def response(self, status: str, usage: dict | None = None, incomplete: dict | None = None,
                 error: dict | None = None) -> dict:
        return _response(self.body, self.call.cid, self.call.created, status, list(self.output), usage, incomplete,
                         error)

    def failure(self, e: APIError) -> list[bytes]:
        error = {"code": e.code or "server_error", "message": e.message}
        return [self.event("response.failed", response=self.response("failed", error=error))]

    def _where(self) -> dict:
        return {"item_id": self.open["id"], "output_index": len(self.output)}  # type: ignore[index]

    def close(self, status: str = "completed") -> list[bytes]:
        item, kind = self.open, self.kind
        if item is None:
            return []
        self.open = self.kind = None
        where = {"item_id": item["id"], "output_index": len(self.output)}
        text = item.pop("text", "")
        out = []
        if kind == "message":
            done = _message_item(text, status, item["id"])
            part = done["content"][0]
            out += [self.event("response.output_text.done", **where, content_index=0, text=text, logprobs=[]),
                    self.event("response.content_part.done", **where, content_index=0, part=part)]
        elif kind == "reasoning":
            done = _reasoning_item(text, self.tr.summary, status, _encrypted(self.body), item["id"])
            out += [self.event("response.reasoning_text.done", **where, content_index=0, text=text),
                    self.event("response.content_part.done", **where, content_index=0,
                               part={"type": "reasoning_text", "text": text})]
            if self.tr.summary:
                part = {"type": "summary_text", "text": text}
                out += [self.event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                        self.event("response.reasoning_summary_part.done", **where, summary_index=0, part=part)]
        elif item["type"] == "function_call":
            done = item
            out.append(self.event("response.function_call_arguments.done", **where, name=item["name"],
                                  arguments=item["arguments"]))
        elif item["type"] == "custom_tool_call":
            done = item
            out.append(self.event("response.custom_tool_call_input.done", **where, input=item["input"]))
        else:  # (a local_shell_call: its item whole, in output_item.added / .done, as OpenAI streams it)
            done = item
        out.append(self.event("response.output_item.done", output_index=len(self.output), item=done))
        self.output.append(done)
        return out

    def open_item(self, kind: str) -> list[bytes]:
        if self.kind == kind and kind != "function_call":
            return []
        out = self.close()
        index = len(self.output)
        if kind == "message":
            item = _message_item("", "in_progress")
            item["content"] = []
            out.append(self.event("response.output_item.added", output_index=index, item=item))
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part=_output_text("")))
        else:
            item = _reasoning_item("", False, "in_progress", _encrypted(self.body))
            item["content"] = []
            out.append(self.event("response.output_item.added", output_index=index, item=item))
            out.append(self.event("response.content_part.added", item_id=item["id"], output_index=index,
                                  content_index=0, part={"type": "reasoning_text", "text": ""}))
            if self.tr.summary:
                out.append(self.event("response.reasoning_summary_part.added", item_id=item["id"],
                                      output_index=index, summary_index=0, part={"type": "summary_text", "text": ""}))
        item["text"] = ""
        self.open, self.kind = item, kind
        return out

    def delta(self, kind: str, text: str) -> list[bytes]:
        out = self.open_item(kind)
        self.open["text"] += text  # type: ignore[index]
        where = self._where()
        if kind == "message":
            out.append(self.event("response.output_text.delta", **where, content_index=0, delta=text, logprobs=[]))
        else:
            out.append(self.event("response.reasoning_text.delta", **where, content_index=0, delta=text))
            if self.tr.summary:
                out.append(self.event("response.reasoning_summary_text.delta", **where, summary_index=0, delta=text))
        return out

    def tool_call(self, tc: dict) -> list[bytes]:
        out = self.close()
        index = len(self.output)
        item = _call_item(tc, self.tr.kinds)
        key = {"function_call": "arguments", "custom_tool_call": "input"}.get(item["type"])
        if key is None:  # local_shell_call
            out.append(self.event("response.output_item.added", output_index=index,
                                  item={**item, "status": "in_progress"}))
        else:
            out.append(self.event("response.output_item.added", output_index=index,
                                  item={**item, key: "", "status": "in_progress"}))
            name = "function_call_arguments" if key == "arguments" else "custom_tool_call_input"
            out.append(self.event(f"response.{name}.delta", item_id=item["id"], output_index=index,
                                  delta=item[key]))
        self.open, self.kind = item, "function_call"
        return out + self.close()

    async def events(self) -> AsyncIterator[bytes]:
        def start() -> list[bytes]:
            r = self.response("in_progress")
            return [self.event("response.created", response=r), self.event("response.in_progress", response=r)]

        async for piece in self.call.pieces():
            kind = piece[0]
            if kind == "start":
                out = start()
            elif kind == "reasoning":
                out = self.delta("reasoning", piece[1])
            elif kind == "content":
                out = self.delta("message", piece[1])
            elif kind == "tool_call":
                out = self.tool_call(piece[1])
            else:  # "end"
                _, reason, _, output_tokens = piece
                out = []
            for e in out:
                yield e
        status, incomplete, error = _status(reason)
        for e in self.close("incomplete" if status == "incomplete" else "completed"):
            yield e
        reasoning_tokens = await self.serving.off_loop(_reasoning_tokens, self.serving, self.call,
                                                       self.call.finished.get(0))
        usage = _usage(len(self.call.ids), output_tokens, reasoning_tokens)
        yield self.event(f"response.{status}", response=self.response(status, usage, incomplete, error))


async def not_stored(serving: Serving, request: HTTPRequest):
    """GET / DELETE /v1/responses/{id}, POST .../cancel, GET .../input_items: nothing is stored here."""
    raise APIError(404, f"{request.url.path}: this server stores no responses (store and previous_response_id are "
                   "not supported), so there is none to retrieve, delete or cancel", code="response_not_found")
