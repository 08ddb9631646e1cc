"""The start-up heartbeat (progress.beat / progress.listening) and where the load beats: a TP worker's start-up bound
counts time without progress, so a load that stopped beating between its shards would be named as a hang however
healthy it was."""

from __future__ import annotations

import threading

from sglang_eagle3 import progress
from sglang_eagle3.models.loader import load_target
from sglang_eagle3.testing import tiny_config, write_tiny_pair


def test_beat_reaches_the_listener_of_its_context_only():
    heard, other = [], []
    progress.beat("nobody listens")  # no listener: nothing happens
    with progress.listening(lambda doing, *a: heard.append(doing % a)):
        progress.beat("shard %d/%d", 1, 3)
        with progress.listening(lambda doing, *a: other.append(doing % a)):
            progress.beat("inner")
        progress.beat("outer again")
        seen_by_thread = []
        t = threading.Thread(target=lambda: seen_by_thread.append(progress._LISTENER.get()))
        t.start()
        t.join()
    progress.beat("after")
    assert heard == ["shard 1/3", "outer again"]
    assert other == ["inner"]
    assert seen_by_thread == [None]  # another thread's work is not this start-up's progress


def test_load_beats_through_every_shard(tmp_path):
    """A checkpoint of several shards beats in each of them (each tensor: a shard of Kimi-K2.5 is ~9 GB)."""
    path, _ = write_tiny_pair(str(tmp_path), tiny_config(), max_shard_bytes=40_000)
    heard: list[str] = []
    with progress.listening(lambda doing, *a: heard.append(doing % a)):
        load_target(path)
    shards = sorted({h for h in heard if h.startswith("loading target: shard ")})
    n = len(shards)
    assert n > 2, heard[:5]
    assert shards == sorted(f"loading target: shard {i}/{n}" for i in range(1, n + 1))
    assert len(heard) > n  # a beat a tensor, not a shard
