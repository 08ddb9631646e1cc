"""Request bodies of the HTTP API and its error shape.

Bodies are validated strictly (``"5"`` is not an integer, ``1`` is not a boolean) so that a client's type
mistake is a 400 naming the field, never a silent coercion. Unknown fields are ignored, as OpenAI-compatible
servers do for the many optional fields clients send; fields we know but cannot honour (``best_of`` other than
``n``, tools, ...) are rejected by the endpoints with a message saying so.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# -- errors ---------------------------------------------------------------------------------------------

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 500: "internal_server_error",
                503: "service_unavailable_error"}


MAX_MESSAGE_CHARS = 1000  # an error message longer than this is cut (APIError)
# Arrays and objects nested within a body's top-level value that its JSON parser (pydantic-core's) reads; deeper is
# a 400 saying so.
MAX_JSON_DEPTH = 200


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "param", "code"}}`` with HTTP ``status``. A message
    over MAX_MESSAGE_CHARS is cut there, whatever built it: one that quotes a client's value whole (a model name, a
    rid, a sampling value of megabytes) would echo the megabytes back."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str | None = None):  # noqa: A002  (OpenAI's field name)
        if len(message) > MAX_MESSAGE_CHARS:
            message = f"{message[:MAX_MESSAGE_CHARS]}... (cut: {len(message)} characters)"
        if param is not None and len(param) > 200:  # (pydantic's path holds a dict's keys: a client's text)
            param = param[:200] + "..."
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _ERROR_TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_SCALAR_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _is_union_tag(part) -> bool:
    """pydantic puts the union member it tried into ``loc`` (``prompt.str``, ``prompt.list[int]``)."""
    return isinstance(part, str) and (part in _SCALAR_TAGS or "[" in part or part[:1].isupper())


def _path(loc: tuple) -> str:
    """A field's path (``messages.0.role``); a part that is a client's dict key is cut short."""
    return ".".join(str(p) if len(str(p)) <= 40 else f"{str(p)[:40]}..." for p in loc)


def validation_error(e: ValidationError) -> APIError:
    """A pydantic error as a 400 naming the first offending field (``messages.0.role``); the errors of the
    members of one union collapse into one "expected one of" line."""
    errs = e.errors(include_url=False)
    if not errs:
        return APIError(400, str(e))
    if errs[0].get("type") == "json_invalid":
        msg = str(errs[0].get("msg"))
        if "recursion limit exceeded" in msg:  # (pydantic-core's JSON parser: its words for nesting too deep)
            return APIError(400, f"the request body nests arrays and objects too deeply: at most {MAX_JSON_DEPTH} "
                            "levels within the top-level value", code="invalid_json")
        return APIError(400, f"the request body is not valid JSON: {msg}", code="invalid_json")
    groups: dict[tuple, list[dict]] = {}
    tags: dict[tuple, list[str]] = {}
    for err in errs:
        loc = tuple(err.get("loc", ()))
        i = next((j for j, p in enumerate(loc) if _is_union_tag(p)), len(loc))
        key = loc[:i]
        groups.setdefault(key, []).append(err)
        if i < len(loc) and loc[i] not in tags.setdefault(key, []):
            tags[key].append(loc[i])
    parts = []
    for key, group in list(groups.items())[:5]:
        where = _path(key) or "body"
        got = group[0].get("input")
        shown = repr(got) if len(repr(got)) < 80 else type(got).__name__
        if len(tags.get(key, ())) > 1:
            parts.append(f"{where}: expected one of {', '.join(tags[key])} (got {shown})")
        else:
            parts.append(f"{where}: {group[0].get('msg')} (got {shown})")
    more = f" (and {len(groups) - 5} more)" if len(groups) > 5 else ""
    param = _path(next(iter(groups))) or None
    return APIError(400, "; ".join(parts) + more, param=param)


def parse_body(model: type[BaseModel], body: bytes) -> BaseModel:
    if not body:
        raise APIError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise validation_error(e) from None


# -- bodies -------------------------------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM/SGLang: usage on every chunk


class _SamplingFields(_Body):
    """Sampling fields shared by the OpenAI endpoints (SGLang's extensions included). Other fields are kept in
    ``model_extra``: the endpoints refuse those of SGLang's they cannot honour (openai_api.py)."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str = "default"  # SGLang's default: a request may leave the model out
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # token id (as a string, JSON's keys) -> bias
    user: str | None = None
    # SGLang extensions
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    top_k: int | None = None
    min_p: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None
    no_stop_trim: bool | None = None  # the matched stop string stays in the text
    skip_special_tokens: bool | None = None
    # Structured output: OpenAI's response_format (text, json_object, json_schema) or SGLang's own fields
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None
    response_format: dict | None = None
    # SGLang's: the request's id (/abort_request names it); several requests get <rid>_<i>, as on /generate
    rid: str | list[str] | None = None
    # SGLang's sampling custom_params, handed to the engine's sampling params as they are: it reads
    # ``thinking_budget`` (strict thinking's budget) and refuses any other key
    custom_params: dict | None = None


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = None  # None: OpenAI's default, 16 (cut to what the prompt leaves)
    logprobs: int | None = None  # top logprobs a token (0: the chosen token's only)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


class ChatMessage(BaseModel):
    # Extra keys go through to the chat template, as with Hugging Face. ``content``: a string or a list of content
    # parts, each checked by server/messages.py (text parts only: a 400 naming an image, audio or other part).
    # ``name``, ``tool_call_id`` and ``reasoning_content`` are strings, as in SGLang's messages (a 400 naming the field
    # otherwise, rather than a template that writes a list or an object where it expects text).
    model_config = ConfigDict(strict=True, extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Any] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    # OpenAI's deprecated forms of tools and tool_choice: SGLang reads neither; refused when set (openai_api.py), not
    # answered as if no functions were given.
    functions: Any = None
    function_call: Any = None
    # SGLang's: a last assistant message is continued (the reply extends its text) instead of answered
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None  # SGLang/vLLM extension: more variables for the chat template
    add_generation_prompt: bool = True  # SGLang/vLLM extension
    # OpenAI's reasoning_effort (a tier, or SGLang's number in [0, 0.99]) and SGLang's reasoning ({"effort",
    # "enabled"}): the template's reasoning_effort and thinking / enable_thinking (openai_api.template_kwargs)
    reasoning_effort: Any = None
    reasoning: Any = None
    # SGLang's, with --reasoning-parser (server/reasoning.py): the reasoning apart in reasoning_content, and streamed
    # as it comes (false: in one delta once it has ended).
    separate_reasoning: bool = True
    stream_reasoning: bool = True


class GenerateRequest(_Body):
    """SGLang's /generate body (GenerateReqInput): one prompt or a batch (lists). Other fields are kept in
    ``model_extra``: the endpoint refuses those of SGLang's it cannot honour (runtime/request.py,
    SGLANG_UNSUPPORTED)."""

    model_config = ConfigDict(strict=True, extra="allow")

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: dict | list[dict] | None = None
    stream: bool = False
    return_logprob: bool | list[bool] | None = None
    logprob_start_len: int | list[int] | None = None
    top_logprobs_num: int | list[int] | None = None
    return_text_in_logprobs: bool | None = None  # one for the whole batch, as SGLang's
    rid: str | list[str] | None = None
    # SGLang's per-request thinking budget (one for the whole batch): needs --enable-strict-thinking; goes into each
    # prompt's sampling_params.custom_params.thinking_budget (app.generate)
    max_thinking_tokens: int | None = None


class AbortRequest(_Body):
    """SGLang's /abort_request body (AbortReq): a request id (prefix), or every request."""

    rid: str | None = None
    abort_all: bool = False


class SeparateReasoningRequest(_Body):
    """SGLang's /separate_reasoning body (SeparateReasoningReqInput): a text and the reasoning format to split it
    by; ``return_blocks``: the parts as blocks too."""

    text: str
    reasoning_parser: str
    return_blocks: bool = False


class ParseFunctionCallRequest(_Body):
    """SGLang's /parse_function_call body (ParseFunctionCallReq): a text, OpenAI's function ``tools`` it may call,
    and the call format (left out: the server's --tool-call-parser)."""

    text: str
    tools: list[Any] = Field(default_factory=list)
    tool_call_parser: str | None = None


class TokenizeRequest(_Body):
    """SGLang's /v1/tokenize body: ``prompt`` (a text, or a list of texts) or ``messages`` (a chat, rendered as
    /v1/chat/completions renders it, with ``tools``, ``tool_choice``, ``chat_template_kwargs`` and
    ``continue_final_message``), exactly one (the endpoint checks it). ``add_generation_prompt``: left out, the
    messages render as for a chat completion (with the generation prompt) and ``add_special_tokens`` is not read;
    given, it is the template's value and ``add_special_tokens`` applies only where the client set it (SGLang's
    rule: a rendered chat holds its own special tokens)."""

    model: str = "default"
    prompt: str | list[str] | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None  # (a forced call's schema only: never changes the prompt)
    continue_final_message: bool = False
    chat_template_kwargs: dict | None = None
    reasoning_effort: Any = None  # (as chat's: the prompt counted is the chat's)
    reasoning: Any = None
    add_special_tokens: bool = True
    add_generation_prompt: bool | None = None


class DetokenizeRequest(_Body):
    """SGLang's /v1/detokenize body: ``tokens``, one list of ids (answered with one text) or a list of them (a list
    of texts)."""

    model: str = "default"
    tokens: list[int] | list[list[int]]
    skip_special_tokens: bool = True


# -- Anthropic's Messages API (server/anthropic_api.py) -------------------------------------------------------------


class AnthropicMessage(_Body):
    """One turn: ``content`` a string or a list of content blocks, each checked by server/anthropic_api.py (a 400
    naming ``messages.i.content.j`` for a block it does not take)."""

    role: Literal["user", "assistant"]
    content: str | list[Any]


class AnthropicCountTokensRequest(_Body):
    """``POST /v1/messages/count_tokens``: the prompt fields of a Messages request (no ``max_tokens``). ``system``: a
    string or text blocks; ``tools``, ``tool_choice``, ``thinking``, ``output_config``: objects, checked field by field
    by server/anthropic_api.py. Other fields (Anthropic's ``betas``, ``cache_control`` on blocks, ...) are ignored."""

    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[Any] | None = None
    tools: list[Any] | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None
    output_config: dict | None = None
    # Anthropic's MCP connector: refused where it names servers (their tools would run on the API's side); the other
    # fields of Anthropic's that a local server has no use for (``context_management``, ``container``,
    # ``service_tier``, ``betas``, ``cache_control``) are ignored.
    mcp_servers: list[Any] | None = None


class AnthropicMessagesRequest(AnthropicCountTokensRequest):
    """``POST /v1/messages`` (Anthropic's MessageCreateParams): ``max_tokens`` is required, as Anthropic requires it;
    ``metadata`` is accepted and not read (its ``user_id`` has no use here)."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict | None = None


# -- OpenAI's Responses API (server/responses_api.py) ---------------------------------------------------------------


class ResponsesRequest(_Body):
    """``POST /v1/responses`` (OpenAI's ResponseCreateParams). ``input``: a string (one user message) or a list of
    items, ``tools``, ``tool_choice``, ``reasoning``, ``text``: checked item by item and field by field by
    server/responses_api.py (a 400 naming ``input.i.content.j`` or ``tools.i.type`` for what it does not take). The
    conversation-state fields (``previous_response_id``, ``conversation``, ``store: true``, ``background: true``),
    ``prompt``, ``include`` values other than ``reasoning.encrypted_content`` and ``message.output_text.logprobs``
    (which ``top_logprobs`` goes with), ``max_tool_calls`` and ``truncation: auto`` are refused there; ``metadata``,
    ``user``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, ``stream_options``, ``client_metadata``
    and ``text.verbosity`` are accepted and not read.
    Other fields are ignored."""

    model: str = "default"  # (SGLang's default, as on the chat endpoint)
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict | None = None
    text: dict | None = None
    stream: bool | None = False
    metadata: dict | None = None
    user: str | None = None
    chat_template_kwargs: dict | None = None  # (SGLang's extension, as on the chat endpoint)
    # Refused unless their neutral value (server/responses_api.py says why)
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    prompt: Any = None
    include: list[str] | None = None
    truncation: str | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
