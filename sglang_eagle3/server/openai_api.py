"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (non-streaming and SSE streaming).

Response shapes follow OpenAI's (``text_completion`` / ``chat.completion`` objects, ``*.chunk`` events, a
``usage`` block; with ``stream_options.include_usage`` a last chunk with empty ``choices`` carries it), plus
SGLang's ``matched_stop`` on each choice.

``n`` > 1: n requests a prompt, submitted together; choice ``index`` = prompt index x n + j (OpenAI's and vLLM's
order). With a ``seed``, request j samples with seed + j: choice 0 is what n=1 gives, the others differ, and a
rerun repeats them all; without one each request draws its own seed. ``usage.prompt_tokens`` counts each prompt
once. ``logprobs`` objects: server/logprobs.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request as HTTPRequest

from sglang_eagle3.runtime.request import sglang_neutral
from sglang_eagle3.runtime.sampling import GRAMMAR_KINDS, seeded, short_repr
from sglang_eagle3.server.driver import Submission, Update
from sglang_eagle3.server.logprobs import (
    ChoiceTokens,
    Token,
    TokenTable,
    chat_logprobs,
    completion_logprobs,
    tokens_of,
)
from sglang_eagle3.server.messages import check_content_parts, message_dict, text_of
from sglang_eagle3.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from sglang_eagle3.server.reasoning import (
    REASONING_FORMATS,
    Parts,
    ReasoningFormat,
    ReasoningSplitter,
    ReasoningStream,
    opened_by_prompt,
)
from sglang_eagle3.server.serving import Serving, finish_reason, request_ids, samples_per_prompt, sse
from sglang_eagle3.server.tools import TOOL_CALL_PARSERS, ToolPlan
from sglang_eagle3.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

# Engine sampling names -> the OpenAI field a client sets.
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                 "top_k": "top_k", "min_p": "min_p", "stop": "stop", "stop_token_ids": "stop_token_ids",
                 "seed": "seed", "min_new_tokens": "min_tokens"}
_OPENAI_GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")  # SGLang's grammar fields on its OpenAI requests
_COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
# Fields of SGLang's OpenAI requests (protocol.py's CompletionRequest / ChatCompletionRequest) that ask for what this
# server does not do: a value other than a neutral one (None, False, 0, "": sglang_neutral) is a 400 naming the field,
# never dropped unread (a client asking for hidden states or token ids would read a reply without them).
_SGLANG_OPENAI_UNSUPPORTED = {
    "lora_path": "LoRA adapters", "custom_logit_processor": "custom logit processors",
    "return_hidden_states": "hidden states",
    "return_routed_experts": "routed experts", "routed_experts_start_len": "routed experts",
    **dict.fromkeys(("bootstrap_host", "bootstrap_port", "bootstrap_room", "disagg_prefill_dp_rank"),
                    "prefill/decode disaggregation"),
    "routed_dp_rank": "data parallelism", "data_parallel_rank": "data parallelism", "session_id": "sessions",
    "session_params": "sessions", "priority": "priority scheduling",
    "return_token_ids": "token ids in the choices", "return_prompt_token_ids": "token ids in the choices",
    "return_meta_info": "meta_info in the choices", "return_cached_tokens_details": "cached-token details",
    "return_spec_tokens_details": "speculative-decoding details", "return_input_ids_in_sglext": "sglext",
    "return_output_ids_in_sglext": "sglext", "return_sampling_mask": "sampling masks",
    "sampling_logprobs_mode": "sampling masks", "return_flat_raw_output_top_logprobs": "flat raw logprobs",
}


def _reject_unsupported(body) -> None:
    """400 for OpenAI (and SGLang) fields this server knows but cannot honour (never silently ignored)."""
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")
    extra = body.model_extra or {}
    for name, what in _SGLANG_OPENAI_UNSUPPORTED.items():
        if name in extra and not sglang_neutral(extra[name]):
            raise APIError(400, f"{name}={short_repr(extra[name])}: this server does not support {what} (SGLang's "
                           "field; leave it out, null or false)", param=name)


def _sampling_params(body, max_new_tokens: int | None) -> dict:
    """Engine sampling params; max_new_tokens None (the client set none) is left out: the endpoint passes its
    default to Serving.make_request, which cuts it to what the prompt leaves."""
    sp: dict = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids", "ignore_eos", "frequency_penalty",
                 "presence_penalty", "repetition_penalty", "logit_bias", "stop_regex", "no_stop_trim",
                 "skip_special_tokens", "custom_params"):  # (custom_params: the engine reads thinking_budget alone)
        v = getattr(body, name)
        if v is not None:
            sp[name] = v
    if body.min_tokens is not None:
        sp["min_new_tokens"] = body.min_tokens
    if body.stop is not None:
        sp["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    for name in _OPENAI_GRAMMAR_FIELDS:
        if getattr(body, name) is not None:
            sp[name] = getattr(body, name)
    grammar = _response_format_grammar(body.response_format)
    if grammar is not None:
        kind, text = grammar
        given = next((k for k in _OPENAI_GRAMMAR_FIELDS if k in sp), None)
        if given is not None:
            raise APIError(400, f"response_format and {given} are both given: a request takes one grammar",
                           param="response_format")
        sp[kind] = text
    return sp


def _field_names(body, **more: str) -> dict[str, str]:
    """Engine sampling names -> the fields this body's client set (errors name those)."""
    names = {**_OPENAI_NAMES, **more}
    if body.response_format is not None:
        names["structural_tag"] = "response_format"
        if body.json_schema is None:
            names["json_schema"] = "response_format"
    return names


JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's json_object: "a valid JSON object", as SGLang 0.5.23 asks


def _response_format_grammar(fmt: dict | None) -> tuple[str, str] | None:
    """The engine's grammar (kind, text) for OpenAI's ``response_format`` (SGLang 0.5.23's reading): None for text,
    a JSON object for json_object, the serialized schema for json_schema (400 without one, as SGLang's "schema_ is
    required"), SGLang's structural tag (the format serialized, its type beside it) for structural_tag."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", JSON_OBJECT_SCHEMA
    if kind == "structural_tag":
        try:
            return "structural_tag", json.dumps(fmt, allow_nan=False)
        except ValueError:
            raise APIError(400, "response_format holds NaN or Infinity, which JSON has no value for",
                           param="response_format") from None
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise APIError(400, f"response_format.json_schema={short_repr(spec)} must be an object with the "
                           "schema under 'schema'", param="response_format.json_schema")
        schema = spec.get("schema", spec.get("schema_"))
        if schema is None:
            raise APIError(400, "response_format.json_schema has no schema: give it under 'schema' (for any JSON "
                           "object use response_format {\"type\": \"json_object\"})",
                           param="response_format.json_schema.schema")
        if not isinstance(schema, (dict, bool)):
            raise APIError(400, f"response_format.json_schema.schema={short_repr(schema)} must be a JSON schema "
                           "(an object)", param="response_format.json_schema.schema")
        try:
            return "json_schema", json.dumps(schema, allow_nan=False)
        except ValueError:  # NaN / Infinity: no JSON value, so no schema xgrammar could read
            raise APIError(400, "response_format.json_schema.schema holds NaN or Infinity, which JSON has no "
                           "value for", param="response_format.json_schema.schema") from None
    # (no type is no format either: OpenAI, vLLM and SGLang require one, and reading it as text would drop a schema
    # the client meant to send without a word)
    what = "has no type" if kind is None else f"type={short_repr(kind)} is not supported"
    raise APIError(400, f"response_format {what} (text, json_object, json_schema or structural_tag)",
                   param="response_format.type")


def _choices_per_prompt(body) -> int:
    return samples_per_prompt(body.n, "n")


def _check_top(name: str, value: int | None, cap: int, openai_cap: int) -> None:
    """``logprobs`` (completions) / ``top_logprobs`` (chat): top logprobs a position, up to the server's cap."""
    if value is not None and not 0 <= value <= cap:
        raise APIError(400, f"{name}={value} must be an integer in [0, {cap}] (this server's limit: "
                       f"--max-top-logprobs-num, or the vocabulary's size; OpenAI's is {openai_cap})", param=name)


def _check_max_tokens(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise APIError(400, f"{name}={value} must be an integer >= 1", param=name)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _delta(sent: str, text: str) -> str:
    """The new part of a cumulative text (the driver guarantees ``text`` extends ``sent``)."""
    return text[len(sent):] if text.startswith(sent) else ""


# -- /v1/completions -----------------------------------------------------------------------------------------

async def completions(serving: Serving, request: HTTPRequest):
    body: CompletionRequest = parse_body(CompletionRequest, await request.body())  # type: ignore[assignment]
    serving.check_model(body.model)
    if serving.tokenizer is None:
        # A completion is text: without a tokenizer every choice came back "" with a 200, the tokens generated and
        # thrown away. /generate answers the output_ids.
        raise APIError(400, "this server was started without a tokenizer (--skip-tokenizer-init): completions "
                       "answer text, which needs one; use /generate with input_ids (it answers output_ids)",
                       param="prompt")
    _reject_unsupported(body)
    n = _choices_per_prompt(body)
    if body.best_of is not None and body.best_of != n:
        raise APIError(400, f"best_of={body.best_of} with n={n} is not supported: best_of must equal n or be left "
                       "out (every sample is returned; none are ranked away)", param="best_of")
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    top = body.logprobs
    _check_top("logprobs", top, serving.model.top_logprobs_cap, 5)
    _check_max_tokens("max_tokens", body.max_tokens)
    prompt = body.prompt
    if isinstance(prompt, list) and not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    # str | list[int] -> one prompt; list[str] | list[list[int]] -> a batch (n choices each).
    batch = not (isinstance(prompt, str) or isinstance(prompt[0], int))
    prompts = list(prompt) if batch else [prompt]
    serving.check_batch_size(len(prompts), "prompt", n)
    sp = _sampling_params(body, body.max_tokens)
    names = _field_names(body, top_logprobs_num="logprobs")
    echo = bool(body.echo)
    # With echo the prompt's logprobs come too (from its first token, which has none: null).
    lp = {"return_logprob": top is not None, "logprob_start_len": 0 if echo and top is not None else None,
          "top_logprobs_num": top}
    rids = request_ids(body.rid, len(prompts), batch)
    # The response's id is what /abort_request takes (as SGLang's, which answers with the request's rid): the
    # client's rid, else ours, the prefix of every engine request of this one (<id>_<i> a prompt, _<j> a choice).
    cid = body.rid if isinstance(body.rid, str) else f"cmpl-{uuid.uuid4().hex}"
    if body.rid is None:
        rids = request_ids(cid, len(prompts), batch)

    def rid(i: int, j: int) -> str | None:  # (choice j of prompt i; as /generate names n samples)
        return rids[i] if n == 1 or rids[i] is None else f"{rids[i]}_{j}"

    def build() -> list:
        reqs = []
        for i, p in enumerate(prompts):
            kw = dict(prompt_param="prompt", names=names, default_max_new_tokens=_COMPLETION_MAX_TOKENS,
                      index=i if batch else None, **lp)
            first = serving.make_request(prompt=p if isinstance(p, str) else None,
                                         input_ids=None if isinstance(p, str) else p, sampling_params=sp,
                                         rid=rid(i, 0), **kw)
            # The prompt is tokenized once; its other choices reuse the ids.
            reqs += [first] + [serving.make_request(input_ids=first.input_ids, sampling_params=seeded(sp, j),
                                                    rid=rid(i, j), **kw) for j in range(1, n)]
        return reqs

    reqs = await serving.off_loop(build)
    firsts = reqs[::n]  # one request of each prompt
    # Echoed text: the prompt as sent, or the token prompt's text (special tokens skipped, as output text is).
    echoes = [(p if isinstance(p, str) else _decode(serving, r.input_ids)) if echo else ""
              for p, r in zip(prompts, firsts, strict=True)]
    view = _CompletionView(serving.token_table, echo and top is not None, top is not None, n, echoes,
                           [not isinstance(p, str) for p in prompts], sp.get("skip_special_tokens", True))
    sub = serving.submit(reqs, stream=bool(body.stream))
    created = int(time.time())
    prompt_tokens = sum(len(r.input_ids) for r in firsts)
    if body.stream:
        return await serving.stream(sub, request, _completion_chunks(sub, view, cid, created, body.model,
                                                                     prompt_tokens, body.stream_options))
    finals = await serving.wait(sub, request)

    def choices() -> list[dict]:
        out = []
        for u in finals:
            reason, matched = finish_reason(u.result)
            out.append({"index": u.index, "text": view.echo(u.index) + u.text, "logprobs": view.final(u),
                        "finish_reason": reason, "matched_stop": matched})
        return out

    # Naming every token of a long echoed prompt with its top list is real work: off the event loop.
    listed = await serving.off_loop(choices) if top is not None else choices()
    completion_tokens = sum(len(u.result["output_ids"]) for u in finals)
    return {"id": cid, "object": "text_completion", "created": created, "model": body.model, "choices": listed,
            "usage": _usage(prompt_tokens, completion_tokens)}


def _decode(serving: Serving, ids: list[int]) -> str:
    return serving.tokenizer.decode(ids) if serving.tokenizer is not None else ""


class _CompletionView:
    """How the choices of one /v1/completions call show their echo and logprobs (choice k is prompt k // n's)."""

    def __init__(self, table: TokenTable | None, prompt_logprobs: bool, logprobs: bool, n: int, echoes: list[str],
                 echo_skips_special: list[bool], skip_special: bool = True):
        self.table, self.prompt_logprobs, self.logprobs, self.n = table, prompt_logprobs, logprobs, n
        self.echoes, self.echo_skips_special = echoes, echo_skips_special
        self.skip_special = skip_special  # the output text holds special tokens unless it skips them

    def echo(self, k: int) -> str:
        return self.echoes[k // self.n]

    def prompt_tokens(self, k: int, rows: tuple[list, list]) -> list:
        """The echoed prompt's tokens with their offsets into the echoed text."""
        tokens = ChoiceTokens(self.table, skip_special=self.echo_skips_special[k // self.n])
        tokens.add(tokens_of(*rows))
        return tokens.release(len(self.echo(k)), True)

    def generated(self, k: int) -> ChoiceTokens:
        """Choice k's generated tokens, placed after its echo."""
        return ChoiceTokens(self.table, base=len(self.echo(k)), skip_special=self.skip_special)

    def block(self, tokens: list) -> dict | None:
        return completion_logprobs(self.table, tokens) if self.logprobs else None

    def final(self, u: Update) -> dict | None:
        """A finished choice's logprobs: every prompt token (with echo), then every output token."""
        if not self.logprobs:
            return None
        meta = u.result["meta_info"]
        tokens = []
        if self.prompt_logprobs:
            tokens = self.prompt_tokens(u.index, (meta["input_token_logprobs"], meta.get("input_top_logprobs")))
        gen = self.generated(u.index)
        gen.add(tokens_of(meta["output_token_logprobs"], meta.get("output_top_logprobs")))
        return self.block(tokens + gen.release(len(u.text), True))


async def _completion_chunks(sub: Submission, view: _CompletionView, cid: str, created: int, model: str,
                             prompt_tokens: int, opts) -> AsyncIterator[bytes]:
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    m = len(sub.requests)
    sent = [""] * m
    generated = [0] * m
    gen = [view.generated(k) for k in range(m)] if view.logprobs else []

    def chunk(k: int, text: str, tokens: list | None = None, reason=None, matched=None) -> bytes:
        c = {"id": cid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": k, "text": text, "logprobs": view.block(tokens or []), "finish_reason": reason}]}
        if reason is not None:
            c["choices"][0]["matched_stop"] = matched
        if include_usage:
            c["usage"] = _usage(prompt_tokens, sum(generated)) if continuous else None
        return sse(c)

    opened = [False] * m
    if not view.prompt_logprobs:  # the echo goes out at once; with its logprobs, once prefill has made them
        for k in range(m):
            if view.echo(k):
                yield chunk(k, view.echo(k))
                opened[k] = True
    async for u in sub.updates():
        if u.error is not None:
            raise u.failure()
        k = u.index
        generated[k] += len(u.new_ids)
        if view.prompt_logprobs and u.prompt_logprobs is not None:
            yield chunk(k, view.echo(k), view.prompt_tokens(k, u.prompt_logprobs))
            opened[k] = True
        delta = _delta(sent[k], u.text)
        sent[k] = u.text if u.text.startswith(sent[k]) else sent[k]
        released = []
        if view.logprobs:
            # A token goes out with the chunk that completes its text: text held back (a stop string may be
            # forming, a character is split) holds its tokens back too; the finish flushes the rest.
            gen[k].add(tokens_of(u.new_logprobs, u.new_top_logprobs))
            released = gen[k].release(len(sent[k]), u.finished)
        # The first token always gets a chunk (its text may still be held back), so the stream opens then.
        if delta or released or not opened[k]:
            yield chunk(k, delta, released)
            opened[k] = True
        if u.finished:
            reason, matched = finish_reason(u.result)
            yield chunk(k, "", None, reason, matched)
    if include_usage:
        yield sse({"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": _usage(prompt_tokens, sum(generated))})
    yield sse("[DONE]")


# -- /v1/chat/completions ------------------------------------------------------------------------------------

def _reject_legacy_functions(body) -> None:
    """OpenAI's deprecated ``functions`` / ``function_call`` (the forms before tools): SGLang has neither field and
    drops them unread, which answers as if the client had offered no functions. A 400 naming the field instead,
    pointing to tools / tool_choice ("none" and null ask for nothing, and pass)."""
    if body.functions is not None:
        raise APIError(400, "functions (OpenAI's deprecated form of tools) is not supported by this server, as by "
                       "SGLang: give them as tools: [{\"type\": \"function\", \"function\": {...}}]", param="functions")
    if body.function_call is not None and body.function_call != "none":
        raise APIError(400, f"function_call={short_repr(body.function_call)} (OpenAI's deprecated form of tool_choice) "
                       "is not supported by this server, as by SGLang: use tool_choice with tools",
                       param="function_call")


def _check_messages(messages) -> None:
    """OpenAI's rules: every message has content, except an assistant's that carries tool_calls (or the older
    function_call); a list of content parts is never empty, and holds text parts only (server/messages.py)."""
    for i, m in enumerate(messages):
        param = f"messages.{i}.content"
        if isinstance(m.content, list):
            check_content_parts(i, m.content)
        if m.content is None:
            extra = m.model_extra or {}
            if m.role != "assistant":
                raise APIError(400, f"messages.{i} (role {m.role!r}) has no content", param=param)
            if not (extra.get("tool_calls") or extra.get("function_call")):
                raise APIError(400, f"messages.{i} (role 'assistant') has no content: it may be left out only "
                               "with tool_calls", param=param)


async def chat_completions(serving: Serving, request: HTTPRequest):
    body: ChatCompletionRequest = parse_body(ChatCompletionRequest, await request.body())  # type: ignore[assignment]
    call = await start_chat(serving, body)
    if body.stream:
        return await serving.stream(call.sub, request, _sse_events(call.chunks()))
    finals = await serving.wait(call.sub, request)
    listed = await serving.off_loop(call.choices, finals) if call.table is not None else call.choices(finals)
    return {"id": call.cid, "object": "chat.completion", "created": call.created, "model": body.model,
            "choices": listed, "usage": _usage(len(call.ids), sum(len(u.result["output_ids"]) for u in finals))}


async def _sse_events(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    """Chat chunks as server-sent events, then ``data: [DONE]``."""
    async for c in chunks:
        yield sse(c)
    yield sse("[DONE]")


@dataclasses.dataclass
class ChatCall:
    """One /v1/chat/completions request validated, rendered and submitted (start_chat): what its answer is read
    with. ``chunks()``: the stream's chunk objects (without ``[DONE]``); ``choices(finals)``: the answer's choices
    from the submission's final updates. The Anthropic Messages endpoint (server/anthropic_api.py) and the Responses
    endpoint (server/responses_api.py) read a chat request's answer through it too."""

    body: ChatCompletionRequest
    sub: Submission
    ids: list[int]  # the prompt's token ids
    plan: ToolPlan | None
    thinking: ReasoningFormat | None  # the reasoning format the output splits by (None: no split)
    table: TokenTable | None  # set: with logprobs
    cid: str
    created: int
    skip_special: bool
    # Each choice's final update as chunks() reads it (its output ids: the Responses API counts reasoning tokens)
    finished: dict[int, Update] = dataclasses.field(default_factory=dict)

    def chunks(self) -> AsyncIterator[dict]:
        body = self.body
        return _chat_chunks(self.sub, self.table, self.cid, self.created, body.model, len(self.ids),
                            body.stream_options, self.plan, self.thinking, body.stream_reasoning, self.skip_special,
                            self.finished)

    async def pieces(self) -> AsyncIterator[tuple]:
        """The stream of the request's one choice read for another API's events (the Anthropic and Responses
        endpoints): ("start",) with the first chunk (at the end where none came), then in output order
        ("reasoning", text), ("content", text), ("tool_call", call) (the chat sends a call whole), and last ("end",
        finish_reason, matched_stop, output_tokens) (the usage chunk's count: the body asks for include_usage)."""
        started, reason, matched, output_tokens = False, None, None, 0
        async for c in self.chunks():
            if not started:
                started = True
                yield ("start",)
            if not c["choices"]:  # (the last chunk: usage)
                output_tokens = c["usage"]["completion_tokens"]
                continue
            ch = c["choices"][0]
            d = ch["delta"]
            if d.get("reasoning_content"):
                yield ("reasoning", d["reasoning_content"])
            if d.get("content"):
                yield ("content", d["content"])
            for tc in d.get("tool_calls") or []:
                yield ("tool_call", tc)
            if ch["finish_reason"] is not None:
                reason, matched = ch["finish_reason"], ch.get("matched_stop")
        if not started:
            yield ("start",)
        yield ("end", reason, matched, output_tokens)

    def choices(self, finals: list[Update]) -> list[dict]:
        out = []
        for u in finals:
            reason, matched = finish_reason(u.result)
            lp = None
            if self.table is not None:  # every output token, as usage.completion_tokens counts them
                meta = u.result["meta_info"]
                lp = chat_logprobs(self.table, tokens_of(meta["output_token_logprobs"],
                                                         meta.get("output_top_logprobs")))
            text, reasoning = u.text, None
            if self.thinking is not None:
                reasoning, text = ReasoningSplitter(self.thinking).split(text)
            message = {"role": "assistant", "content": text}
            if self.plan is not None:
                message, reason = self.plan.message(text, reason)
                matched = None if reason == "tool_calls" else matched
            if self.thinking is not None:
                message["reasoning_content"] = reasoning
            out.append({"index": u.index, "message": message, "logprobs": lp, "finish_reason": reason,
                        "matched_stop": matched})
        return out


def renamed_error(e: APIError, origins: list[str], params: tuple[tuple[str, str], ...], tool_field: re.Pattern,
                  tool_repl, *, keep_rest: bool) -> APIError:
    """An error of the chat path (start_chat) with the names of the request it was read from (Anthropic's Messages,
    OpenAI's Responses): chat message i came from ``origins[i]`` (with ``keep_rest`` the rest of its path after the
    index is the request's too: Responses items map one to one, Anthropic's blocks do not); ``params``: (the chat's
    field, the request's), the first matching prefix of the param and, apart, of the message taken; ``tool_field``
    and ``tool_repl``: re.sub's pattern and replacement for the tools' fields."""
    param, msg = e.param, e.message
    if param is not None:
        m = re.match(r"messages\.(\d+)", param)
        if m and int(m.group(1)) < len(origins):
            # (the chat's messages are not the request's: a system message first, and messages merged or split)
            origin = origins[int(m.group(1))]
            param = origin + (param[len(m.group(0)):] if keep_rest else "")
            msg = msg.replace(m.group(0), origin, 1)
        for chat, theirs in params:
            if param == chat or param.startswith(chat + "."):
                param = theirs + param[len(chat):]
                break
        for chat, theirs in params:
            if msg.startswith(chat):
                msg = theirs + msg[len(chat):]
                break
        param, msg = tool_field.sub(tool_repl, param), tool_field.sub(tool_repl, msg)
    return APIError(e.status, msg, param=param, code=e.code, type=e.type)


async def start_chat(serving: Serving, body: ChatCompletionRequest) -> ChatCall:
    """Validates a chat request (400s naming its fields), renders and tokenizes its prompt, and submits it."""
    serving.check_model(body.model)
    _reject_unsupported(body)
    _reject_legacy_functions(body)
    n = _choices_per_prompt(body)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, f"top_logprobs={body.top_logprobs} needs logprobs=true", param="top_logprobs")
    _check_top("top_logprobs", body.top_logprobs, serving.model.top_logprobs_cap, 20)
    logprobs = bool(body.logprobs)
    _check_max_tokens("max_tokens", body.max_tokens)
    _check_max_tokens("max_completion_tokens", body.max_completion_tokens)
    _check_messages(body.messages)
    serving.check_batch_size(1, "messages", n)
    names = _field_names(body, top_logprobs_num="top_logprobs")
    max_new = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if body.max_completion_tokens is not None:
        names["max_new_tokens"] = "max_completion_tokens"
    sp = _sampling_params(body, max_new)
    if serving.config.sampling_defaults == "model":
        # SGLang's order for a chat request: the client's value (null: none), else generation_config.json's, else
        # OpenAI's (the engine's defaults)
        for name, value in serving.model.sampling_defaults:
            sp.setdefault(name, value)
    # The response's id is the engine request's (its choices' <id>_<j>): what /abort_request takes, as SGLang's.
    rid = request_ids(body.rid, 1, False)[0] or f"chatcmpl-{uuid.uuid4().hex}"
    messages = [message_dict(i, m) for i, m in enumerate(body.messages)]
    plan = ToolPlan.of(body, serving.config.tool_call_parser, messages)
    prompt = chat_prompt(body, messages, plan)
    if plan is not None:
        _use_tools(plan, body, sp, names, serving)
    thinking = _reasoning_format(body, serving, sp)
    if prompt.continued is not None and thinking is not None:
        raise APIError(400, "continue_final_message with the server's --reasoning-parser separating the reasoning "
                       "is not supported (whether the continued text is reasoning or answer is not known); set "
                       "separate_reasoning: false", param="continue_final_message")

    def build() -> tuple[list[int], list, bool]:
        ids = prompt.encode(serving, body.add_generation_prompt)
        end = _opened_thinking_end(serving, ids) if plan is not None and plan.markup is not None else None
        if end is not None:  # (the markup's grammar leaves the opened thinking room)
            sp["structural_tag"] = plan.use_markup(plan.markup, thinking_end=end)
        # No limit asked: whatever the context (and KV cache, less the draft lookahead) leaves.
        return ids, [serving.make_request(input_ids=ids, sampling_params=seeded(sp, j), prompt_param="messages",
                                          names=names, default_max_new_tokens=serving.model.context_length,
                                          return_logprob=logprobs, top_logprobs_num=body.top_logprobs,
                                          rid=rid if n == 1 else f"{rid}_{j}")
                     for j in range(n)], end is not None

    ids, reqs, thinking_room = await serving.off_loop(build)
    if thinking is not None and (not any(k in sp for k in GRAMMAR_KINDS) or _grammar_waits_for_thinking(serving)
                                 or thinking_room):
        # A template that opens the reasoning in the generation prompt (Kimi-K2.5's): the output starts inside it.
        # (A grammar on an engine whose grammars do not wait for the thinking holds the output from its first token,
        # unless it leaves the thinking room itself, as the markup's does.)
        thinking = opened_by_prompt(thinking, serving.tokenizer.decode(ids[-8:], skip_special_tokens=False))
    sub = serving.submit(reqs, stream=bool(body.stream))
    return ChatCall(body, sub, ids, plan, thinking, serving.token_table if logprobs else None, rid, int(time.time()),
                    sp.get("skip_special_tokens", True))


@dataclasses.dataclass(frozen=True)
class ChatPrompt:
    """What the chat template renders for a request: ``messages`` (continue_final_message's last one taken off),
    ``tools`` (those the template is shown), ``template_kwargs`` (chat_template_kwargs) and ``continued`` (the text
    of the assistant message a continue_final_message request continues, encoded after the rendered messages)."""

    messages: list[dict]
    tools: list[dict] | None
    template_kwargs: dict | None
    continued: str | None

    def encode(self, serving: Serving, add_generation_prompt: bool, add_special_tokens: bool = False) -> list[int]:
        """The prompt's token ids (blocking: through Serving.off_loop)."""
        return serving.encode_chat(self.messages, add_generation_prompt, self.tools, self.template_kwargs,
                                   continued=self.continued, add_special_tokens=add_special_tokens)


# OpenAI's reasoning_effort tiers and SGLang 0.5.23's additions (minimal, xhigh, ultra, max)
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
_TRUE_WORDS = frozenset({"1", "true", "yes", "y", "on"})  # SGLang's reading of reasoning.enabled given as a string


def _effort(value, param: str) -> str | float | None:
    """A reasoning effort as SGLang reads it: a tier, or a number in [0, 0.99] (a numeric string too); 400 else."""
    if value is None or (isinstance(value, str) and value in REASONING_EFFORTS):
        return value
    number = value
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not 0 <= number <= 0.99:
        raise APIError(400, f"{param}={short_repr(value)} must be one of {', '.join(REASONING_EFFORTS)} or a number "
                       "in [0, 0.99]", param=param)
    return float(number)


def template_kwargs(body) -> dict | None:
    """The chat template's extra variables: ``chat_template_kwargs`` with SGLang 0.5.23's reading of
    ``reasoning_effort`` and ``reasoning`` under them (the client's own kwargs win): the effort as the template's
    ``reasoning_effort``, and ``thinking`` / ``enable_thinking`` (DeepSeek's and Kimi's switch / Qwen3's) false for
    effort "none", true for any other effort or reasoning.enabled. Kimi-K2.5's template then opens the thinking, or
    not, as the client asked (it was dropped unread)."""
    effort = _effort(body.reasoning_effort, "reasoning_effort")
    thinking = None
    r = body.reasoning
    if r is not None:
        if not isinstance(r, dict):
            raise APIError(400, f"reasoning={short_repr(r)} must be an object ({{\"effort\": ..., \"enabled\": "
                           "...}})", param="reasoning")
        given, key = (r.get("effort"), "effort") if r.get("effort") is not None else (r.get("reasoning_effort"),
                                                                                       "reasoning_effort")
        if given is not None:
            effort = _effort(given, f"reasoning.{key}")
        enabled = r.get("enabled") if r.get("enabled") is not None else r.get("enable", False)
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in _TRUE_WORDS
        if enabled:
            thinking = True
    if effort is not None:
        thinking = effort != "none"
    if thinking is None:
        return body.chat_template_kwargs
    extra = dict(body.chat_template_kwargs or {})
    extra.setdefault("thinking", thinking)
    extra.setdefault("enable_thinking", thinking)
    if effort is not None:
        extra.setdefault("reasoning_effort", effort)
    return extra


def chat_prompt(body, messages: list[dict], plan: ToolPlan | None) -> ChatPrompt:
    """The chat template's inputs for ``body`` (a ChatCompletionRequest, or a TokenizeRequest with messages, which
    renders as chat does): 400 for chat_template_kwargs naming the variables the server sets."""
    extra = template_kwargs(body)
    taken = sorted(set(extra or {}) & set(Tokenizer.TEMPLATE_VARIABLES))
    if taken:
        raise APIError(400, f"chat_template_kwargs may not set {', '.join(taken)} (the server sets them; use the "
                       "request's own fields)", param="chat_template_kwargs")
    if "chat_template" in (extra or {}):
        # Hugging Face's apply_chat_template (SGLang's renderer) takes it as the template itself; SGLang refuses it
        # unless started with --trust-request-chat-template, which this server does not have. (It was a variable no
        # template reads: the request rendered with the server's template, without a word.)
        raise APIError(400, "chat_template_kwargs.chat_template: a request may not bring its own chat template; "
                       "the server renders with its --chat-template (or the model's)",
                       param="chat_template_kwargs.chat_template")
    continued = None
    if body.continue_final_message and messages[-1]["role"] == "assistant":
        # SGLang's continue_final_message: the prompt is the conversation before the last message (with the
        # generation prompt), then that message's text; the reply is what follows it. (Without an assistant
        # message last there is nothing to continue, and the flag changes nothing, as in SGLang.)
        continued = text_of(messages[-1]["content"])  # (text parts: joined, as SGLang's string form)
        messages = messages[:-1]
    return ChatPrompt(messages, plan.tools if plan is not None else None, extra, continued)


def tokenize_chat_prompt(serving: Serving, body) -> ChatPrompt:
    """/v1/tokenize's messages as /v1/chat/completions renders them (its checks of the messages, tools and
    chat_template_kwargs, its 400s), so that the count is the chat's ``usage.prompt_tokens``."""
    _check_messages(body.messages)
    messages = [message_dict(i, m) for i, m in enumerate(body.messages)]
    # NOTE: the tool-call parser reads a model's output; a prompt's tokens need none. Without --tool-call-parser chat
    # refuses tool_choice "auto" (no calls could be read back), but the template shows the tools as "auto" shows
    # them either way, and that is what is counted here (as SGLang's tokenize renders them).
    parser = serving.config.tool_call_parser or TOOL_CALL_PARSERS[0]
    return chat_prompt(body, messages, ToolPlan.of(body, parser, messages))


def _grammar_waits_for_thinking(serving: Serving) -> bool:
    """Whether the engine's grammars leave the thinking free (EngineArgs.reasoning_parser is the server's: its
    matcher starts inside the thinking where the prompt opened it, runtime/grammar.py), rather than hold the output
    to the grammar from its first token."""
    parser = serving.config.reasoning_parser
    return parser is not None and getattr(getattr(serving.engine, "args", None), "reasoning_parser", None) == parser


def _reasoning_format(body, serving: Serving, sp: dict) -> ReasoningFormat | None:
    """The server's reasoning format where the request separates its reasoning (server/reasoning.py); a tokenizer
    that holds its markers as special tokens then decodes the request with them."""
    parser = serving.config.reasoning_parser
    if parser is None or not body.separate_reasoning:
        return None
    fmt = REASONING_FORMATS[parser]
    grammar = any(k in sp for k in GRAMMAR_KINDS)
    thinking_grammar = _grammar_waits_for_thinking(serving)
    if fmt.forced_by is not None and (template_kwargs(body) or {}).get(fmt.forced_by) \
            and (not grammar or thinking_grammar):
        # (the template opened the reasoning; a grammar on an engine whose grammars do not wait for the thinking
        # holds the output to it from its first token: all content)
        fmt = dataclasses.replace(fmt, forced=True)
    if fmt.forced and grammar and not thinking_grammar:
        # A grammar (response_format, a forced tool call) shapes the output from its first token, unless the
        # engine's grammars wait for the thinking (EngineArgs.reasoning_parser): no reasoning the template opened,
        # where a forced format would take the whole answer for reasoning.
        return None
    tok = serving.tokenizer
    if tok is not None and any(ids and set(ids) <= tok.special_ids for m in fmt.markers()
                               for ids in (tok.encode(m),)):
        sp["skip_special_tokens"] = False
    return fmt


def _opened_thinking_end(serving: Serving, ids: list[int]) -> int | None:
    """The thinking's end marker id where the prompt ``ids`` end with its start marker (the chat template opened the
    thinking: Kimi-K2.5's does unless ``thinking`` is false) and the engine's grammars do not wait for the thinking
    (_grammar_waits_for_thinking), else None: a grammar from the output's first token must then leave the thinking
    room (ToolPlan.use_markup's ``thinking_end``), since no grammar allows a special token in free text. The
    markers are the server's reasoning format's, else Kimi-K2's (the tool-call markup's family); each one special
    token."""
    tok = serving.tokenizer
    if tok is None or not ids or _grammar_waits_for_thinking(serving):
        return None
    fmt = REASONING_FORMATS[serving.config.reasoning_parser or "kimi_k2"]
    start, end = tok.encode(fmt.start), tok.encode(fmt.end)
    if len(start) == len(end) == 1 and {start[0], end[0]} <= tok.special_ids and ids[-1] == start[0]:
        return end[0]
    return None


def _use_tools(plan: ToolPlan, body, sp: dict, names: dict, serving: Serving) -> None:
    """The sampling a request with tools needs (server/tools.py): a forced call's grammar (in the parser's markup
    where the tokenizer holds it, ToolPlan.use_markup; else a JSON array, ToolPlan.grammar); under auto the special
    tokens a parser reads calls by, and with a strict tool the markup's grammar."""
    if body.logprobs:
        raise APIError(400, "logprobs with tools are not supported (the calls are read out of the text the tokens "
                       "make)", param="logprobs")
    given = next((k for k in GRAMMAR_KINDS if k in sp), None)
    if given is not None:
        why = ("constrains the output to tool calls" if plan.mode == "forced" else
               "reads calls written in special tokens, which no grammar allows")
        raise APIError(400, f"tool_choice={short_repr(body.tool_choice or 'auto')} {why}; it cannot be combined "
                       f"with {names.get(given, given)}", param="tool_choice")
    markup = plan.markup_ids(serving.tokenizer)  # (forced mode, or auto with strict tools: else None)
    if markup is not None:
        # In the model's own call markup (Kimi-K2's special tokens), as SGLang constrains it: forced calls rather
        # than a JSON array the model was never trained to write, strict tools' arguments under auto; decoded with
        # its special tokens, as auto's calls are. (A thinking the prompt opens: _opened_thinking_end, once the
        # prompt is encoded.)
        sp["structural_tag"] = plan.use_markup(markup)
        names["structural_tag"] = "tools"  # (a parameters schema that does not compile)
        sp["skip_special_tokens"] = False
    elif plan.mode == "forced":
        sp["ebnf"] = plan.grammar()
        names["ebnf"] = "tools"  # (a parameters schema that does not compile)
    else:
        sp["skip_special_tokens"] = False  # the call markup is special tokens
    template = serving.tokenizer.chat_template if serving.tokenizer is not None else ""
    if "tools" not in template and not serving.warned_tools_template:
        serving.warned_tools_template = True
        logger.warning("the chat template never reads 'tools': requests with tools render without them, and the "
                       "model cannot know them (pass --chat-template with one that does)")


def _by_part(tokens: list[Token], span: Parts | None) -> tuple[list[Token], list[Token], list[Token]]:
    """``tokens`` (in output order, offsets set) as (content before the reasoning, the reasoning's, content after
    it), by where each token's text starts in the output: a token whose text straddles a boundary belongs to the
    part it starts in (one holding the end marker's last characters and the content's first goes with the
    reasoning), as SGLang attaches a step's logprobs to the first chunk it sends for that step, the reasoning's.
    ``span`` None (no reasoning parser): all content."""
    if span is None or span.start is None:
        return tokens, [], []
    end = span.end if span.end is not None else float("inf")
    return ([t for t in tokens if t.offset < span.start], [t for t in tokens if span.start <= t.offset < end],
            [t for t in tokens if t.offset >= end])


async def _chat_chunks(sub: Submission, table: TokenTable | None, cid: str, created: int, model: str,
                       prompt_tokens: int, opts, plan: ToolPlan | None = None, thinking: ReasoningFormat | None = None,
                       stream_reasoning: bool = True, skip_special: bool = True,
                       finished: dict[int, Update] | None = None) -> AsyncIterator[dict]:
    """Chunk objects (the events' payloads, without ``[DONE]``: _sse_events) of every choice, interleaved as their
    tokens come; ``table`` set: with logprobs; ``plan``: tools
    (content, then each call once complete: server/tools.py's ToolStream); ``thinking``: the reasoning apart
    (reasoning_content deltas: server/reasoning.py's ReasoningStream), the rest as content, and with logprobs each
    token with its part's chunk (_by_part), in output order; ``finished``: each choice's final update is put there."""
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    m = len(sub.requests)
    generated = [0] * m
    sent = [""] * m
    opened = [False] * m
    # (a token is placed in the text as the text decodes it: special tokens too where the request keeps them)
    pending = [ChoiceTokens(table, skip_special=skip_special) for _ in range(m)] if table is not None else []
    tool_streams = [plan.streamer() for _ in range(m)] if plan is not None else []
    reasoning = [ReasoningStream(thinking, stream_reasoning) for _ in range(m)] if thinking is not None else []
    held: list[list[Token]] = [[] for _ in range(m)]  # the reasoning's tokens waiting for a reasoning delta

    def chunk(k: int, delta: dict, reason=None, matched=None, tokens: list | None = None) -> dict:
        lp = chat_logprobs(table, tokens) if tokens is not None else None
        choice = {"index": k, "delta": delta, "logprobs": lp, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        if include_usage:
            c["usage"] = _usage(prompt_tokens, sum(generated)) if continuous else None
        return c

    async for u in sub.updates():
        if u.error is not None:
            raise u.failure()
        k = u.index
        generated[k] += len(u.new_ids)
        if u.finished and finished is not None:
            finished[k] = u
        if not opened[k]:  # OpenAI opens each choice with the role
            yield chunk(k, {"role": "assistant", "content": ""})
            opened[k] = True
        text, thought = u.text, ""
        if reasoning:
            thought, text = reasoning[k].feed(u.text, u.finished)
        if tool_streams:  # (no logprobs with tools)
            if thought:
                yield chunk(k, {"reasoning_content": thought})
            for d in tool_streams[k].feed(text, u.finished):
                yield chunk(k, d)
            if u.finished:
                reason, matched = finish_reason(u.result)
                reason = tool_streams[k].finish_reason(reason)
                yield chunk(k, {}, reason, None if reason == "tool_calls" else matched)
            continue
        delta = _delta(sent[k], text)
        shown = len(sent[k])  # (the content sent before this update)
        if text.startswith(sent[k]):
            sent[k] = text
        # The content is the text before the reasoning and the text after it: this update's content delta may
        # hold both (a whole reasoning block arrived at once), the part before going out ahead of the reasoning.
        span = reasoning[k].last if reasoning else None
        start = span.start if span is not None else None
        cut = max(0, start - shown) if start is not None else len(delta)
        before, after = delta[:cut], delta[cut:]
        ahead = behind = None
        if table is not None:  # each token with the chunk that completes its text (the finish flushes the rest)
            pending[k].add(tokens_of(u.new_logprobs, u.new_top_logprobs))
            # (with the reasoning apart: by the output text the split has placed, reasoning or content)
            placed = reasoning[k].decided(u.text, u.finished) if reasoning else len(sent[k])
            ahead, thought_tokens, behind = _by_part(pending[k].release(placed, u.finished), span)
            held[k] += thought_tokens
        if before or ahead:
            yield chunk(k, {"content": before}, tokens=ahead)
        # The reasoning's tokens go with its next delta (stream_reasoning off: the one delta); where it has ended and
        # shows no more text in this update (the end marker alone in it, an empty reasoning), in an empty one.
        if thought or (held[k] and (span.ended or u.finished)):
            yield chunk(k, {"reasoning_content": thought}, tokens=held[k] if table is not None else None)
            held[k] = []
        if after or behind:
            yield chunk(k, {"content": after}, tokens=behind)
        if u.finished:
            reason, matched = finish_reason(u.result)
            yield chunk(k, {}, reason, matched)
    if include_usage:
        yield {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
               "usage": _usage(prompt_tokens, sum(generated))}
