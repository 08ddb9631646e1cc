"""What every generation endpoint shares: validation into engine ``Request``s with errors that name the
client's field, submission to the driver, waiting with cancellation on disconnect, and server-sent events.

Validation tokenizes, which takes seconds for a prompt of megabytes: endpoints run it through ``off_loop`` (a
worker thread) so that /health and every stream keep being served meanwhile (as far as the tokenizer lets go of
the GIL: docs/SERVER.md). ``Engine.make_request`` only reads the engine's configuration and tokenizer, never the
scheduler, so it is safe beside the engine thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from sglang_eagle3.engine import RequestError
from sglang_eagle3.runtime.grammar import GrammarError
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import (
    GRAMMAR_KINDS,
    SamplingParams,
    SamplingParamsError,
    parallel_samples,
    short_repr,
)
from sglang_eagle3.server.config import ServerConfig
from sglang_eagle3.server.driver import (
    BatchTooLargeError,
    DriverStoppedError,
    DuplicateRequestIdError,
    EngineDriver,
    EngineFailure,
    QueueFullError,
    ShuttingDownError,
    Submission,
    Update,
)
from sglang_eagle3.server.logprobs import TokenTable
from sglang_eagle3.server.protocol import APIError
from sglang_eagle3.tokenizer import ChatTemplateError

logger = logging.getLogger(__name__)

# perf_counter when the HTTP request being served reached its handler (app._guarded sets it): where SGLang's request
# latency metrics (time to first token, end to end) start, validation and tokenization included.
REQUEST_RECEIVED_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("request_received_at",
                                                                                   default=None)
# RequestError messages that start with "<one of these>=" name that field; all others are about the prompt.
_REQUEST_FIELDS = ("max_new_tokens", "logprob_start_len", "top_logprobs_num", "return_logprob", "rid")
# RequestError messages about the prompt that mean "too long for this server" (OpenAI's code for it).
_TOO_LONG = ("longer than the context", "does not fit the KV cache")


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side needs to know about the served model (read once, before the engine thread starts)."""

    served_model_name: str
    model_path: str
    context_length: int
    vocab_size: int
    speculative_num_steps: int | None
    tokenizer_path: str | None = None
    max_top_logprobs_num: int = 20  # the engine's cap on top logprobs a position (--max-top-logprobs-num)
    # generation_config.json's sampling fields, (name, value): a chat request's defaults (--sampling-defaults model)
    sampling_defaults: tuple[tuple[str, float | int], ...] = ()
    model_type: str | None = None  # config.json's (SGLang's /get_model_info reports both)
    architectures: tuple[str, ...] = ()

    @property
    def top_logprobs_cap(self) -> int:
        """The most top logprobs a request may ask for: the engine's cap, or the vocabulary where it is smaller."""
        return min(self.max_top_logprobs_num, self.vocab_size)


class ClientDisconnected(Exception):
    pass


def sse(payload: dict | str, event: str | None = None) -> bytes:
    """One server-sent event: ``data: {...}\\n\\n`` (or ``data: [DONE]``), after an ``event: <event>`` line where
    named (Anthropic's and the Responses API's streams name theirs)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return (b"" if event is None else b"event: " + event.encode() + b"\n") + b"data: " + data.encode() + b"\n\n"


class _EventStream(StreamingResponse):
    """A StreamingResponse that calls ``on_close`` however it ends: finished, client gone, or cancelled."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_disconnect(request: HTTPRequest) -> None:
    # The body has been read, so the next ASGI message is the disconnect.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class Serving:
    def __init__(self, engine, driver: EngineDriver, config: ServerConfig, model: ModelInfo):
        self.engine, self.driver, self.config, self.model = engine, driver, config, model
        self.warned_tools_template = False  # (openai_api._use_tools: once a server)
        self.tokenizer = engine.tokenizer
        self.token_table = TokenTable(self.tokenizer) if self.tokenizer is not None else None
        self.metrics = driver.metrics
        self.created = int(time.time())

    @property
    def strict_thinking(self) -> bool:
        """Whether the engine holds thinking to strict rules (EngineArgs.enable_strict_thinking,
        --enable-strict-thinking): only then is a request's thinking budget enforced, so only then taken."""
        return bool(getattr(getattr(self.engine, "args", None), "enable_strict_thinking", False))

    # -- validation ------------------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name not in (self.model.served_model_name, self.model.model_path, "default"):
            raise APIError(404, f"model {short_repr(name)} does not exist: this server serves "
                           f"{self.model.served_model_name!r}", param="model", code="model_not_found",
                           type="invalid_request_error")  # (OpenAI's and SGLang's type for it)

    def check_batch_size(self, prompts: int, param: str, n: int = 1, n_param: str = "n") -> None:
        """400 for a batch that could never be admitted (before any of it is tokenized): ``prompts`` prompts of
        ``n`` requests each (OpenAI's ``n``; ``n_param``: the client's name for it)."""
        limit = self.driver.max_inflight
        total = prompts * n
        if limit is not None and total > limit:
            plural = "s" if prompts != 1 else ""
            what = f"{prompts} prompt{plural} x {n_param}={n} = {total} requests" if n > 1 else f"{prompts} prompts"
            raise APIError(400, f"a batch of {what} can never be admitted: at most {limit} requests may be "
                           "in flight (max_running_requests + max_queued_requests); split it",
                           param=n_param if n > 1 and prompts <= limit else param, code="batch_too_large")

    async def off_loop(self, fn: Callable, *args):
        """``fn(*args)`` in a worker thread: validation and tokenization must not stall the event loop."""
        return await asyncio.to_thread(fn, *args)

    def make_request(self, *, prompt: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict, prompt_param: str, names: dict[str, str] | None = None,
                     rid: str | None = None, return_logprob: bool = False, logprob_start_len: int | None = None,
                     top_logprobs_num: int | None = None, default_max_new_tokens: int | None = None,
                     index: int | None = None) -> Request:
        """Engine.make_request with its errors as 400s naming the client's field (``names`` maps engine
        sampling names to the endpoint's, e.g. max_new_tokens -> max_tokens). Blocking: call it through
        ``off_loop``.

        ``default_max_new_tokens``: when the client set no limit, at most this many new tokens, cut without an
        error to what the prompt leaves (context and KV cache, less the speculative lookahead:
        ``Engine.max_new_tokens_limit``). ``index``: the prompt's position in a batch, named in errors."""
        names = names or {}
        sp = dict(sampling_params)
        if default_max_new_tokens is not None and sp.get("max_new_tokens") is None:
            if isinstance(prompt, str) and self.tokenizer is not None:
                prompt, input_ids = None, self.tokenizer.encode(prompt)
            if isinstance(input_ids, list):
                fits = self.engine.max_new_tokens_limit(len(input_ids))
                # (a prompt that leaves nothing keeps the default: the engine then names the prompt, not the limit)
                sp["max_new_tokens"] = min(default_max_new_tokens, fits) if fits > 0 else default_max_new_tokens
                low = sp.get("min_new_tokens")
                if isinstance(low, int) and not isinstance(low, bool) and fits < low <= default_max_new_tokens:
                    sp["min_new_tokens"] = fits  # cut with the default, as the engine cuts its own (and SGLang)
        try:
            return self.engine.make_request(prompt, sp, input_ids, return_logprob, logprob_start_len,
                                            top_logprobs_num, rid)
        except SamplingParamsError as e:
            # A grammar refused as a whole (the server's grammar backend is off, it has no tokenizer) is about the
            # grammar field the client gave.
            about = next((k for k in GRAMMAR_KINDS if sp.get(k) is not None), None) \
                if isinstance(e, GrammarError) else None
            err = _sampling_error(str(e), names, about)
        except RequestError as e:
            err = _request_error(str(e), prompt_param, names)
        if index is not None:
            err = APIError(err.status, f"prompt {index} of the batch: {err.message}", code=err.code,
                           param=f"{prompt_param}.{index}" if err.param == prompt_param else err.param)
        raise err

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None = None,
                    extra: dict | None = None, continued: str | None = None,
                    add_special_tokens: bool = False) -> list[int]:
        """The chat prompt's token ids; ``continued``: text that follows the rendered messages (the assistant
        message a continue_final_message request continues), encoded on its own and its ids appended, as SGLang
        0.5.23 does (the tokenizer's encode, a leading BOS dropped): the ids where the two texts meet are SGLang's,
        not those of one text (a generation prompt ending in a space, "Assistant: ", then "The": " " + "The", not
        " The"). ``add_special_tokens``: the tokenizer's own (a BOS) on top of what the template writes
        (/v1/tokenize's field; chat never adds them)."""
        if self.tokenizer is None:
            raise APIError(400, "this server was started without a tokenizer (--skip-tokenizer-init): chat "
                           "needs one; use /generate with input_ids", param="messages")
        try:
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt, tools, extra)
            ids = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
            if continued:
                more = self.tokenizer.encode(continued, add_special_tokens=True)
                if more and more[0] == self.tokenizer.bos_token_id:
                    more = more[1:]
                ids += more
            return ids
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as e:
            # A template written for well-formed messages fails in plain Python on a client's odd values (it
            # iterates "tool_calls": 5, concatenates a "name" that is an object): the messages' fault, not ours.
            raise APIError(400, f"the chat template cannot render these messages: {type(e).__name__}: {e}",
                           param="messages") from None

    # -- submission and waiting --------------------------------------------------------------------------
    def submit(self, requests: list[Request], *, full_results: bool = False, stream: bool | None = None) -> Submission:
        """``stream``: whether the client streams the answer (the is_streaming metric label); left out, ``stream`` or
        ``wait`` says so."""
        try:
            return self.driver.submit(requests, full_results=full_results, stream=stream,
                                      received_at=REQUEST_RECEIVED_AT.get())
        except QueueFullError as e:
            self.metrics.rejected.inc(status="503")
            raise APIError(503, str(e), code="queue_full") from None
        except DriverStoppedError as e:
            code = "server_shutting_down" if isinstance(e, ShuttingDownError) else "engine_unavailable"
            raise APIError(503, str(e), code=code) from None
        except DuplicateRequestIdError as e:
            raise APIError(400, str(e), param="rid") from None
        except BatchTooLargeError as e:
            raise APIError(400, str(e), code="batch_too_large") from None

    async def _race(self, awaitable, request: HTTPRequest):
        """Awaits ``awaitable`` unless the client disconnects first (then raises ClientDisconnected)."""
        task = asyncio.ensure_future(awaitable)
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if task.done():
            return task.result()
        task.cancel()
        raise ClientDisconnected()

    async def wait(self, sub: Submission, request: HTTPRequest) -> list[Update]:
        """Final updates of a non-streaming submission; aborts it when the client goes away."""
        if sub.streaming is None:
            sub.streaming = False
        try:
            return await self._race(sub.results(), request)
        except ClientDisconnected:
            sub.close()
            raise
        except EngineFailure as e:
            sub.close()
            raise _failure_error(e) from None

    async def stream(self, sub: Submission, request: HTTPRequest, chunks: AsyncIterator[bytes],
                     failure: Callable[[APIError], list[bytes]] | None = None):
        """An SSE response over ``chunks`` (which end with ``data: [DONE]``). The first chunk is awaited
        before answering, so an engine failure at prefill is a plain HTTP 500; a failure later becomes an
        ``{"error": ...}`` event and ``[DONE]`` (so is the server shutting down under it; ``failure``: the events
        that say so instead, e.g. the Anthropic API's). However the stream ends, unfinished requests are aborted."""
        if sub.streaming is None:
            sub.streaming = True
        it = chunks.__aiter__()
        try:
            first = await self._race(it.__anext__(), request)
        except StopAsyncIteration:
            first = None
        except ClientDisconnected:
            sub.close()
            raise
        except EngineFailure as e:
            sub.close()
            raise _failure_error(e) from None
        except BaseException:
            sub.close()
            raise

        async def body() -> AsyncIterator[bytes]:
            if first is not None:
                yield first
            try:
                async for chunk in it:
                    yield chunk
            except EngineFailure as e:
                err = _failure_error(e)
                for event in (failure(err) if failure is not None else [sse(err.body()), sse("[DONE]")]):
                    yield event

        return _EventStream(body(), sub.close)


def _failure_error(e: EngineFailure) -> APIError:
    return APIError(e.status, str(e), code=e.code)


def _request_error(msg: str, prompt_param: str, names: dict[str, str]) -> APIError:
    """An engine RequestError as a 400: a message "<field>=..." names that field (renamed to the endpoint's,
    e.g. max_new_tokens -> max_tokens), any other is about the prompt."""
    field = next((f for f in _REQUEST_FIELDS if msg.startswith(f + "=")), None)
    if field is None:
        code = "context_length_exceeded" if any(s in msg for s in _TOO_LONG) else None
        return APIError(400, msg, param=prompt_param, code=code)
    name = names.get(field, field)
    code = "context_length_exceeded" if field == "max_new_tokens" else None
    return APIError(400, name + msg[len(field):], param=name, code=code)


def samples_per_prompt(n, param: str) -> int:
    """OpenAI's ``n`` / SGLang's ``sampling_params.n`` (runtime/sampling.py parallel_samples) as a 400 naming
    ``param``."""
    try:
        return parallel_samples(n, param)
    except SamplingParamsError as e:
        raise APIError(400, str(e), param=param) from None


def per_item(value, n: int, name: str, batch: bool) -> list:
    """SGLang batch semantics: a list gives one value per prompt, a scalar applies to all."""
    if batch and isinstance(value, list):
        if len(value) != n:
            raise APIError(400, f"{name} has {len(value)} entries for {n} prompts", param=name)
        return value
    if not batch and isinstance(value, list):
        raise APIError(400, f"{name} is a list but the request has a single prompt", param=name)
    return [value] * n


def request_ids(rid, n: int, batch: bool) -> list:
    """SGLang's rid rules: a list names each prompt of a batch (two alike are refused when submitted); one
    string for a batch becomes ``<rid>_<i>`` per prompt. An empty rid is a 400: SGLang gives it no meaning (it
    keeps "" as one request's id, and makes a batch's ``_0``, ``_1``, ...), and reading it as "none given" or as a
    prefix would each answer a different way."""
    if rid == "" or (isinstance(rid, list) and "" in rid):
        where = "rid" if rid == "" else f"rid[{rid.index('')}]"
        raise APIError(400, f"{where} is an empty string: give a non-empty request id, or leave rid out (or null) for "
                       "a generated one", param="rid")
    if batch and isinstance(rid, str):
        return [f"{rid}_{i}" for i in range(n)]
    return per_item(rid, n, "rid", batch)


_GRAMMAR_NAMED = re.compile(rf"(?<=combined with )({'|'.join(GRAMMAR_KINDS)})\b")


def _sampling_error(msg: str, names: dict[str, str], about: str | None = None) -> APIError:
    """An engine SamplingParamsError as a 400 naming the client's field (``names``: engine name -> the
    endpoint's). ``about``: the field a message that opens with none is about (else "sampling_params")."""
    # "stop=...", "stop[3]=..." about one item of a list field, "logit_bias key ..." / "logit_bias holds ...",
    # "custom_params.thinking_budget=..." about one key of a dict field: messages open with the field they are about.
    m = re.match(r"(\w+)(\.\w+)?[\[= ]", msg)
    field = m.group(1) if m and m.group(1) in SamplingParams.__dataclass_fields__ else None
    if field is None and about is not None:
        msg, field = f"{about}: {msg}", about
    field = field or "sampling_params"
    key = (m.group(2) or "") if m and field == m.group(1) else ""  # (the key within the field: in the param too)
    # "min_new_tokens=2 cannot be combined with json_schema": the grammar by the client's name for it too
    # (response_format).
    msg = _GRAMMAR_NAMED.sub(lambda g: names.get(g[1], g[1]), msg)
    if field in names:
        msg = names[field] + msg[len(field):]
        field = names[field]
    if "max_new_tokens" in names:  # min_new_tokens' range names the limit: the client's name for it
        msg = msg.replace("max_new_tokens=", names["max_new_tokens"] + "=")
    return APIError(400, msg, param=field + key)


def finish_reason(result: dict | None) -> tuple[str | None, object]:
    """Engine finish_reason dict -> (OpenAI finish_reason, matched stop string/id or None)."""
    fr = (result or {}).get("meta_info", {}).get("finish_reason")
    if not fr:
        return None, None
    return fr.get("type"), fr.get("matched")
