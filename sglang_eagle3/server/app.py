"""The FastAPI application: SGLang-native endpoints (/health, /generate, /get_server_info), OpenAI endpoints
(/v1/models, /v1/completions, /v1/chat/completions) and Prometheus /metrics.

Every error is ``{"error": {"message", "type", "param", "code"}}``: 400 for a client's mistake, 404 for an
unknown model or route, 503 when the queue is full or the engine thread is gone, 500 only when the engine
itself failed (logged; the server keeps serving).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sglang_eagle3.server import openai_api
from sglang_eagle3.server.config import ServerConfig
from sglang_eagle3.server.driver import EngineDriver, EngineFailure, Submission
from sglang_eagle3.server.metrics import CONTENT_TYPE
from sglang_eagle3.server.protocol import APIError, GenerateRequest, parse_body
from sglang_eagle3.server.serving import ClientDisconnected, ModelInfo, Serving, sse

logger = logging.getLogger(__name__)

# Endpoints that answer without the API key (load balancers and scrapers probe them), as in SGLang.
_PUBLIC_PATHS = ("/health", "/health_generate", "/metrics")
_HEALTH_GENERATE_TIMEOUT_S = 20.0


def _error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _guarded(fn):
    """APIError -> its JSON; a client that went away -> 499 (nobody reads it); anything else -> logged 500."""

    async def wrapper(request: HTTPRequest):
        serving: Serving = request.app.state.serving
        try:
            return await fn(serving, request)
        except APIError as e:
            if e.status in (400, 404):
                serving.metrics.rejected.inc(status=str(e.status))
            if e.status >= 500:
                logger.error("%s %s -> %d: %s", request.method, request.url.path, e.status, e.message)
            return _error_response(e)
        except ClientDisconnected:
            return Response(status_code=499)
        except Exception as e:
            logger.exception("unexpected error serving %s %s", request.method, request.url.path)
            return _error_response(APIError(500, f"internal server error: {type(e).__name__}: {e}"))

    # NOTE: not functools.wraps: FastAPI would read fn's (serving, request) signature and want a query param.
    wrapper.__name__ = wrapper.__qualname__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def model_info(info: dict, served_model_name: str) -> ModelInfo:
    """ModelInfo from Engine.get_server_info()."""
    draft = info.get("draft") or {}
    return ModelInfo(served_model_name=served_model_name, model_path=str(info["model"]["path"]),
                     context_length=int(info["model"]["context_length"]),
                     vocab_size=int(info["model"]["vocab_size"]), speculative_num_steps=draft.get("num_steps"))


def create_app(engine, driver: EngineDriver, config: ServerConfig, model: ModelInfo | None = None) -> FastAPI:
    """The app over a driver. ``model`` defaults to reading ``engine.get_server_info()``, which must then
    happen before the driver's thread starts."""
    app = FastAPI(title="sglang_eagle3", docs_url=None, redoc_url=None)
    model = model or model_info(engine.get_server_info(), config.served_model_name)
    app.state.serving = Serving(engine, driver, config, model)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: HTTPRequest, exc: StarletteHTTPException):
        msg = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
               else f"{request.method} {request.url.path}: {exc.detail}")
        code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return _error_response(APIError(exc.status_code, msg, code=code))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: HTTPRequest, exc: RequestValidationError):
        return _error_response(APIError(400, str(exc)))

    if config.api_key:
        @app.middleware("http")
        async def check_api_key(request: HTTPRequest, call_next):
            if request.url.path not in _PUBLIC_PATHS and \
                    request.headers.get("authorization") != f"Bearer {config.api_key}":
                return _error_response(APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                                                code="invalid_api_key"))
            return await call_next(request)

    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/health_generate", _guarded(health_generate), methods=["GET"])
    app.add_api_route("/generate", _guarded(generate), methods=["POST", "PUT"])
    app.add_api_route("/get_server_info", _guarded(get_server_info), methods=["GET"])
    app.add_api_route("/metrics", _guarded(metrics), methods=["GET"])
    app.add_api_route("/v1/models", _guarded(list_models), methods=["GET"])
    app.add_api_route("/v1/models/{model_id:path}", _guarded(get_model), methods=["GET"])
    app.add_api_route("/v1/completions", _guarded(openai_api.completions), methods=["POST"])
    app.add_api_route("/v1/chat/completions", _guarded(openai_api.chat_completions), methods=["POST"])
    return app


# -- native endpoints -------------------------------------------------------------------------------------------

async def health(request: HTTPRequest) -> Response:
    """200 (empty body, as SGLang) while the engine thread runs, else 503."""
    return Response(status_code=200 if request.app.state.serving.driver.alive else 503)


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


def _per_item(value, n: int, name: str, batch: bool) -> list:
    """SGLang batch semantics: a list gives one value per prompt, a scalar applies to all."""
    if batch and isinstance(value, list):
        if len(value) != n:
            raise APIError(400, f"{name} has {len(value)} entries for {n} prompts", param=name)
        return value
    if not batch and isinstance(value, list):
        raise APIError(400, f"{name} is a list but the request has a single prompt", param=name)
    return [value] * n


async def generate(serving: Serving, request: HTTPRequest):
    """SGLang's /generate: text or input_ids (or lists of them), sampling_params, stream, logprobs."""
    body: GenerateRequest = parse_body(GenerateRequest, await request.body())  # type: ignore[assignment]
    if (body.text is None) == (body.input_ids is None):
        raise APIError(400, "exactly one of text and input_ids must be given", param="text")
    batch = isinstance(body.text, list) or (body.input_ids is not None and bool(body.input_ids)
                                            and isinstance(body.input_ids[0], list))
    if batch:
        prompts = body.text if body.text is not None else body.input_ids
        if not prompts:
            raise APIError(400, "the batch of prompts is empty", param="text" if body.text is not None else "input_ids")
    else:
        prompts = [body.text if body.text is not None else body.input_ids]
    n = len(prompts)
    sps = _per_item(body.sampling_params, n, "sampling_params", batch)
    lps = _per_item(body.return_logprob, n, "return_logprob", batch)
    starts = _per_item(body.logprob_start_len, n, "logprob_start_len", batch)
    tops = _per_item(body.top_logprobs_num, n, "top_logprobs_num", batch)
    rids = _per_item(body.rid, n, "rid", batch)
    reqs = []
    for i, p in enumerate(prompts):
        text, ids = (p, None) if body.text is not None else (None, p)
        reqs.append(serving.make_request(prompt=text, input_ids=ids, sampling_params=dict(sps[i] or {}),
                                         prompt_param="text" if text is not None else "input_ids", rid=rids[i],
                                         return_logprob=bool(lps[i]), logprob_start_len=starts[i],
                                         top_logprobs_num=tops[i]))
    sub = serving.submit(reqs, full_results=body.stream)
    if body.stream:
        return await serving.stream(sub, request, _generate_chunks(sub, batch))
    finals = await serving.wait(sub, request)
    outs = [u.result for u in finals]
    return outs if batch else outs[0]


async def _generate_chunks(sub: Submission, batch: bool) -> AsyncIterator[bytes]:
    """SGLang's stream: every chunk is the request's whole output so far (cumulative text and output_ids,
    meta_info); batches add ``index``."""
    async for u in sub.updates():
        if u.error is not None:
            raise EngineFailure(u.error)
        out = dict(u.result or {})
        if batch:
            out["index"] = u.index
        yield sse(out)
    yield sse("[DONE]")


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
        "rejected_requests": {s: int(m.rejected.value(status=s)) for s in ("400", "404", "503")},
        "prompt_tokens": int(m.prompt_tokens.value()), "generation_tokens": int(m.generation_tokens.value()),
        "engine_errors": int(m.engine_errors.value()),
    }
    return info


async def metrics(serving: Serving, request: HTTPRequest):
    info = await _engine_info(serving)
    serving.metrics.update_from_info(info, serving.driver.inflight)
    return PlainTextResponse(serving.metrics.render(), media_type=CONTENT_TYPE)


async def _engine_info(serving: Serving) -> dict:
    """Engine.get_server_info(), taken on the engine thread between two steps."""
    try:
        return dict(await serving.driver.call(serving.engine.get_server_info, serving.config.snapshot_timeout_s))
    except asyncio.TimeoutError:
        raise APIError(503, f"the engine thread did not answer within {serving.config.snapshot_timeout_s} s",
                       code="engine_busy") from None


def _model_card(serving: Serving) -> dict:
    m = serving.model
    return {"id": m.served_model_name, "object": "model", "created": serving.created, "owned_by": "sglang_eagle3",
            "root": m.model_path, "max_model_len": m.context_length}


async def list_models(serving: Serving, request: HTTPRequest):
    return {"object": "list", "data": [_model_card(serving)]}


async def get_model(serving: Serving, request: HTTPRequest):
    serving.check_model(request.path_params["model_id"])
    return _model_card(serving)
