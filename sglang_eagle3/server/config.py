"""HTTP-side settings (the engine's live in ``EngineArgs``)."""

from __future__ import annotations

from dataclasses import dataclass


class ServerConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 30000
    # The name /v1/models lists and the OpenAI endpoints accept in ``model`` ("default" is always accepted too).
    served_model_name: str = "default"
    # Requests allowed to wait beyond max_running_requests; one more is answered 503. None: unbounded.
    max_queued_requests: int | None = 4096
    # When set, every endpoint but /health, /health_generate and /metrics needs ``Authorization: Bearer <api_key>``
    # (OPTIONS too is let through: a browser's CORS preflight carries no key).
    api_key: str | None = None
    # Seconds /get_server_info and /metrics wait for the engine thread before answering 503.
    snapshot_timeout_s: float = 10.0
    # Largest request body accepted; a larger one is answered 413 before it is read (Content-Length) or as soon
    # as the bytes received pass it. A full 262144-token context is ~2 MB as JSON token ids and a few MB as
    # (escaped) text, so the default leaves room for that several times over.
    max_request_bytes: int = 16 * 1024 * 1024
    # On SIGTERM / Ctrl+C: seconds the requests in flight get to finish; those still running then end with a
    # "shutting down" error (HTTP 503; a stream gets an error event and [DONE]). New requests are refused at once.
    shutdown_grace_s: float = 5.0
    # How /v1/chat/completions reads tool calls out of the model's text for tool_choice "auto" (server/tools.py:
    # "kimi_k2"); None: "auto" is refused, "required" and a named function still work (constrained output).
    tool_call_parser: str | None = None
    # How /v1/chat/completions splits a reasoning model's thinking from its answer (server/reasoning.py:
    # "kimi_k2", "deepseek-r1", "deepseek-v3", "qwen3", "qwen3-thinking", "kimi"); None: the output whole in content.
    reasoning_parser: str | None = None
    # Where a chat request's unset temperature / top_p / top_k / min_p / repetition_penalty come from, as SGLang's
    # --sampling-defaults: "model", generation_config.json's where it writes them (else OpenAI's defaults);
    # "openai", OpenAI's always. /v1/completions and /generate take OpenAI's / SGLang's defaults either way.
    sampling_defaults: str = "model"

    def __post_init__(self):
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ServerConfigError(f"port={self.port!r} must be an integer in [0, 65535]")
        if self.max_queued_requests is not None and (not isinstance(self.max_queued_requests, int)
                                                     or self.max_queued_requests < 0):
            raise ServerConfigError(f"max_queued_requests={self.max_queued_requests!r} must be an integer >= 0 "
                                    "(or None: unbounded)")
        if self.api_key is not None and (not self.api_key or self.api_key != self.api_key.strip()):
            # An empty key (``--api-key "$KEY"`` with KEY unset) turned authentication off without a word: the server
            # the operator meant to protect served everyone. A key with surrounding whitespace could never be sent
            # (the header's token is read stripped): every request would be refused.
            # (the key itself is not echoed: it is a secret, and this goes to the log)
            what = "is empty" if not self.api_key else "has leading or trailing whitespace"
            raise ServerConfigError(f"api_key {what}: give a non-empty key without surrounding whitespace, or leave "
                                    "--api-key out to serve without one")
        if not self.served_model_name:
            raise ServerConfigError("served_model_name must not be empty")
        if isinstance(self.max_request_bytes, bool) or not isinstance(self.max_request_bytes, int) \
                or self.max_request_bytes < 1:
            raise ServerConfigError(f"max_request_bytes={self.max_request_bytes!r} must be an integer >= 1")
        if isinstance(self.shutdown_grace_s, bool) or not isinstance(self.shutdown_grace_s, (int, float)) \
                or not 0 <= self.shutdown_grace_s < float("inf"):
            raise ServerConfigError(f"shutdown_grace_s={self.shutdown_grace_s!r} must be a finite number >= 0")
        from sglang_eagle3.server.tools import TOOL_CALL_PARSERS

        if self.tool_call_parser is not None and self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ServerConfigError(f"tool_call_parser={self.tool_call_parser!r} must be one of "
                                    f"{', '.join(TOOL_CALL_PARSERS)}")
        from sglang_eagle3.server.reasoning import REASONING_PARSERS

        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ServerConfigError(f"reasoning_parser={self.reasoning_parser!r} must be one of "
                                    f"{', '.join(REASONING_PARSERS)}")
        if self.sampling_defaults not in ("model", "openai"):
            raise ServerConfigError(f"sampling_defaults={self.sampling_defaults!r} must be model or openai")
        if self.snapshot_timeout_s <= 0:
            raise ServerConfigError(f"snapshot_timeout_s={self.snapshot_timeout_s} must be > 0")
