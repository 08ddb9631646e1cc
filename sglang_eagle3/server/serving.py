"""What every generation endpoint shares: validation into engine ``Request``s with errors that name the
client's field, submission to the driver, waiting with cancellation on disconnect, and server-sent events.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse

from sglang_eagle3.engine import RequestError
from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import SamplingParamsError
from sglang_eagle3.server.config import ServerConfig
from sglang_eagle3.server.driver import (
    DriverStoppedError,
    DuplicateRequestIdError,
    EngineDriver,
    EngineFailure,
    QueueFullError,
    Submission,
    Update,
)
from sglang_eagle3.server.protocol import APIError
from sglang_eagle3.tokenizer import ChatTemplateError

logger = logging.getLogger(__name__)

# RequestError messages that start with one of these name that field; all others are about the prompt.
_REQUEST_FIELDS = ("logprob_start_len", "top_logprobs_num")


@dataclass(frozen=True)
class ModelInfo:
    """What the HTTP side needs to know about the served model (read once, before the engine thread starts)."""

    served_model_name: str
    model_path: str
    context_length: int
    vocab_size: int
    speculative_num_steps: int | None


class ClientDisconnected(Exception):
    pass


def sse(payload: dict | str) -> bytes:
    """One server-sent event: ``data: {...}\\n\\n`` (or ``data: [DONE]``)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + data.encode() + b"\n\n"


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
        self.tokenizer = engine.tokenizer
        self.metrics = driver.metrics
        self.created = int(time.time())

    # -- validation ------------------------------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name not in (self.model.served_model_name, self.model.model_path, "default"):
            raise APIError(404, f"model {name!r} does not exist: this server serves "
                           f"{self.model.served_model_name!r}", param="model", code="model_not_found")

    def make_request(self, *, prompt: str | None = None, input_ids: list[int] | None = None,
                     sampling_params: dict, prompt_param: str, names: dict[str, str] | None = None,
                     rid: str | None = None, return_logprob: bool = False, logprob_start_len: int | None = None,
                     top_logprobs_num: int | None = None) -> Request:
        """Engine.make_request with its errors as 400s naming the client's field (``names`` maps engine
        sampling names to the endpoint's, e.g. max_new_tokens -> max_tokens)."""
        names = names or {}
        try:
            req = self.engine.make_request(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                           top_logprobs_num, rid)
        except SamplingParamsError as e:
            raise _sampling_error(str(e), names) from None
        except RequestError as e:
            msg = str(e)
            param = next((f for f in _REQUEST_FIELDS if msg.startswith(f)), prompt_param)
            code = "context_length_exceeded" if "longer than the context" in msg else None
            raise APIError(400, msg, param=param, code=code) from None
        requested = sampling_params.get("max_new_tokens")
        n = len(req.input_ids)
        if requested is not None and n + requested > self.model.context_length:
            field = names.get("max_new_tokens", "max_new_tokens")
            raise APIError(400, f"{field}={requested} with a prompt of {n} tokens exceeds the context length "
                           f"of {self.model.context_length} tokens (at most {self.model.context_length - n} "
                           "new tokens for this prompt)", param=field, code="context_length_exceeded")
        return req

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        if self.tokenizer is None:
            raise APIError(400, "this server was started without a tokenizer (--skip-tokenizer-init): chat "
                           "needs one; use /generate with input_ids", param="messages")
        try:
            return self.tokenizer.encode_chat(messages, add_generation_prompt)
        except ChatTemplateError as e:
            raise APIError(400, str(e), param="messages") from None

    # -- submission and waiting --------------------------------------------------------------------------
    def submit(self, requests: list[Request], *, full_results: bool = False) -> Submission:
        try:
            return self.driver.submit(requests, full_results=full_results)
        except QueueFullError as e:
            self.metrics.rejected.inc(status="503")
            raise APIError(503, str(e), code="queue_full") from None
        except DriverStoppedError as e:
            raise APIError(503, str(e), code="engine_unavailable") from None
        except DuplicateRequestIdError as e:
            raise APIError(400, str(e), param="rid") from None

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
        try:
            return await self._race(sub.results(), request)
        except ClientDisconnected:
            sub.close()
            raise
        except EngineFailure as e:
            sub.close()
            raise APIError(500, str(e), code="engine_error") from None

    async def stream(self, sub: Submission, request: HTTPRequest, chunks: AsyncIterator[bytes]):
        """An SSE response over ``chunks`` (which end with ``data: [DONE]``). The first chunk is awaited
        before answering, so an engine failure at prefill is a plain HTTP 500; a failure later becomes an
        ``{"error": ...}`` event. However the stream ends, unfinished requests are aborted."""
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
            raise APIError(500, str(e), code="engine_error") from None
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
                yield sse(APIError(500, str(e), code="engine_error").body())
                yield sse("[DONE]")

        return _EventStream(body(), sub.close)


def _sampling_error(msg: str, names: dict[str, str]) -> APIError:
    m = re.match(r"(\w+)=", msg)
    field = m.group(1) if m else "sampling_params"  # "unknown sampling parameter(s): ..."
    if field in names:
        msg = names[field] + msg[len(field):]
        field = names[field]
    return APIError(400, msg, param=field)


def finish_reason(result: dict | None) -> tuple[str | None, object]:
    """Engine finish_reason dict -> (OpenAI finish_reason, matched stop string/id or None)."""
    fr = (result or {}).get("meta_info", {}).get("finish_reason")
    if not fr:
        return None, None
    return fr.get("type"), fr.get("matched")
