"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (non-streaming and SSE streaming).

Response shapes follow OpenAI's (``text_completion`` / ``chat.completion`` objects, ``*.chunk`` events, a
``usage`` block; with ``stream_options.include_usage`` a last chunk with empty ``choices`` carries it), plus
SGLang's ``matched_stop`` on each choice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request as HTTPRequest

from sglang_eagle3.server.driver import Submission
from sglang_eagle3.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    parse_body,
)
from sglang_eagle3.server.serving import Serving, finish_reason, sse

# Engine sampling names -> the OpenAI field a client sets.
_OPENAI_NAMES = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                 "top_k": "top_k", "min_p": "min_p", "stop": "stop", "stop_token_ids": "stop_token_ids",
                 "seed": "seed"}
_COMPLETION_MAX_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions
# Sampling fields this server does not implement, with the value that leaves sampling unchanged (accepted).
_NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "min_tokens": 0}


def _reject_unsupported(body) -> None:
    """400 for OpenAI fields this server knows but cannot honour (never silently ignored)."""
    if body.n not in (None, 1):
        raise APIError(400, f"n={body.n} is not supported: only n=1 (send separate requests)", param="n")
    for name, neutral in _NEUTRAL.items():
        v = getattr(body, name)
        if v is not None and v != neutral:
            raise APIError(400, f"{name}={v} is not supported (only {neutral})", param=name)
    if body.logit_bias:
        raise APIError(400, "logit_bias is not supported", param="logit_bias")
    if body.stream_options is not None and not body.stream:
        raise APIError(400, "stream_options is only allowed with stream=true", param="stream_options")


def _sampling_params(body, max_new_tokens: int | None) -> dict:
    """Engine sampling params; max_new_tokens None (the client set none) is left out: the endpoint passes its
    default to Serving.make_request, which cuts it to what the prompt leaves."""
    sp: dict = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    for name in ("temperature", "top_p", "top_k", "min_p", "seed", "stop_token_ids", "ignore_eos"):
        v = getattr(body, name)
        if v is not None:
            sp[name] = v
    if body.stop is not None:
        sp["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    return sp


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
    _reject_unsupported(body)
    if body.best_of not in (None, 1):
        raise APIError(400, f"best_of={body.best_of} is not supported (only 1)", param="best_of")
    if body.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if body.logprobs is not None:
        raise APIError(400, "logprobs is not supported on /v1/completions yet: use /generate with "
                       "return_logprob=true", param="logprobs")
    _check_max_tokens("max_tokens", body.max_tokens)
    prompt = body.prompt
    if isinstance(prompt, list) and not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    # str | list[int] -> one prompt; list[str] | list[list[int]] -> a batch (one choice each).
    batch = not (isinstance(prompt, str) or isinstance(prompt[0], int))
    prompts = list(prompt) if batch else [prompt]
    serving.check_batch_size(len(prompts), "prompt")
    sp = _sampling_params(body, body.max_tokens)

    def build() -> list:
        return [serving.make_request(prompt=p if isinstance(p, str) else None,
                                     input_ids=None if isinstance(p, str) else p, sampling_params=sp,
                                     prompt_param="prompt", names=_OPENAI_NAMES,
                                     default_max_new_tokens=_COMPLETION_MAX_TOKENS, index=i if batch else None)
                for i, p in enumerate(prompts)]

    reqs = await serving.off_loop(build)
    echo = [""] * len(reqs)
    if body.echo:
        echo = [p if isinstance(p, str) else _decode(serving, r.input_ids) for p, r in zip(prompts, reqs, strict=True)]
    sub = serving.submit(reqs)
    cid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
    prompt_tokens = sum(len(r.input_ids) for r in reqs)
    if body.stream:
        opts = body.stream_options
        return await serving.stream(sub, request, _completion_chunks(sub, cid, created, body.model, echo, prompt_tokens,
                                                                     opts))
    finals = await serving.wait(sub, request)
    choices = []
    for i, u in enumerate(finals):
        reason, matched = finish_reason(u.result)
        choices.append({"index": i, "text": echo[i] + u.text, "logprobs": None, "finish_reason": reason,
                        "matched_stop": matched})
    completion_tokens = sum(len(u.result["output_ids"]) for u in finals)
    return {"id": cid, "object": "text_completion", "created": created, "model": body.model, "choices": choices,
            "usage": _usage(prompt_tokens, completion_tokens)}


def _decode(serving: Serving, ids: list[int]) -> str:
    return serving.tokenizer.decode(ids) if serving.tokenizer is not None else ""


async def _completion_chunks(sub: Submission, cid: str, created: int, model: str, echo: list[str],
                             prompt_tokens: int, opts) -> AsyncIterator[bytes]:
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    sent = [""] * len(sub.requests)
    generated = [0] * len(sub.requests)

    def chunk(i: int, text: str, reason=None, matched=None) -> bytes:
        c = {"id": cid, "object": "text_completion", "created": created, "model": model,
             "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}]}
        if reason is not None:
            c["choices"][0]["matched_stop"] = matched
        if include_usage:
            c["usage"] = _usage(prompt_tokens, sum(generated)) if continuous else None
        return sse(c)

    opened = [False] * len(sub.requests)
    for i, prefix in enumerate(echo):
        if prefix:
            yield chunk(i, prefix)
            opened[i] = True
    async for u in sub.updates():
        if u.error is not None:
            raise u.failure()
        i = u.index
        generated[i] += len(u.new_ids)
        delta = _delta(sent[u.index], u.text)
        sent[i] = u.text if u.text.startswith(sent[i]) else sent[i]
        # The first token always gets a chunk (its text may still be held back), so the stream opens then.
        if delta or not opened[i]:
            yield chunk(i, delta)
            opened[i] = True
        if u.finished:
            reason, matched = finish_reason(u.result)
            yield chunk(i, "", reason, matched)
    if include_usage:
        yield sse({"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [],
                   "usage": _usage(prompt_tokens, sum(generated))})
    yield sse("[DONE]")


# -- /v1/chat/completions ------------------------------------------------------------------------------------

def _check_messages(messages) -> None:
    """OpenAI's rules: every message has content, except an assistant's that carries tool_calls (or the older
    function_call); a list of content parts is never empty."""
    for i, m in enumerate(messages):
        param = f"messages.{i}.content"
        if isinstance(m.content, list) and not m.content:
            raise APIError(400, f"{param} is an empty list: give a string or at least one text part", param=param)
        if m.content is None:
            extra = m.model_extra or {}
            if m.role != "assistant":
                raise APIError(400, f"messages.{i} (role {m.role!r}) has no content", param=param)
            if not (extra.get("tool_calls") or extra.get("function_call")):
                raise APIError(400, f"messages.{i} (role 'assistant') has no content: it may be left out only "
                               "with tool_calls", param=param)


def _message_dict(m) -> dict:
    d = m.model_dump(exclude_none=True)
    content = m.content
    if isinstance(content, list):  # text parts, joined as OpenAI-compatible servers do
        content = "\n".join(part.text for part in content)
    d["content"] = content if content is not None else ""
    return d


async def chat_completions(serving: Serving, request: HTTPRequest):
    body: ChatCompletionRequest = parse_body(ChatCompletionRequest, await request.body())  # type: ignore[assignment]
    serving.check_model(body.model)
    _reject_unsupported(body)
    if body.logprobs or body.top_logprobs:
        raise APIError(400, "logprobs is not supported on /v1/chat/completions yet: use /generate with "
                       "return_logprob=true", param="logprobs")
    if body.tools:
        raise APIError(400, "tools (function calling) are not supported", param="tools")
    if body.tool_choice not in (None, "none", "auto"):
        raise APIError(400, f"tool_choice={body.tool_choice!r} is not supported", param="tool_choice")
    if body.response_format and body.response_format.get("type") not in (None, "text"):
        raise APIError(400, f"response_format={body.response_format!r} is not supported (only text)",
                       param="response_format")
    _check_max_tokens("max_tokens", body.max_tokens)
    _check_max_tokens("max_completion_tokens", body.max_completion_tokens)
    _check_messages(body.messages)
    names = dict(_OPENAI_NAMES)
    max_new = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if body.max_completion_tokens is not None:
        names["max_new_tokens"] = "max_completion_tokens"
    sp = _sampling_params(body, max_new)
    messages = [_message_dict(m) for m in body.messages]

    def build() -> tuple[list[int], object]:
        ids = serving.encode_chat(messages, body.add_generation_prompt)
        # No limit asked: whatever the context (and KV cache, less the draft lookahead) leaves.
        return ids, serving.make_request(input_ids=ids, sampling_params=sp, prompt_param="messages", names=names,
                                         default_max_new_tokens=serving.model.context_length)

    ids, req = await serving.off_loop(build)
    sub = serving.submit([req])
    cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if body.stream:
        return await serving.stream(sub, request, _chat_chunks(sub, cid, created, body.model, len(ids),
                                                                body.stream_options))
    (u,) = await serving.wait(sub, request)
    reason, matched = finish_reason(u.result)
    return {"id": cid, "object": "chat.completion", "created": created, "model": body.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": u.text}, "logprobs": None,
                         "finish_reason": reason, "matched_stop": matched}],
            "usage": _usage(len(ids), len(u.result["output_ids"]))}


async def _chat_chunks(sub: Submission, cid: str, created: int, model: str, prompt_tokens: int,
                       opts) -> AsyncIterator[bytes]:
    include_usage = bool(opts and opts.include_usage)
    continuous = bool(opts and opts.continuous_usage_stats)
    generated = 0

    def chunk(delta: dict, reason=None, matched=None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}
        if include_usage:
            c["usage"] = _usage(prompt_tokens, generated) if continuous else None
        return sse(c)

    sent = ""
    first = True
    async for u in sub.updates():
        if u.error is not None:
            raise u.failure()
        generated += len(u.new_ids)
        if first:  # OpenAI opens with the role
            yield chunk({"role": "assistant", "content": ""})
            first = False
        delta = _delta(sent, u.text)
        if u.text.startswith(sent):
            sent = u.text
        if delta:
            yield chunk({"content": delta})
        if u.finished:
            reason, matched = finish_reason(u.result)
            yield chunk({}, reason, matched)
    if include_usage:
        yield sse({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                   "usage": _usage(prompt_tokens, generated)})
    yield sse("[DONE]")
