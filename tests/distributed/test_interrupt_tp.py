"""A Ctrl-C in an engine with worker processes (TP=2 on CPU, gloo): whether it lands while the engine waits for a
command's replies or while it sends the command, the engine's later calls read their own replies (not the
interrupted command's), every rank's pages come back through the abort path, and later outputs are a fresh
engine's. A SIGINT reaching the workers themselves (a terminal's Ctrl-C signals the whole process group) does not
stop them. A request of another caller whose end was in a reply no one read still reaches that caller."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.testing import tiny_config, tiny_draft_config, write_tiny_pair

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")

PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4]]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    cfg = tiny_config(vocab=96, hidden=32, heads=2, layers=3, q_lora=16, kv_lora=16, nope=8, rope=4, v=8, experts=4,
                      top_k=2, n_group=2, topk_group=1, moe_inter=16, inter=48, max_pos=256)
    dcfg = tiny_draft_config(cfg, heads=2, kv_heads=2, inter=48, aux_ids=[0, 1, 2])
    return write_tiny_pair(str(tmp_path_factory.mktemp("tpint")), cfg, dcfg, seed=7, scale=3.0)


def _engine(pair, tp: int) -> Engine:
    tpath, dpath = pair
    # page_size 4: every prompt spans several pages, so pages left held show in the count.
    return Engine(model_path=tpath, speculative_algorithm="EAGLE3", speculative_draft_model_path=dpath,
                  speculative_num_steps=2, device="cpu", skip_tokenizer_init=True, page_size=4, tp_size=tp,
                  use_worker_processes=tp > 1, worker_timeout=60)


@pytest.fixture(scope="module")
def reference(pair):
    eng = _engine(pair, 1)
    try:
        return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def engine(pair):
    # One for the module (starting two workers takes seconds): each test leaves it idle and checked, or fails.
    eng = _engine(pair, 2)
    yield eng
    eng.shutdown()


def _assert_every_rank_idle(engine: Engine) -> None:
    info = engine.get_server_info()
    assert len(info["tp_ranks"]) == 2
    for rank, r in enumerate(info["tp_ranks"]):
        assert r["running_requests"] == r["waiting_requests"] == 0, (rank, r)
        held = info["kv_pages_total"] - r["kv_pages_free"]
        assert held == 0, f"rank {rank}: {held} KV page(s) still held"
    assert not engine.scheduler.has_work()


def _check_serves(engine: Engine, reference) -> None:
    for _ in range(2):  # twice: a reply left over from the interrupted call would shift every later one
        assert [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)] == reference
        _assert_every_rank_idle(engine)


@pytest.mark.parametrize("what,n", [("add", 2), ("step", 1), ("step", 3)])
def test_interrupt_while_waiting_for_replies(engine, reference, monkeypatch, what, n):
    """The n-th wait for a ``what`` command's replies is interrupted once the command was sent to every rank (the
    prefill step, a decode round, the second request's add): its replies, read by no one, must not be taken for
    the next command's."""
    group = engine.backend
    real, calls = group._gather, [0]

    def gather(name, *args, **kwargs):
        if name == what:
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt
        return real(name, *args, **kwargs)

    monkeypatch.setattr(group, "_gather", gather)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    monkeypatch.undo()
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)


@pytest.mark.parametrize("after", [False, True])
def test_interrupt_while_sending_a_step(engine, reference, monkeypatch, after):
    """A Ctrl-C lands while the second step command is sent to rank 1, before the message left or once it had: rank
    0 has it either way, so rank 1 must get it too (exactly once), or rank 0 waits in a collective for it."""
    conn = engine.backend.conns[1]
    real, steps = conn.send, [0]

    def send(msg):
        if msg[1] == "step":
            steps[0] += 1
            if steps[0] == 2:
                if after:
                    real(msg)
                signal.raise_signal(signal.SIGINT)
                if after:
                    return
        real(msg)

    monkeypatch.setattr(conn, "send", send)
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    monkeypatch.undo()
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)
    assert time.monotonic() - t0 < 30, "a rank waited for a command it never got"


@pytest.mark.parametrize("rank", [0, 1])
def test_interrupt_between_the_pieces_of_a_large_command(engine, reference, monkeypatch, rank):
    """An add larger than a pipe's buffer is written in pieces; a Ctrl-C between two of them must not leave a
    fragment in the pipe (the worker would read the next command's bytes as the rest of it). The long rid only
    makes the message large, as a long prompt's would be."""
    conn = engine.backend.conns[rank]
    real, cut = conn._send, []

    def write_in_two(buf):
        if len(buf) > 64 << 10 and not cut:
            cut.append(len(buf))
            real(buf[:4096])
            signal.raise_signal(signal.SIGINT)  # as if it came while the writer waited for room in the pipe
            buf = buf[4096:]
        real(buf)

    monkeypatch.setattr(conn, "_send", write_in_two)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS[0], sampling_params=GREEDY, rid="r" * (100 << 10))
    monkeypatch.undo()
    assert cut, "no message was large enough to be cut"
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)


def _finish_of_another_caller(engine, monkeypatch, n_tokens: int):
    """Queues a request as another caller would (the server's driver), then interrupts a generate right after
    reading the step reply in which that request finished: the reply is dropped, as one no one waited for is."""
    group = engine.backend
    params = dict(GREEDY, max_new_tokens=n_tokens)
    foreign = engine.make_request(input_ids=PROMPTS[0], sampling_params=params)
    group.add(foreign)
    real = group._gather

    def gather(name, *args, **kwargs):
        out = real(name, *args, **kwargs)
        if name == "step" and any(r.rid == foreign.rid and r.finished for r in out[0]):
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(group, "_gather", gather)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS[1:], sampling_params=GREEDY)
    monkeypatch.undo()
    return foreign


def _drain(engine) -> dict:
    """Steps while the group has work; returns the finished requests by id."""
    done = {}
    for _ in range(100):
        if not engine.scheduler.has_work():
            return done
        done.update((r.rid, r) for r in engine.scheduler.step() if r.finished)
    raise AssertionError(f"has_work() still true after 100 steps (pending {sorted(engine.backend._pending)})")


def test_a_finish_in_an_unread_reply_still_reaches_its_caller(engine, reference, monkeypatch):
    """Another caller's request finished in the step whose reply the interrupted generate never read: the next
    step returns it finished, with its tokens, and has_work() turns false."""
    n = 3  # ends before the generate's own requests (8 tokens)
    foreign = _finish_of_another_caller(engine, monkeypatch, n)
    done = _drain(engine)
    assert list(done) == [foreign.rid]
    assert done[foreign.rid].finished_reason == {"type": "length", "length": n}
    assert done[foreign.rid].output_ids == reference[0][:n]
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)


def test_an_add_cut_short_before_sending_ends_aborted(engine, reference, monkeypatch):
    """An add interrupted before any worker got it leaves an id only the engine knows: the next step ends it with
    an abort reason (its caller hears of it) instead of waiting on it for ever."""
    group = engine.backend
    real = group._send_all

    def send_all(seq, cmd, payload):
        if cmd == "add":
            raise KeyboardInterrupt
        real(seq, cmd, payload)

    lost = engine.make_request(input_ids=PROMPTS[1], sampling_params=GREEDY)
    monkeypatch.setattr(group, "_send_all", send_all)
    with pytest.raises(KeyboardInterrupt):
        group.add(lost)
    monkeypatch.undo()
    done = _drain(engine)
    assert list(done) == [lost.rid] and done[lost.rid].finished_reason["type"] == "abort"
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)


def test_an_abort_cut_short_before_sending_is_made(engine, reference, monkeypatch):
    """An abort interrupted before any worker got it: the workers would decode the request for no one, holding its
    pages; the next step aborts it on every rank."""
    group = engine.backend
    r = engine.make_request(input_ids=PROMPTS[2], sampling_params=GREEDY)
    group.add(r)
    real = group._send_all

    def send_all(seq, cmd, payload):
        if cmd == "abort":
            raise KeyboardInterrupt
        real(seq, cmd, payload)

    monkeypatch.setattr(group, "_send_all", send_all)
    with pytest.raises(KeyboardInterrupt):
        group.abort(r.rid)
    monkeypatch.undo()
    assert _drain(engine) == {}
    _assert_every_rank_idle(engine)
    _check_serves(engine, reference)


def test_sigint_reaching_the_workers(engine, reference):
    """A terminal's Ctrl-C signals the workers too: they go on (the engine process decides what an interrupt does)."""
    for p in engine.backend.procs:
        os.kill(p.pid, signal.SIGINT)
    time.sleep(0.5)  # a worker that took it as a KeyboardInterrupt has exited by now
    assert all(p.is_alive() for p in engine.backend.procs)
    _check_serves(engine, reference)
