"""A tiny random target + EAGLE-3 draft with a real byte-level BPE tokenizer, and a server subprocess on it.

The server runs ``python -m sglang_eagle3.launch_server`` on CPU at a free port; fixtures wait for /health
with a bounded timeout and always kill the process (its log is printed when a test fails to start it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import pytest

from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

STARTUP_TIMEOUT_S = 60.0
CONTEXT = 256  # max_position_embeddings of the tiny pair
_CORPUS = ("The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
           "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. ") * 4


@dataclass(frozen=True)
class TinyModel:
    target: str
    draft: str
    vocab_size: int


def write_tokenizer(path: str, vocab_size: int = 300) -> int:
    """A byte-level BPE trained on a pangram corpus (every byte is a token, so any text encodes)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=1, special_tokens=["<|bos|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_CORPUS], trainer)
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    return tok.get_vocab_size()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> TinyModel:
    root = str(tmp_path_factory.mktemp("server_model"))
    tok_dir = os.path.join(root, "tok")
    vocab = write_tokenizer(tok_dir)
    # No EOS: outputs run to max_tokens, so lengths are deterministic. scale=4 keeps greedy argmax far from ties.
    cfg = tiny_config(vocab=vocab, hidden=32, layers=3, heads=2, q_lora=16, kv_lora=16, nope=8, rope=4, v=8,
                      experts=4, top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=CONTEXT)
    target, draft = write_tiny_pair(root, cfg, tiny_draft_config(cfg, heads=2, kv_heads=1, inter=48), seed=3,
                                    scale=4.0)
    os.replace(os.path.join(tok_dir, "tokenizer.json"), os.path.join(target, "tokenizer.json"))
    return TinyModel(target, draft, vocab)


@contextlib.contextmanager
def spec_engine(tiny_model: TinyModel, **kwargs):
    """An EAGLE-3 Engine (k = 3) over the tiny pair on the CPU, shut down on exit; the process runs on one intra-op
    thread meanwhile (a tiny model: OpenMP spin-waits only hurt on a shared 2-core box). For module fixtures."""
    import torch

    from sglang_eagle3.engine import Engine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = Engine(model_path=tiny_model.target, speculative_algorithm="EAGLE3",
                 speculative_draft_model_path=tiny_model.draft, speculative_num_steps=3, device="cpu", **kwargs)
    try:
        yield eng
    finally:
        eng.shutdown()
        torch.set_num_threads(threads)


@contextlib.contextmanager
def served_app(engine, **config):
    """An in-process ASGI app over ``engine`` (ServerConfig fields in ``config``) with its own EngineDriver, stopped
    on exit. One at a time an engine: two drivers would both step its scheduler."""
    from sglang_eagle3.server import EngineDriver, ServerConfig, create_app

    driver = EngineDriver(engine, max_inflight=8)
    app = create_app(engine, driver, ServerConfig(**config))
    driver.start()
    try:
        yield app
    finally:
        driver.stop()


def asgi_post(app, path: str, body: dict) -> httpx.Response:
    """POST ``body`` as JSON to the ASGI ``app``, in-process."""
    import asyncio

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=60) as c:
            return await c.post(path, json=body)

    return asyncio.run(go())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, args: list[str], log_path: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = open(log_path, "w")
        cmd = [sys.executable, "-m", "sglang_eagle3.launch_server", "--port", str(self.port), *args]
        # One intra-op thread: the model is tiny, and OpenMP spin-waits make a shared 2-core CI box crawl.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env)

    def log(self) -> str:
        with open(self.log_path) as f:
            return f.read()

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy after {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def model_args(m: TinyModel) -> list[str]:
    return ["--model-path", m.target, "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", m.draft,
            "--speculative-num-steps", "3", "--device", "cpu", "--log-level", "info"]


@contextlib.contextmanager
def running_server(m: TinyModel, tmp_dir: str, *extra: str):
    srv = ServerProcess([*model_args(m), *extra], os.path.join(tmp_dir, f"server_{free_port()}.log"))
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def server(tiny_model, tmp_path_factory):
    with running_server(tiny_model, str(tmp_path_factory.mktemp("server_logs")), "--max-running-requests", "16",
                        "--served-model-name", "tiny") as srv:
        yield srv


def random_words(rng: random.Random, n: int) -> str:
    """n words of the tokenizer's corpus, drawn by ``rng``."""
    words = _CORPUS.split()
    return " ".join(rng.choice(words) for _ in range(n))


def post_chat(url: str, body: dict, model: str = "tiny") -> dict:
    """A /v1/chat/completions answer from the server at ``url`` (200 asserted): the reference the translated
    endpoints (Anthropic's Messages, OpenAI's Responses) are checked against."""
    r = httpx.post(url + "/v1/chat/completions", json={"model": model, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def named_sse_events(text: str) -> list[tuple[str, dict]]:
    """An SSE text of named events (Anthropic's, the Responses API's) as (event name, payload): each frame an
    ``event:`` line and a ``data:`` line, the name its payload's type."""
    out = []
    for frame in text.strip().split("\n\n"):
        lines = frame.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), frame
        name, payload = lines[0][len("event: "):], json.loads(lines[1][len("data: "):])
        assert payload["type"] == name, frame
        out.append((name, payload))
    return out
