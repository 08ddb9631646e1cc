"""A Ctrl-C (KeyboardInterrupt) anywhere in admission or prefill: once Engine.generate's abort path has run, every
KV page is back in the pool exactly once, nothing is left queued, and the engine's next outputs are a fresh engine's.
A request of another caller admitted by the interrupted step is put back in the queue and still served right. A
second Ctrl-C in the abort path (an abort's page moves, generate's aborts) loses nothing: those run as critical
sections (runtime/interrupts.py), tested here too.
"""

from __future__ import annotations

import signal
import threading

import pytest
from conftest import scheduler_of, small_config, small_draft_config

from sglang_eagle3 import Engine
from sglang_eagle3.runtime.interrupts import defer_interrupt
from sglang_eagle3.runtime.scheduler import Scheduler

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[3, 1, 4, 1, 5, 9, 2], [6, 5, 3], [5, 8, 9, 7, 9, 3, 2, 3, 8, 4]]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def pair(make_pair):
    cfg = small_config()
    return make_pair(cfg, small_draft_config(cfg), seed=5, scale=3.0)


def _engine(pair) -> Engine:
    # page_size 4: every prompt spans several pages, so a leak or a double free shows in the count.
    return Engine(model_path=pair.target, speculative_algorithm="EAGLE3", speculative_draft_model_path=pair.draft,
                  speculative_num_steps=2, device="cpu", dtype="float32", skip_tokenizer_init=True, page_size=4)


@pytest.fixture(scope="module")
def reference(pair):
    eng = _engine(pair)
    try:
        return [o["output_ids"] for o in eng.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
    finally:
        eng.shutdown()


@pytest.fixture
def engine(pair):  # one a test: a case that fails leaves nothing behind for the next
    eng = _engine(pair)
    yield eng
    eng.shutdown()


def _interrupt_on_call(monkeypatch, owner, name: str, n: int, after: bool) -> None:
    """Replaces ``owner.name`` with a wrapper whose n-th call raises KeyboardInterrupt, before the real call or,
    with ``after``, once the real call has returned (its effects done, its caller not yet past it)."""
    real = getattr(owner, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        if calls[0] == n and not after:
            raise KeyboardInterrupt
        out = real(*args, **kwargs)
        if calls[0] == n:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(owner, name, wrapper)


def _assert_pool_whole(engine: Engine) -> None:
    alloc, sched = engine.runner.allocator, scheduler_of(engine)
    assert not sched.waiting and not sched.running, (list(sched.waiting), sched.running)
    assert len(set(alloc._free)) == len(alloc._free), f"a page freed twice: free list {sorted(alloc._free)}"
    assert alloc.num_free == alloc.num_pages - 1, f"{alloc.num_pages - 1 - alloc.num_free} KV page(s) leaked"


# (object, method, call that raises, after the real call): the points of admission and prefill. The three prompts
# are admitted in one step: _ensure_pages / alloc calls 1-3 are theirs.
POINTS = {
    "ensure_pages 1, before": ("sched", "_ensure_pages", 1, False),
    "ensure_pages 2, after": ("sched", "_ensure_pages", 2, True),
    "ensure_pages 3, after": ("sched", "_ensure_pages", 3, True),
    "alloc 2, before": ("alloc", "alloc", 2, False),
    "alloc 3, after": ("alloc", "alloc", 3, True),
    "popleft of the 2nd": ("waiting", "popleft", 2, False),
    "admit, after": ("sched", "_admit", 1, True),
    "target prefill": ("runner", "prefill", 1, False),
    "draft prefill, after": ("runner", "prefill_draft", 1, True),
    "2nd first token": ("sched", "_emit", 2, False),
}


@pytest.mark.parametrize("point", list(POINTS))
def test_interrupt_in_admission_returns_every_page(engine, reference, monkeypatch, point):
    what, name, n, after = POINTS[point]
    sched = scheduler_of(engine)
    owner = {"sched": sched, "alloc": engine.runner.allocator, "runner": engine.runner}.get(what)
    if what == "waiting":  # a deque's methods cannot be patched: a wrapper stands in for it
        owner = _PatchableDeque(sched.waiting)
        monkeypatch.setattr(sched, "waiting", owner)
    _interrupt_on_call(monkeypatch, owner, name, n, after)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    monkeypatch.undo()
    _assert_pool_whole(engine)
    assert [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)] == reference
    _assert_pool_whole(engine)


@pytest.mark.parametrize("point", ["ensure_pages 2, after", "draft prefill, after", "2nd first token"])
def test_interrupt_in_admission_keeps_another_callers_request(engine, reference, monkeypatch, point):
    """A request queued by another caller (the server's driver does so) and admitted by the interrupted generate's
    step is not aborted by it: it must be back in the waiting queue, and served as if nothing had happened."""
    what, name, n, after = POINTS[point]
    sched = scheduler_of(engine)
    foreign = engine.make_request(input_ids=PROMPTS[0], sampling_params=GREEDY)
    sched.add(foreign)
    owner = {"sched": sched, "runner": engine.runner}[what]
    _interrupt_on_call(monkeypatch, owner, name, n, after)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS[1:], sampling_params=GREEDY)
    monkeypatch.undo()
    assert [r.rid for r in sched.waiting] == [foreign.rid] and not sched.running
    assert not foreign.pages
    while sched.has_work():
        sched.step()
    assert foreign.finished_reason == {"type": "length", "length": GREEDY["max_new_tokens"]}
    assert foreign.output_ids == reference[0]
    _assert_pool_whole(engine)


def test_abort_takes_a_request_out_of_both_queues(engine):
    """An interrupt between _admit's two moves leaves a request listed as running and still waiting: abort must
    take it out of both (found in the waiting queue first, it stayed running, finished and without draft state)."""
    sched: Scheduler = scheduler_of(engine)
    r = engine.make_request(input_ids=PROMPTS[1], sampling_params=GREEDY)
    sched.add(r)
    sched.running.append(r)
    assert sched.abort(r.rid)
    assert not sched.waiting and not sched.running
    _assert_pool_whole(engine)


def test_defer_interrupt_delivers_after_the_section():
    """A SIGINT inside the section lets the body finish, then raises KeyboardInterrupt; the handler is put back."""
    before = signal.getsignal(signal.SIGINT)
    done = []
    with pytest.raises(KeyboardInterrupt):
        with defer_interrupt():
            signal.raise_signal(signal.SIGINT)
            done.append("body")
    assert done == ["body"]
    assert signal.getsignal(signal.SIGINT) is before
    with defer_interrupt():  # no signal: nothing raised
        pass


def test_defer_interrupt_nested_hands_the_signal_out():
    """An inner section's signal waits for the outer section's end, not the inner's."""
    done = []
    with pytest.raises(KeyboardInterrupt):
        with defer_interrupt():
            with defer_interrupt():
                signal.raise_signal(signal.SIGINT)
            done.append("outer body")
    assert done == ["outer body"]


def test_defer_interrupt_off_the_main_thread_is_a_no_op():
    """signal.signal works on the main thread only (and only there does a KeyboardInterrupt land)."""
    errors = []

    def run():
        try:
            with defer_interrupt():
                pass
        except BaseException as e:  # noqa: BLE001 - any failure is the test's
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors


def test_interrupt_inside_an_abort_frees_the_pages(engine, monkeypatch):
    """A Ctrl-C between _release's two moves (the pages taken off the request, not yet on the free list): abort
    runs outside a step, where no reclaim follows, so the pages would be lost for good."""
    sched = scheduler_of(engine)
    r = engine.make_request(input_ids=PROMPTS[2], sampling_params=GREEDY)
    sched.add(r)
    sched.step()  # its prefill: it holds pages now
    assert r.pages
    alloc = engine.runner.allocator
    real = alloc.free

    def free(pages):
        signal.raise_signal(signal.SIGINT)
        real(pages)

    monkeypatch.setattr(alloc, "free", free)
    with pytest.raises(KeyboardInterrupt):
        sched.abort(r.rid)
    monkeypatch.undo()
    _assert_pool_whole(engine)


def test_second_interrupt_in_generates_abort_path(engine, reference, monkeypatch):
    """A second Ctrl-C while generate aborts its requests after the first: every one is still aborted (one skipped
    would stay queued, holding its pages, and be decoded to its end for no one)."""
    sched = scheduler_of(engine)
    _interrupt_on_call(monkeypatch, sched, "_step", 2, after=True)  # a decode round: every request holds pages
    real, aborts = sched.abort, []

    def abort(rid):
        aborts.append(rid)
        if len(aborts) == 1:
            signal.raise_signal(signal.SIGINT)
        return real(rid)

    monkeypatch.setattr(sched, "abort", abort)
    with pytest.raises(KeyboardInterrupt):
        engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
    monkeypatch.undo()
    assert len(aborts) == len(PROMPTS)
    _assert_pool_whole(engine)
    assert [o["output_ids"] for o in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)] == reference


class _PatchableDeque:
    """A deque whose methods a test can replace: forwards everything to the one it wraps."""

    def __init__(self, q):
        self._q = q

    def popleft(self):
        return self._q.popleft()

    def __getattr__(self, name):
        return getattr(self._q, name)

    def __len__(self):
        return len(self._q)

    def __bool__(self):
        return bool(self._q)

    def __iter__(self):
        return iter(self._q)

    def __getitem__(self, i):
        return self._q[i]

    def __delitem__(self, i):
        del self._q[i]
