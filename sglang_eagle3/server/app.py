"""The FastAPI application: SGLang-native endpoints (/health, /ready, /generate, /get_server_info (/server_info),
/get_model_info, /flush_cache, /abort_request), OpenAI endpoints (/v1/models, /v1/completions,
/v1/chat/completions), Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens: server/anthropic_api.py),
OpenAI's Responses API (/v1/responses: server/responses_api.py; nothing is stored, GET /v1/responses/{id} is a 404),
SGLang's tokenizer endpoints (/v1/tokenize, /v1/detokenize, also without /v1) and Prometheus /metrics.

Every error is ``{"error": {"message", "type", "param", "code"}}`` (under /v1/messages Anthropic's
``{"type": "error", "error": {"type", "message"}}``): 400 for a client's mistake, 404 for an
unknown model or route, 413 for a body over ``max_request_bytes``, 503 when the queue is full, the server is
shutting down or the engine thread is gone, 500 only when the engine itself failed (logged; the server keeps
serving).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from sglang_eagle3.runtime.request import SGLANG_UNSUPPORTED, sglang_neutral
from sglang_eagle3.runtime.sampling import seeded, short_repr
from sglang_eagle3.server import anthropic_api, openai_api, responses_api
from sglang_eagle3.server.config import ServerConfig
from sglang_eagle3.server.driver import DriverStoppedError, EngineDriver, EngineFailure, Submission
from sglang_eagle3.server.logprobs import TokenTable, with_token_text
from sglang_eagle3.server.metrics import CONTENT_TYPE, ServerMetrics
from sglang_eagle3.server.protocol import (
    AbortRequest,
    APIError,
    DetokenizeRequest,
    GenerateRequest,
    ParseFunctionCallRequest,
    SeparateReasoningRequest,
    TokenizeRequest,
    parse_body,
)
from sglang_eagle3.server.reasoning import separated
from sglang_eagle3.server.serving import (
    REQUEST_RECEIVED_AT,
    ClientDisconnected,
    ModelInfo,
    Serving,
    per_item,
    request_ids,
    samples_per_prompt,
    sse,
)
from sglang_eagle3.server.tools import parsed_calls

logger = logging.getLogger(__name__)

# Endpoints that answer without the API key (load balancers and scrapers probe them), as in SGLang.
# Answered without the API key (SGLang 0.5.23's auth passes /health*, /ready* and /metrics*): probes and scrapers
# carry no secret.
_PUBLIC_PATHS = ("/health", "/health_generate", "/ready", "/metrics")
_HEALTH_GENERATE_TIMEOUT_S = 20.0
# SGLang sampling parameters the engine does not implement, with the value that leaves sampling unchanged:
# /generate accepts that value (or null) and drops it, and refuses any other.
_NEUTRAL_SAMPLING = {"spaces_between_special_tokens": True}


def _error_response(e: APIError, path: str | None = None) -> JSONResponse:
    """``e`` as JSON: OpenAI's shape, or Anthropic's for a path of its Messages API."""
    if path is not None and anthropic_api.is_anthropic_path(path):
        return JSONResponse(anthropic_api.error_body(e), status_code=e.status)
    return JSONResponse(e.body(), status_code=e.status)


def _guarded(fn):
    """APIError -> its JSON; a client that went away (while sending its body or waiting) -> 499 (nobody reads
    it), no error logged; anything else -> logged 500."""

    async def wrapper(request: HTTPRequest):
        serving: Serving = request.app.state.serving
        received = REQUEST_RECEIVED_AT.set(time.perf_counter())
        try:
            return await fn(serving, request)
        except APIError as e:
            if e.status in (400, 404, 413):
                serving.metrics.rejected.inc(status=str(e.status))
            if e.status >= 500:  # a full queue or a shutdown is no fault: warned, not logged as an error
                logger.log(logging.ERROR if e.status == 500 else logging.WARNING, "%s %s -> %d: %s",
                           request.method, request.url.path, e.status, e.message)
            return _error_response(e, request.url.path)
        except ClientDisconnect:  # starlette's: the client left while its body was being read; nothing was queued
            logger.info("%s %s: the client disconnected before its request body was complete", request.method,
                        request.url.path)
            return Response(status_code=499)
        except ClientDisconnected:  # ours: it left while waiting; the driver aborted (and logged) its requests
            return Response(status_code=499)
        except Exception as e:
            logger.exception("unexpected error serving %s %s", request.method, request.url.path)
            return _error_response(APIError(500, f"internal server error: {type(e).__name__}: {e}"),
                                   request.url.path)
        finally:
            REQUEST_RECEIVED_AT.reset(received)

    # NOTE: not functools.wraps: FastAPI would read fn's (serving, request) signature and want a query param.
    wrapper.__name__ = wrapper.__qualname__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})


class _HttpMetrics:
    """ASGI middleware: SGLang's HTTP metrics (sglang:http_requests_total, sglang:http_responses_total,
    sglang:http_requests_active), by the route's path template. A path no route serves counts as ``unmatched``
    (SGLang names the path itself; a scanner's random paths would each add series forever), a method HTTP does not
    define as ``other``."""

    def __init__(self, app, metrics: ServerMetrics, router):
        self.app, self.metrics, self.router = app, metrics, router

    def _endpoint(self, scope) -> str:
        partial = None
        for route in self.router.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return route.path
            if match == Match.PARTIAL and partial is None:  # the path's route, another method (a 405)
                partial = route.path
        return partial or "unmatched"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        m, endpoint, method = self.metrics, self._endpoint(scope), scope["method"]
        if method not in _HTTP_METHODS:  # (any token is a method to HTTP: a client's made-up ones, one series each)
            method = "other"
        status = None

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        m.http_requests.inc(endpoint=endpoint, method=method)
        m.http_active.add(1, endpoint=endpoint, method=method)
        try:
            await self.app(scope, receive, send_status)
        finally:
            m.http_active.add(-1, endpoint=endpoint, method=method)
            # No answer started: the app raised, and Starlette's outermost handler answers 500.
            m.http_responses.inc(endpoint=endpoint, status_code=str(status or 500), method=method)


class RequestTooLarge(APIError):
    def __init__(self, limit: int, size: int | None = None):
        got = f"of {size} bytes " if size is not None else ""
        super().__init__(413, f"the request body {got}is larger than this server accepts ({limit} bytes: "
                         "--max-request-bytes)", code="request_too_large")


class _BodyLimit:
    """ASGI middleware: 413 for a body over ``limit`` bytes, at once when its Content-Length says so, else as
    soon as the bytes received pass it (the handler's body read raises RequestTooLarge), so an oversized
    body is never held in memory whole."""

    def __init__(self, app, limit: int, metrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            self.metrics.rejected.inc(status="413")
            return await _error_response(RequestTooLarge(self.limit, int(declared)), scope["path"])(scope, receive,
                                                                                                  send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise RequestTooLarge(self.limit)
            return message

        started = False

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except RequestTooLarge as e:  # raised outside a handler that answers APIErrors itself
            if started:
                raise
            self.metrics.rejected.inc(status="413")
            await _error_response(e, scope["path"])(scope, receive, send)


class _ApiKey:
    """ASGI middleware: 401 unless ``Authorization: Bearer <api_key>`` (the scheme compared case-insensitively,
    RFC 7235), or under /v1/messages Anthropic's ``x-api-key: <api_key>`` (what its SDK sends), except on the
    public paths and for OPTIONS (as SGLang's: a browser's CORS preflight never carries the key; an OPTIONS the
    CORS middleware does not answer reaches no endpoint, all of which take other methods).
    Plain ASGI, not BaseHTTPMiddleware, which would read the request body in a task of its own (an oversized body's
    413 would come out as a 500)."""

    def __init__(self, app, api_key: str):
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in _PUBLIC_PATHS and scope["method"] != "OPTIONS":
            header = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            scheme, _, token = header.strip().partition(b" ")
            ok = scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)
            anthropic = anthropic_api.is_anthropic_path(scope["path"])
            if not ok and anthropic:
                key = next((v for k, v in scope["headers"] if k == b"x-api-key"), None)
                ok = key is not None and hmac.compare_digest(key.strip(), self.key)
            if not ok:
                how = "Authorization: Bearer ... or x-api-key: ..." if anthropic else "Authorization: Bearer ..."
                err = APIError(401, f"missing or wrong API key ({how})", code="invalid_api_key")
                return await _error_response(err, scope["path"])(scope, receive, send)
        await self.app(scope, receive, send)


class _AnthropicRequestId:
    """ASGI middleware: every answer under /v1/messages carries Anthropic's ``request-id`` header (``req_`` and 32 hex
    digits), its 401s and 413s too: Anthropic's SDK keeps it as the response's and the error's ``request_id``, and
    clients print it beside a failure. Fresh a request; the other endpoints answer without one."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not anthropic_api.is_anthropic_path(scope["path"]):
            return await self.app(scope, receive, send)
        rid = f"req_{uuid.uuid4().hex}".encode()

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"request-id", rid)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


def _hf_config(model_path: str) -> dict:
    """The checkpoint's config.json (model_type, architectures: /get_model_info), {} where it cannot be read."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def model_info(info: dict, served_model_name: str) -> ModelInfo:
    """ModelInfo from Engine.get_server_info()."""
    draft, args = info.get("draft") or {}, info.get("args") or {}
    hf = _hf_config(str(info["model"]["path"]))
    return ModelInfo(served_model_name=served_model_name, model_path=str(info["model"]["path"]),
                     context_length=int(info["model"]["context_length"]),
                     vocab_size=int(info["model"]["vocab_size"]), speculative_num_steps=draft.get("num_steps"),
                     tokenizer_path=args.get("tokenizer_path") or str(info["model"]["path"]),
                     max_top_logprobs_num=int(args.get("max_top_logprobs_num", 20)),
                     sampling_defaults=tuple((info["model"].get("sampling_defaults") or {}).items()),
                     model_type=hf.get("model_type"), architectures=tuple(hf.get("architectures") or ()))


def create_app(engine, driver: EngineDriver, config: ServerConfig, model: ModelInfo | None = None) -> FastAPI:
    """The app over a driver. ``model`` defaults to reading ``engine.get_server_info()``, which must then
    happen before the driver's thread starts."""
    app = FastAPI(title="sglang_eagle3", docs_url=None, redoc_url=None)
    model = model or model_info(engine.get_server_info(), config.served_model_name)
    app.state.serving = Serving(engine, driver, config, model)
    driver.metrics.set_model_name(model.served_model_name)  # SGLang's model_name label
    if config.sampling_defaults == "model" and model.sampling_defaults:
        logger.info("chat requests' unset sampling parameters default to the model's generation_config.json: %s "
                    "(--sampling-defaults openai: OpenAI's)", dict(model.sampling_defaults))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: HTTPRequest, exc: StarletteHTTPException):
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
               else f"{request.method} {request.url.path}: {exc.detail}")
        code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error_response(APIError(exc.status_code, msg, code=code), request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: HTTPRequest, exc: RequestValidationError):
        return _error_response(APIError(400, str(exc)), request.url.path)

    if config.api_key:
        app.add_middleware(_ApiKey, api_key=config.api_key)
    # An oversized body is refused before authentication or routing read anything.
    app.add_middleware(_BodyLimit, limit=config.max_request_bytes, metrics=app.state.serving.metrics)
    app.add_middleware(_AnthropicRequestId)  # (outside the two above: their refusals carry it too)
    # Outermost (added last): CORS as SGLang's server sets it (every origin, method and header, credentials
    # allowed), so a browser's preflight is answered before the key check, and every answer (a 401 or 413
    # included, which a browser could not read otherwise) carries the CORS headers.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_credentials=True, allow_methods=["*"],
                       allow_headers=["*"])
    # Outside everything: every answer is counted (a preflight, a 401 or 413 too), as SGLang's HTTP metrics count.
    app.add_middleware(_HttpMetrics, metrics=app.state.serving.metrics, router=app.router)

    app.add_api_route("/health", health, methods=["GET", "HEAD"])
    app.add_api_route("/health_generate", _guarded(health_generate), methods=["GET", "HEAD"])
    app.add_api_route("/generate", _guarded(generate), methods=["POST", "PUT"])
    app.add_api_route("/ready", ready, methods=["GET"])
    app.add_api_route("/get_server_info", _guarded(get_server_info), methods=["GET"])
    app.add_api_route("/server_info", _guarded(get_server_info), methods=["GET"])
    app.add_api_route("/get_model_info", _guarded(get_model_info), methods=["GET"])
    app.add_api_route("/model_info", _guarded(get_model_info), methods=["GET"])
    app.add_api_route("/flush_cache", _guarded(flush_cache), methods=["GET", "POST"])
    app.add_api_route("/abort_request", _guarded(abort_request), methods=["POST"])
    app.add_api_route("/separate_reasoning", _guarded(separate_reasoning), methods=["POST"])
    app.add_api_route("/parse_function_call", _guarded(parse_function_call), methods=["POST"])
    app.add_api_route("/metrics", _guarded(metrics), methods=["GET"])
    app.add_api_route("/v1/models", _guarded(list_models), methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _guarded(get_model), methods=["GET"])
    app.add_api_route("/v1/completions", _guarded(openai_api.completions), methods=["POST"])
    app.add_api_route("/v1/chat/completions", _guarded(openai_api.chat_completions), methods=["POST"])
    app.add_api_route("/v1/messages", _guarded(anthropic_api.messages), methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", _guarded(anthropic_api.count_tokens), methods=["POST"])
    app.add_api_route("/v1/responses", _guarded(responses_api.responses), methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", _guarded(responses_api.not_stored), methods=["GET", "DELETE"])
    app.add_api_route("/v1/responses/{response_id}/{action}", _guarded(responses_api.not_stored),
                      methods=["GET", "POST"])
    for prefix in ("/v1", ""):  # (SGLang serves both paths)
        app.add_api_route(f"{prefix}/tokenize", _guarded(tokenize), methods=["POST"])
        app.add_api_route(f"{prefix}/detokenize", _guarded(detokenize), methods=["POST"])
    return app


# -- native endpoints -------------------------------------------------------------------------------------------

async def health(request: HTTPRequest) -> Response:
    """200 (empty body, as SGLang) while the engine thread runs and takes requests, else 503 (shutting down
    included, as SGLang; and once the engine cannot serve again: its TP workers are gone)."""
    return Response(status_code=200 if request.app.state.serving.driver.accepting else 503)


async def ready(request: HTTPRequest) -> Response:
    """SGLang's /ready: 200 while new requests are taken, else 503 (as /health here: the server only listens once
    the engine has loaded)."""
    return await health(request)


async def health_generate(serving: Serving, request: HTTPRequest) -> Response:
    """Generates one token end to end; 200 when it comes back within 20 s, else 503."""
    req = serving.make_request(input_ids=[0], sampling_params={"max_new_tokens": 1, "temperature": 0},
                               prompt_param="input_ids")
    sub = serving.submit([req])
    try:
        await asyncio.wait_for(sub.results(), _HEALTH_GENERATE_TIMEOUT_S)
    except (asyncio.TimeoutError, EngineFailure) as e:
        sub.close()
        logger.error("health_generate failed: %s", e or "timed out")
        return Response(status_code=503)
    return Response(status_code=200)


def _refuse_unsupported(extra: dict | None) -> None:
    for name, what in SGLANG_UNSUPPORTED.items():
        if name in (extra or {}) and not sglang_neutral(extra[name]):
            raise APIError(400, f"{name}={short_repr(extra[name])}: this server does not support {what} (SGLang's "
                           f"/generate field; leave it out or null)", param=name)


def _drop_neutral(sp: dict) -> dict:
    """Drops the unimplemented SGLang sampling parameters that are set to their neutral value; 400 for any
    other value (never silently ignored)."""
    for name, neutral in _NEUTRAL_SAMPLING.items():
        if name not in sp:
            continue
        v = sp.pop(name)
        if isinstance(neutral, bool):
            ok = v is None or v is neutral
        else:
            ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == neutral)
        if not ok:
            raise APIError(400, f"{name}={short_repr(v)} is not supported by this server (only {neutral!r}, which "
                           "leaves sampling unchanged)", param=name)
    return sp


def _thinking_budget(serving: Serving, budget: int, sps: list[dict]) -> None:
    """SGLang's ``max_thinking_tokens`` (one for the whole batch): each prompt's
    ``custom_params.thinking_budget``, over one given there, as SGLang's tokenizer manager puts it. Refused without
    strict thinking (SGLang's words: nothing would enforce it) and below 0 (SGLang's API types it unsigned)."""
    if budget < 0:
        raise APIError(400, f"max_thinking_tokens={budget} must be an integer >= 0 (the thinking's most tokens; "
                       "leave it out or null for the default budget)", param="max_thinking_tokens")
    if not serving.strict_thinking:
        raise APIError(400, f"max_thinking_tokens={budget}: max_thinking_tokens requires the server to be launched "
                       "with --enable-strict-thinking", param="max_thinking_tokens")
    for sp in sps:
        given = sp.get("custom_params")
        if given is None or isinstance(given, dict):  # (anything else: the engine names it)
            sp["custom_params"] = {**(given or {}), "thinking_budget": budget}


async def generate(serving: Serving, request: HTTPRequest):
    """SGLang's /generate: text or input_ids (or lists of them), sampling_params, stream, logprobs."""
    body: GenerateRequest = parse_body(GenerateRequest, await request.body())  # type: ignore[assignment]
    _refuse_unsupported(body.model_extra)
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "exactly one of text and input_ids must be given", param="text")
    batch = isinstance(body.text, list) or (body.input_ids is not None and bool(body.input_ids)
                                            and isinstance(body.input_ids[0], list))
    prompt_param = "text" if body.text is not None else "input_ids"
    if batch:
        prompts = body.text if body.text is not None else body.input_ids
        if not prompts:
            raise APIError(400, "the batch of prompts is empty", param=prompt_param)
    else:
        prompts = [body.text if body.text is not None else body.input_ids]
    n = len(prompts)
    sps = [_drop_neutral(dict(sp or {})) for sp in per_item(body.sampling_params, n, "sampling_params", batch)]
    if body.max_thinking_tokens is not None:
        _thinking_budget(serving, body.max_thinking_tokens, sps)
    # SGLang's parallel sampling: sampling_params.n samples a prompt (one n for the whole batch, as SGLang
    # requires), answered as a list, prompt-major (sample j of prompt i at i * n + j), seeds as OpenAI's n.
    ks = [samples_per_prompt(sp.pop("n", None), "sampling_params.n") for sp in sps]
    k = ks[0]
    if any(x != k for x in ks):
        raise APIError(400, f"sampling_params.n differs between the prompts of the batch ({sorted(set(ks))}): one n "
                       "for the whole batch, as in SGLang", param="sampling_params.n")
    serving.check_batch_size(n, prompt_param, n=k, n_param="sampling_params.n")
    lps = per_item(body.return_logprob, n, "return_logprob", batch)
    starts = per_item(body.logprob_start_len, n, "logprob_start_len", batch)
    tops = per_item(body.top_logprobs_num, n, "top_logprobs_num", batch)
    rids = request_ids(body.rid, n, batch)
    # SGLang's return_text_in_logprobs: each logprob row's third element the token's text (null without it)
    texts = bool(body.return_text_in_logprobs and any(lps))
    table = serving.token_table if texts else None
    if texts and table is None:
        raise APIError(400, "return_text_in_logprobs needs the server's tokenizer to decode the tokens, and this "
                       "server was started without one (--skip-tokenizer-init)", param="return_text_in_logprobs")

    # SGLang reads "max_new_tokens": null as no limit but the context's (its scheduler cuts 1 << 30 to what the
    # prompt leaves); left out, it is the default 128.
    unlimited = [("max_new_tokens" in sp and sp["max_new_tokens"] is None) for sp in sps]

    def build() -> list:
        return [serving.make_request(prompt=p if body.text is not None else None,
                                     input_ids=None if body.text is not None else p, sampling_params=seeded(sps[i], j),
                                     prompt_param=prompt_param,
                                     rid=rids[i] if k == 1 or rids[i] is None else f"{rids[i]}_{j}",
                                     return_logprob=bool(lps[i]), logprob_start_len=starts[i],
                                     top_logprobs_num=tops[i], index=i if batch else None,
                                     default_max_new_tokens=serving.model.context_length if unlimited[i] else None)
                for i, p in enumerate(prompts) for j in range(k)]

    reqs = await serving.off_loop(build)
    batch = batch or k > 1  # n samples of one prompt come back as a list, as SGLang answers
    sub = serving.submit(reqs, full_results=body.stream, stream=bool(body.stream))
    if body.stream:
        return await serving.stream(sub, request, _generate_chunks(sub, batch, table))
    finals = await serving.wait(sub, request)
    if table is not None:
        outs = await serving.off_loop(lambda: [with_token_text(u.result, table) for u in finals])
    else:
        outs = [u.result for u in finals]
    return outs if batch else outs[0]


async def _generate_chunks(sub: Submission, batch: bool, table: TokenTable | None = None) -> AsyncIterator[bytes]:
    """SGLang's stream: every chunk is the request's whole output so far (cumulative text and output_ids,
    meta_info); batches add ``index``. ``table`` set: the logprob rows carry each token's text."""
    async for u in sub.updates():
        if u.error is not None:
            raise u.failure()
        out = dict(u.result or {})
        if table is not None:
            out = with_token_text(out, table)
        if batch:
            out["index"] = u.index
        yield sse(out)
    yield sse("[DONE]")


async def abort_request(serving: Serving, request: HTTPRequest) -> Response:
    """SGLang's /abort_request: ``{"rid": ...}`` ends every request in flight whose id starts with it (a batch's
    ``<rid>_<i>`` too), ``{"abort_all": true}`` every request. Each answers its client with the output so far and
    finish_reason ``abort`` (a 200, as SGLang's). 200 with an empty body, whether or not a request matched; an empty
    rid without abort_all matches nothing (SGLang ignores it)."""
    body: AbortRequest = parse_body(AbortRequest, await request.body())  # type: ignore[assignment]
    if body.abort_all or body.rid:
        serving.driver.abort_by_client(body.rid or "", body.abort_all)
    else:
        logger.warning("/abort_request without a rid or abort_all: nothing to abort")
    return Response(status_code=200)


async def separate_reasoning(serving: Serving, request: HTTPRequest) -> JSONResponse:
    """SGLang's /separate_reasoning (server/reasoning.py separated)."""
    body: SeparateReasoningRequest = parse_body(SeparateReasoningRequest,  # type: ignore[assignment]
                                                await request.body())
    return JSONResponse(separated(body.text, body.reasoning_parser, body.return_blocks))


async def parse_function_call(serving: Serving, request: HTTPRequest) -> JSONResponse:
    """SGLang's /parse_function_call (server/tools.py parsed_calls; ``tool_call_parser`` left out: the server's
    --tool-call-parser)."""
    body: ParseFunctionCallRequest = parse_body(ParseFunctionCallRequest,  # type: ignore[assignment]
                                                await request.body())
    return JSONResponse(parsed_calls(body.text, body.tools, body.tool_call_parser, serving.config.tool_call_parser))


# -- tokenizer endpoints ----------------------------------------------------------------------------------------

def _tokenizer(serving: Serving, what: str, param: str):
    if serving.tokenizer is None:
        raise APIError(400, f"this server was started without a tokenizer (--skip-tokenizer-init): {what} needs one",
                       param=param)
    return serving.tokenizer


async def tokenize(serving: Serving, request: HTTPRequest):
    """SGLang's /v1/tokenize (and /tokenize): ``{"tokens", "count", "max_model_len"}`` for ``prompt`` (a text: ids and
    their count; a list of texts: a list of each) or ``messages`` (the chat prompt's ids, as /v1/chat/completions
    encodes them: ``count`` is its ``usage.prompt_tokens``). ``max_model_len``: the context length."""
    body: TokenizeRequest = parse_body(TokenizeRequest, await request.body())  # type: ignore[assignment]
    serving.check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
        given = "both were given" if body.prompt is not None else "neither was given"
        raise APIError(400, f"exactly one of prompt and messages must be given ({given})", param="prompt")
    tok = _tokenizer(serving, "tokenizing", "prompt" if body.prompt is not None else "messages")
    context = serving.model.context_length
    if body.prompt is not None:
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        ids = await serving.off_loop(lambda: [tok.encode(t, add_special_tokens=body.add_special_tokens)
                                              for t in texts])
        if isinstance(body.prompt, str):
            return {"tokens": ids[0], "count": len(ids[0]), "max_model_len": context}
        return {"tokens": ids, "count": [len(x) for x in ids], "max_model_len": context}
    # SGLang's rules: add_generation_prompt given renders the messages with it, and only then is add_special_tokens
    # read, where the client set it (a rendered chat holds its special tokens; its default true would add a BOS
    # the chat endpoint never adds); left out, as chat renders them.
    formatted = body.add_generation_prompt is not None
    if formatted and body.continue_final_message and not body.add_generation_prompt:
        raise APIError(400, "continue_final_message needs add_generation_prompt (the assistant turn it continues "
                       "is opened by the generation prompt): leave add_generation_prompt out or set it true",
                       param="add_generation_prompt")
    special = formatted and "add_special_tokens" in body.model_fields_set and body.add_special_tokens
    prompt = openai_api.tokenize_chat_prompt(serving, body)
    ids = await serving.off_loop(prompt.encode, serving, body.add_generation_prompt is not False, special)
    return {"tokens": ids, "count": len(ids), "max_model_len": context}


async def detokenize(serving: Serving, request: HTTPRequest):
    """SGLang's /v1/detokenize (and /detokenize): ``{"text"}``, one text for a list of ids (``[]``: ``""``), a list of
    texts for a list of lists. Ids outside the model's vocabulary are a 400 naming the first (the rule /generate's
    input_ids follow), never dropped unread."""
    body: DetokenizeRequest = parse_body(DetokenizeRequest, await request.body())  # type: ignore[assignment]
    serving.check_model(body.model)
    tok = _tokenizer(serving, "detokenizing", "tokens")
    batch = bool(body.tokens) and isinstance(body.tokens[0], list)
    rows: list[list[int]] = body.tokens if batch else [body.tokens]  # type: ignore[assignment]
    vocab = serving.model.vocab_size

    def decode() -> list[str]:  # (a body of megabytes holds millions of ids: checked off the event loop too)
        for i, row in enumerate(rows):
            bad = next((j for j, t in enumerate(row) if not 0 <= t < vocab), None)
            if bad is not None:
                where = f"tokens[{i}][{bad}]" if batch else f"tokens[{bad}]"
                raise APIError(400, f"{where}={row[bad]} is outside the vocabulary [0, {vocab})",
                               param=where.replace("][", ".").replace("[", ".").rstrip("]"))
        return [tok.decode(row, skip_special_tokens=body.skip_special_tokens) for row in rows]

    texts = await serving.off_loop(decode)
    return {"text": texts if batch else texts[0]}


async def get_server_info(serving: Serving, request: HTTPRequest):
    info = await _engine_info(serving)
    m, cfg = serving.metrics, serving.config
    info["server"] = {
        "backend": "native", "host": cfg.host, "port": cfg.port, "served_model_name": cfg.served_model_name,
        "max_queued_requests": cfg.max_queued_requests, "max_inflight_requests": serving.driver.max_inflight,
        "uptime_s": round(time.time() - serving.driver.started_at, 3),
    }
    info["server_stats"] = {
        "inflight_requests": serving.driver.inflight,
        "finished_requests": int(m.requests.value(outcome="finished")),
        "aborted_requests": int(m.requests.value(outcome="aborted")),
        "failed_requests": int(m.requests.value(outcome="failed")),
        "rejected_requests": {s: int(m.rejected.value(status=s)) for s in ("400", "404", "413", "503")},
        "prompt_tokens": int(m.prompt_tokens.value()), "generation_tokens": int(m.generation_tokens.value()),
        "engine_errors": int(m.engine_errors.value()),
    }
    return info


async def get_model_info(serving: Serving, request: HTTPRequest):
    """SGLang's /get_model_info (and /model_info) shape, for clients that read the served model from it."""
    m, cfg = serving.model, serving.config
    return {"model_path": m.model_path, "served_model_name": m.served_model_name,
            "tokenizer_path": m.tokenizer_path if serving.tokenizer is not None else None,
            "is_generation": True, "preferred_sampling_params": None,
            "reasoning_parser": cfg.reasoning_parser, "tool_call_parser": cfg.tool_call_parser,
            "disaggregation_mode": "null", "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": m.model_type, "architectures": list(m.architectures) if m.architectures else None}


async def flush_cache(serving: Serving, request: HTTPRequest):
    """SGLang's /flush_cache answers 200 with a line of text when its prefix cache was flushed. This engine
    keeps no prefix cache (a finished request's KV pages are freed at once), so there is nothing to flush."""
    return PlainTextResponse("Cache flushed: this server keeps no prefix cache, so there was nothing to flush.\n")


async def metrics(serving: Serving, request: HTTPRequest):
    info = await _engine_info(serving)
    serving.metrics.update_from_info(info, serving.driver.inflight)
    return PlainTextResponse(serving.metrics.render(), media_type=CONTENT_TYPE)


async def _engine_info(serving: Serving) -> dict:
    """Engine.get_server_info(), taken on the engine thread between two steps (503 naming the failure once the
    engine cannot serve again: its TP workers are gone, and asking them would only raise that)."""
    if serving.driver.broken is not None:
        raise APIError(503, f"the engine cannot serve requests any more: {serving.driver.broken}",
                       code="engine_unavailable")
    try:
        return dict(await serving.driver.call(serving.engine.get_server_info, serving.config.snapshot_timeout_s))
    except asyncio.TimeoutError:
        raise APIError(503, f"the engine thread did not answer within {serving.config.snapshot_timeout_s} s",
                       code="engine_busy") from None
    except DriverStoppedError as e:
        raise APIError(503, str(e), code="engine_unavailable") from None


def _model_card(serving: Serving) -> dict:
    m = serving.model
    return {"id": m.served_model_name, "object": "model", "created": serving.created, "owned_by": "sglang_eagle3",
            "root": m.model_path, "max_model_len": m.context_length}


async def list_models(serving: Serving, request: HTTPRequest):
    return {"object": "list", "data": [_model_card(serving)]}


async def get_model(serving: Serving, request: HTTPRequest):
    serving.check_model(request.path_params["model_id"])
    return _model_card(serving)
