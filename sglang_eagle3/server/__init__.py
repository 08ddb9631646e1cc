"""HTTP server over the engine: OpenAI-compatible and SGLang-native endpoints with continuous batching.

    driver = EngineDriver(engine, max_inflight=...)   # the one thread that steps the engine
    app = create_app(engine, driver, ServerConfig())  # FastAPI; run it with uvicorn
    driver.start()

``python -m sglang_eagle3.launch_server`` does all of this from SGLang-style flags (docs/SERVER.md).
"""

from __future__ import annotations

from sglang_eagle3.server.app import create_app
from sglang_eagle3.server.config import ServerConfig
from sglang_eagle3.server.driver import EngineDriver

__all__ = ["EngineDriver", "ServerConfig", "create_app"]
