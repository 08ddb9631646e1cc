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
    # When set, every endpoint but /health needs ``Authorization: Bearer <api_key>``.
    api_key: str | None = None
    # Seconds /get_server_info and /metrics wait for the engine thread before answering 503.
    snapshot_timeout_s: float = 10.0

    def __post_init__(self):
        if not isinstance(self.port, int) or not 0 <= self.port < 65536:
            raise ServerConfigError(f"port={self.port!r} must be an integer in [0, 65535]")
        if self.max_queued_requests is not None and self.max_queued_requests < 0:
            raise ServerConfigError(f"max_queued_requests={self.max_queued_requests} must be >= 0 (or None)")
        if not self.served_model_name:
            raise ServerConfigError("served_model_name must not be empty")
        if self.snapshot_timeout_s <= 0:
            raise ServerConfigError(f"snapshot_timeout_s={self.snapshot_timeout_s} must be > 0")
