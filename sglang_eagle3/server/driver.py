"""The engine driver: ONE background thread owns the engine and runs the scheduler loop.

    HTTP handlers (event loop thread)              engine thread
    ---------------------------------              -------------
    submit(requests) -> Submission   --("add")-->  scheduler.add; step() while there is work;
    Submission.close()               --("abort")-> scheduler.abort (its KV pages come back)
    abort_by_client(rid)   --("abort_by_client")-> the same, answering the output so far (finish_reason abort)
    await driver.call(fn)            --("call")--> fn() between two steps
    await Submission.updates()       <--Update---  after every step: new ids, visible text, result on finish

Requests join and leave the running batch between steps (continuous batching). The event loop thread never
touches the scheduler or the model: it only enqueues commands and awaits its per-submission asyncio queue.
The engine is driven only through ``scheduler.add/abort/step/has_work`` and ``Engine.result`` /
``get_server_info`` / ``tokenizer``, the interface that stays when the scheduler moves into TP workers.

An exception out of ``step()`` fails every request in flight (their consumers get an ``Update`` with
``error`` set, answered as HTTP 500), aborts them so their pages return, and the loop goes on serving.

``begin_shutdown(grace_s)`` (on SIGTERM) refuses new requests at once and, after ``grace_s`` seconds, ends the
ones still in flight with a "shutting down" error (HTTP 503; a stream gets an error event and ``[DONE]``), so
that no client is left with a connection that just stops.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from sglang_eagle3.runtime.request import Request
from sglang_eagle3.runtime.sampling import GRAMMAR_KINDS, short_repr
from sglang_eagle3.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)

# Seconds the idle engine thread sleeps between checks for a stop request (commands wake it at once).
_IDLE_POLL_S = 0.5
# After a failed step, pause this long before stepping again so a persistent fault cannot spin the CPU.
_ERROR_BACKOFF_S = 0.05


class QueueFullError(RuntimeError):
    """The server already holds max_running_requests + max_queued_requests requests (HTTP 503)."""


class DriverStoppedError(RuntimeError):
    """The engine thread is not running (shutting down, or it died): HTTP 503."""


class ShuttingDownError(DriverStoppedError):
    """The server is shutting down (SIGTERM): no new requests (HTTP 503)."""


class DuplicateRequestIdError(ValueError):
    """A request id that is already in flight, or given twice in one submission (HTTP 400)."""


class BatchTooLargeError(ValueError):
    """A submission of more requests than may ever be in flight at once: waiting cannot help (HTTP 400)."""


SHUTDOWN_MESSAGE = "the server is shutting down"
ABORT_REQUEST_MESSAGE = "aborted by /abort_request"


@dataclass
class Update:
    """One change of one request, as its consumer sees it."""

    index: int  # position of the request in its submission
    new_ids: list[int]  # output token ids since the previous update
    text: str  # visible text so far: cumulative, never shrinks, final (stop-trimmed) once finished
    finished: bool
    result: dict | None = None  # Engine.result(): on finish, and on every update of a full_results submission
    error: str | None = None  # the engine failed this request (HTTP 500); finished is True too
    shutdown: bool = False  # the error is the server shutting down under the request (HTTP 503), not a fault
    # A request with return_logprob: its Engine.result rows for new_ids ([logprob, id, None] each) and their top
    # lists (None without top_logprobs_num), and on its first update the prompt's rows from logprob_start_len
    # (input_token_logprobs, input_top_logprobs), so that a stream can send each token's logprobs with its text.
    new_logprobs: list | None = None
    new_top_logprobs: list | None = None
    prompt_logprobs: tuple[list, list] | None = None

    def failure(self) -> EngineFailure:
        """The exception a consumer raises for an error update."""
        if self.shutdown:
            return EngineFailure(self.error or SHUTDOWN_MESSAGE, status=503, code="server_shutting_down")
        return EngineFailure(self.error or "engine error")


@dataclass
class _Tracked:
    """Engine-thread state of one request."""

    req: Request
    submission: Submission
    index: int
    hold_chars: int  # characters held back while a stop string may be forming (longest stop - 1)
    full_results: bool
    t_arrive: float = 0.0  # perf_counter when the request reached its HTTP handler (else its submission)
    t_first: float | None = None
    t_last: float = 0.0  # perf_counter of its latest new tokens
    n_sent: int = 0
    verify_ct: int = 0  # its verify rounds as of its latest update
    drafts_accepted: int = 0  # its draft tokens its verifies accepted, and were proposed, as of its latest update
    drafts_proposed: int = 0
    # Observations labelled is_streaming, waiting for the consumer to say whether it streams (Submission.streaming).
    unlabelled: list[Callable[[str], None]] = field(default_factory=list)
    published: bool = False  # an update of this request has been pushed
    # The request as its latest update read it (with TP workers, step() hands back copies: ``req`` stays as sent)
    latest: Request | None = None
    text: str = ""  # visible text sent so far
    # Incremental detokenisation: decoded = text of output_ids[:read_offset]; only a short window
    # output_ids[prefix_offset:] is decoded per step (the full output is decoded once, at the end).
    decoded: str = ""
    prefix_offset: int = 0
    read_offset: int = 0


class Submission:
    """The consumer's handle on the requests of one HTTP call (n prompts -> n requests, one queue)."""

    def __init__(self, driver: EngineDriver, requests: list[Request], loop: asyncio.AbstractEventLoop,
                 streaming: bool | None = None):
        self.driver = driver
        self.requests = requests
        self.rids = [r.rid for r in requests]
        self.loop = loop
        # Whether the client streams the answer (SGLang's is_streaming metric label); None until the caller says
        # so (Serving.stream / Serving.wait, before either reads an update): the engine thread holds the labelled
        # observations of its requests back till then, or till they end (then "false").
        self.streaming = streaming
        self.queue: asyncio.Queue[Update] = asyncio.Queue()
        self.finals: list[Update | None] = [None] * len(requests)
        self._closed = False

    @property
    def done(self) -> bool:
        return all(f is not None for f in self.finals)

    async def updates(self) -> AsyncIterator[Update]:
        """Every update until all requests have finished. An error update ends the iteration (the other
        requests of the submission are aborted)."""
        while not self.done:
            u = await self.queue.get()
            if u.finished:
                self.finals[u.index] = u
            if u.error is not None:
                self.close()  # before yielding: a consumer that raises on the error never resumes us
                yield u
                return
            yield u

    async def results(self) -> list[Update]:
        """The final update of every request (raises EngineFailure when the engine failed one)."""
        async for u in self.updates():
            if u.error is not None:
                raise u.failure()
        return list(self.finals)  # type: ignore[arg-type]

    def close(self) -> None:
        """Aborts whatever has not finished (the client went away). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for rid, final in zip(self.rids, self.finals, strict=True):
            if final is None:
                self.driver.abort(rid, self)

    def _push(self, u: Update) -> None:  # engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, u)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class EngineFailure(RuntimeError):
    """The engine raised while running this request (HTTP 500), or the server shut down under it (503)."""

    def __init__(self, message: str, status: int = 500, code: str = "engine_error"):
        super().__init__(message)
        self.status, self.code = status, code


class EngineDriver:
    def __init__(self, engine, metrics: ServerMetrics | None = None, *, max_inflight: int | None = None):
        self.engine = engine
        self.scheduler = engine.scheduler
        self.tokenizer = engine.tokenizer
        self.metrics = metrics or ServerMetrics()
        self.max_inflight = max_inflight
        self._cmds: queue.SimpleQueue = queue.SimpleQueue()
        self._tracked: dict[str, _Tracked] = {}  # engine thread only
        self._lock = threading.Lock()  # guards _inflight_rids (both threads)
        self._inflight_rids: set[str] = set()
        self._stopping = False
        self._shutdown_at: float | None = None  # time.monotonic() after which requests in flight are ended
        self._shutdown_grace_s = 0.0
        # The engine's scheduler cannot serve again (its TP workers are gone: a backend's ``failure``): new requests
        # are refused and /health answers 503, so that a supervisor restarts the server.
        self.broken: str | None = None
        self._thread = threading.Thread(target=self._run, name="engine-driver", daemon=True)
        self.started_at = time.time()

    # -- lifecycle (any thread) -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._cmds.put(("wake",))
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.warning("engine thread did not stop within %.1f s", timeout)

    def begin_shutdown(self, grace_s: float) -> None:
        """Refuses new requests from now on (/health answers 503) and, ``grace_s`` seconds from now, ends those
        still in flight with a "shutting down" error. Any thread (a signal handler too); idempotent."""
        # NOTE: no logging here: a signal handler may interrupt a write to the log stream.
        if self._shutdown_at is None:
            self._shutdown_grace_s = grace_s
            self._shutdown_at = time.monotonic() + grace_s
            self._cmds.put(("wake",))  # SimpleQueue.put is reentrant: safe in a signal handler

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    @property
    def accepting(self) -> bool:
        """Alive, not shutting down and not broken: new requests are taken."""
        return self.alive and self._shutdown_at is None and self.broken is None

    @property
    def inflight(self) -> int:
        return len(self._inflight_rids)

    # -- event loop side --------------------------------------------------------------------------------
    def submit(self, requests: list[Request], *, full_results: bool = False, stream: bool | None = None,
               received_at: float | None = None) -> Submission:
        """Queues requests (all or none). ``stream``: whether the client streams the answer (None: not known yet,
        Submission.streaming); ``received_at``: perf_counter when the HTTP request arrived (the start of its
        latency metrics; now without it). Raises QueueFullError, DriverStoppedError, DuplicateRequestIdError,
        BatchTooLargeError."""
        t_arrive = time.perf_counter() if received_at is None else received_at
        if not self.alive:
            raise DriverStoppedError("the engine thread is not running")
        if self._shutdown_at is not None:
            raise ShuttingDownError(SHUTDOWN_MESSAGE)
        if self.broken is not None:
            raise DriverStoppedError(f"the engine cannot serve requests any more: {self.broken.splitlines()[0]} "
                                     "(restart the server)")
        rids = [r.rid for r in requests]
        seen: set[str] = set()
        twice = [rid for rid in rids if rid in seen or seen.add(rid)]
        if twice:
            raise DuplicateRequestIdError(f"duplicate rid {short_repr(twice[0])} within the batch")
        if self.max_inflight is not None and len(rids) > self.max_inflight:
            raise BatchTooLargeError(f"a batch of {len(rids)} requests can never be admitted: at most "
                                     f"{self.max_inflight} may be in flight (max_running_requests + "
                                     "max_queued_requests)")
        with self._lock:
            dup = [rid for rid in rids if rid in self._inflight_rids]
            if dup:
                raise DuplicateRequestIdError(f"request id {short_repr(dup[0])} is already in flight")
            if self.max_inflight is not None and len(self._inflight_rids) + len(rids) > self.max_inflight:
                raise QueueFullError(f"the server is full: {len(self._inflight_rids)} requests in flight, "
                                     f"limit {self.max_inflight} (max_running_requests + max_queued_requests)")
            self._inflight_rids.update(rids)
        sub = Submission(self, requests, asyncio.get_running_loop(), stream)
        for i, r in enumerate(requests):
            # The longest text a stop string or stop_regex may match, less one: its start is never shown before it
            # completes (a regex of unbounded length: its sampling.STOP_REGEX_REACH).
            hold = max([len(s) for s in r.params.stop] + r.params.stop_regex_widths, default=1) - 1
            self._cmds.put(("add", _Tracked(r, sub, i, hold, full_results, t_arrive=t_arrive)))
        return sub

    def abort(self, rid: str, submission: Submission | None = None) -> None:
        """Aborts request ``rid`` (only if it still belongs to ``submission``, when given)."""
        self._cmds.put(("abort", rid, submission))

    def abort_by_client(self, rid: str, abort_all: bool = False) -> None:
        """SGLang's /abort_request: ends every request in flight whose rid starts with ``rid`` (so ``rid`` also
        reaches the ``<rid>_<i>`` requests of its batch or its n samples, as SGLang's scheduler matches), or every
        request with ``abort_all``. Each answers what it generated so far with finish_reason ``abort``."""
        self._cmds.put(("abort_by_client", rid, abort_all))

    async def call(self, fn: Callable[[], object], timeout: float) -> object:
        """Runs fn() on the engine thread between two steps; raises TimeoutError after ``timeout`` s."""
        if not self.alive:
            raise DriverStoppedError("the engine thread is not running")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._cmds.put(("call", fn, fut, loop))
        return await asyncio.wait_for(fut, timeout)

    # -- engine thread ----------------------------------------------------------------------------------
    def _run(self) -> None:
        logger.info("engine thread started")
        shutdown_seen = False
        try:
            while not self._stopping:
                self._drain(block=not self.scheduler.has_work())
                if self._shutdown_at is not None:
                    if not shutdown_seen:
                        shutdown_seen = True
                        logger.info("shutting down: new requests refused; %d in flight get %.1f s to finish",
                                    len(self._tracked), self._shutdown_grace_s)
                    if self._tracked and time.monotonic() >= self._shutdown_at:
                        logger.warning("shutting down: ending %d request(s) still in flight", len(self._tracked))
                        self._fail_all(SHUTDOWN_MESSAGE, shutdown=True)
                if self._stopping or not self.scheduler.has_work():
                    continue
                self._step()
        except BaseException:  # a bug in the driver itself: say so loudly; /health turns 503
            logger.exception("engine thread died")
            raise
        finally:
            self._fail_all(SHUTDOWN_MESSAGE if self._stopping else "the engine thread died", queued_too=True,
                           shutdown=self._stopping)
            logger.info("engine thread stopped")

    def _note_broken(self) -> bool:
        """After an engine error: whether the scheduler can never serve again (its ``failure``), noted once."""
        failure = self.scheduler.failure
        if failure is not None and self.broken is None:
            self.broken = failure
            logger.error("the engine cannot serve requests any more (%s): new requests are refused with 503 and "
                         "/health answers 503; restart the server", failure.splitlines()[0])
        return self.broken is not None

    def _drain(self, block: bool) -> None:
        try:
            cmd = self._cmds.get(timeout=_IDLE_POLL_S) if block else self._cmds.get_nowait()
        except queue.Empty:
            return
        while True:
            try:
                self._handle(cmd)
            except Exception:
                logger.exception("engine thread: command %s failed", cmd[0])
            try:
                cmd = self._cmds.get_nowait()
            except queue.Empty:
                return

    def _handle(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            t: _Tracked = cmd[1]
            self._tracked[t.req.rid] = t
            try:
                self.scheduler.add(t.req)
            except Exception as e:
                logger.exception("scheduler.add failed for request %s", t.req.rid)
                self._finish(t, Update(t.index, [], t.text, True, error=f"engine error: {type(e).__name__}: {e}"),
                             "failed")
                self._note_broken()
                return
            n_prompt = len(t.req.input_ids)
            self._labelled(t, lambda s: self.metrics.prompt_tokens.inc(n_prompt, is_streaming=s))
        elif kind == "abort":
            _, rid, sub = cmd
            t = self._tracked.get(rid)
            # NOTE: a submission closes after its request finished when its final update was still unread (the
            # client left just then); by now a new request (a retry) may carry the same client-chosen rid.
            if t is None or (sub is not None and t.submission is not sub):  # finished, or never added
                return
            del self._tracked[rid]
            self._release(t.req.rid)
            self.metrics.aborted.inc()
            self._ended(t, "aborted")
            self.scheduler.abort(t.req.rid)  # its KV pages return to the pool here
            logger.info("request %s aborted after %d output tokens", t.req.rid, t.n_sent)
        elif kind == "abort_by_client":
            _, prefix, everything = cmd
            for t in [t for rid, t in self._tracked.items() if everything or rid.startswith(prefix)]:
                self._end_aborted(t)
        elif kind == "call":
            _, fn, fut, loop = cmd
            try:
                res, exc = fn(), None
            except Exception as e:
                res, exc = None, e
            try:
                loop.call_soon_threadsafe(_settle, fut, res, exc)
            except RuntimeError:  # the event loop is closed
                pass

    def _step(self) -> None:
        t0 = time.perf_counter()
        try:
            changed = self.scheduler.step()
        except Exception as e:
            logger.exception("engine step failed: failing %d request(s) in flight", len(self._tracked))
            self.metrics.engine_errors.inc()
            self._fail_all(f"engine error: {type(e).__name__}: {e}")
            if not self._note_broken():
                time.sleep(_ERROR_BACKOFF_S)
            return
        seconds = time.perf_counter() - t0
        if not changed:
            self.metrics.note_step(seconds, decode=False)  # (busy all the same: a round launched, none read yet)
            return
        # A prefill step produces the first token of requests that had none; a decode round advances the rest.
        prefill = all((t := self._tracked.get(r.rid)) is not None and t.n_sent == 0 for r in changed)
        self.metrics.step_latency.observe(seconds, phase="prefill" if prefill else "decode")
        tokens = rounds = round_tokens = seq_lens = accepted = proposed = 0  # of this step (SGLang's windowed gauges)
        for r in changed:
            t = self._tracked.get(r.rid)
            if t is None:
                continue
            new, verified = len(r.output_ids) - t.n_sent, max(r.verify_ct - t.verify_ct, 0)
            t.verify_ct = r.verify_ct
            accepted += max(r.accepted_draft_tokens - t.drafts_accepted, 0)
            proposed += max(r.proposed_draft_tokens - t.drafts_proposed, 0)
            t.drafts_accepted, t.drafts_proposed = r.accepted_draft_tokens, r.proposed_draft_tokens
            if not t.published and r.queue_time is not None:  # its first update: admitted, so its wait is known
                self.metrics.queue_time.observe(r.queue_time)
            tokens += new
            rounds += verified
            round_tokens += new if verified else 0
            seq_lens += r.seq_len
            try:
                self._publish(t, r)
            except Exception as e:
                logger.exception("publishing request %s failed", r.rid)
                self._finish(t, Update(t.index, [], t.text, True, error=f"server error: {type(e).__name__}: {e}"),
                             "failed")
                self._abort_quietly(r.rid)
        self.metrics.note_step(seconds, decode=not prefill, tokens=tokens, rounds=rounds, round_tokens=round_tokens,
                               seq_lens=seq_lens, drafts_accepted=accepted, drafts_proposed=proposed)

    def _publish(self, t: _Tracked, r: Request) -> None:
        first, sent = not t.published, t.n_sent
        t.published, t.latest = True, r
        new_ids = list(r.output_ids[sent:])
        t.n_sent = len(r.output_ids)
        m = self.metrics
        if new_ids:
            now, n = time.perf_counter(), len(new_ids)
            self._labelled(t, lambda s: m.generation_tokens.inc(n, is_streaming=s))
            if t.t_first is None:
                t.t_first = now
                ttft = now - t.t_arrive
                self._labelled(t, lambda s: m.ttft.observe(ttft, is_streaming=s))
            else:  # SGLang's inter-token latency: the wait since the previous tokens, shared by the new ones
                m.itl.observe_many((now - t.t_last) / n, n, now - t.t_last)
            t.t_last = now
        if r.finished:
            result = _snapshot_result(self.engine.result(r))
            u = Update(t.index, new_ids, result.get("text", ""), True, result)
            if (r.finished_reason or {}).get("type") in ("stop", "length") and t.n_sent > 1:
                tpot = (time.perf_counter() - t.t_first) / (t.n_sent - 1)
                self._labelled(t, lambda s: m.tpot.observe(tpot, is_streaming=s))
            self._finish(t, _with_logprobs(u, r, sent, first), "finished")
            return
        text = self._visible_text(t, r)
        result = None
        if t.full_results:
            result = _snapshot_result(self.engine.result(r))
            if "text" in result:
                result["text"] = text
        t.submission._push(_with_logprobs(Update(t.index, new_ids, text, False, result), r, sent, first))

    def _end_aborted(self, t: _Tracked) -> None:
        """Ends ``t`` as SGLang ends a request named by /abort_request: its KV pages return, and its consumer gets a
        final update with the output so far and finish_reason ``{"type": "abort", ...}`` (an answer, not an error)."""
        r = t.latest or t.req
        self._tracked.pop(r.rid, None)
        self._release(r.rid)
        self._abort_quietly(r.rid)
        r.finished_reason = {"type": "abort", "message": ABORT_REQUEST_MESSAGE}
        result = _snapshot_result(self.engine.result(r))
        sent, first = t.n_sent, not t.published
        new_ids = list(r.output_ids[sent:])
        t.n_sent = len(r.output_ids)
        self.metrics.aborted.inc()
        self._ended(t, "aborted")
        logger.info("request %s aborted by /abort_request after %d output tokens", r.rid, t.n_sent)
        t.submission._push(_with_logprobs(Update(t.index, new_ids, result.get("text", ""), True, result), r, sent,
                                          first))

    def _visible_text(self, t: _Tracked, r: Request) -> str:
        """Cumulative text that is safe to show: never shrinks, holds back a trailing partial UTF-8
        character and the tail where a stop string may still be forming."""
        if self.tokenizer is None:
            return ""
        ids = r.output_ids
        # Decoding the window from prefix_offset twice (with and without the new ids) and taking the
        # difference keeps tokenizers that strip a leading space from a window's first token exact.
        skip = r.params.skip_special_tokens  # as Engine.result decodes the final text
        before = self.tokenizer.decode(ids[t.prefix_offset:t.read_offset], skip_special_tokens=skip)
        after = self.tokenizer.decode(ids[t.prefix_offset:], skip_special_tokens=skip)
        # NOTE: a window that ends inside a multi-byte UTF-8 character decodes to U+FFFD: wait for the rest.
        if len(after) > len(before) and not after.endswith("\ufffd"):
            t.decoded += after[len(before):]
            t.prefix_offset, t.read_offset = t.read_offset, len(ids)
        text = t.decoded[: max(len(t.decoded) - t.hold_chars, 0)] if t.hold_chars else t.decoded
        if len(text) > len(t.text):
            t.text = text
        return t.text

    def _finish(self, t: _Tracked, u: Update, outcome: str) -> None:
        self._tracked.pop(t.req.rid, None)
        self._release(t.req.rid)
        e2e = time.perf_counter() - t.t_arrive
        self._labelled(t, lambda s: self.metrics.e2e.observe(e2e, is_streaming=s))
        self._ended(t, outcome)
        t.submission._push(u)

    def _ended(self, t: _Tracked, outcome: str) -> None:
        """The metrics of a request that left the engine (finished, failed or aborted); its observations still
        waiting for is_streaming go out now."""
        m = self.metrics
        m.prompt_len.observe(len(t.req.input_ids))
        m.uncached_prompt_len.observe(len(t.req.input_ids))  # no prefix cache: every prompt token is computed
        m.generation_len.observe(t.n_sent)
        if any(getattr(t.req.params, kind) for kind in GRAMMAR_KINDS):
            m.so_requests.inc()
        self._labelled(t, lambda s: m.requests.inc(outcome=outcome, is_streaming=s), last=True)

    def _labelled(self, t: _Tracked, observe: Callable[[str], None], last: bool = False) -> None:
        """``observe(is_streaming)`` once the request's consumer has said whether it streams, or at its ``last``
        observation ("false" if it never said)."""
        t.unlabelled.append(observe)
        streaming = t.submission.streaming
        if streaming is None and not last:
            return
        flag = "true" if streaming else "false"
        for f in t.unlabelled:
            f(flag)
        t.unlabelled.clear()

    def _release(self, rid: str) -> None:
        with self._lock:
            self._inflight_rids.discard(rid)

    def _abort_quietly(self, rid: str) -> None:
        try:
            self.scheduler.abort(rid)
        except Exception:
            logger.exception("could not abort request %s", rid)

    def _fail_all(self, message: str, queued_too: bool = False, shutdown: bool = False) -> None:
        """Fails every request in flight (and, when the thread ends, every command still queued)."""
        for t in list(self._tracked.values()):
            self._finish(t, Update(t.index, [], t.text, True, error=message, shutdown=shutdown), "failed")
            self._abort_quietly(t.req.rid)
        if queued_too:
            while True:
                try:
                    cmd = self._cmds.get_nowait()
                except queue.Empty:
                    break
                if cmd[0] == "add":
                    t = cmd[1]
                    self._release(t.req.rid)
                    t.submission._push(Update(t.index, [], "", True, error=message, shutdown=shutdown))
                elif cmd[0] == "call":
                    try:
                        cmd[3].call_soon_threadsafe(_settle, cmd[2], None, DriverStoppedError(message))
                    except RuntimeError:  # the event loop is closed
                        pass


def _settle(fut: asyncio.Future, res, exc) -> None:
    if fut.done():  # the caller timed out
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(res)


def _with_logprobs(u: Update, r: Request, sent: int, first: bool) -> Update:
    """``u`` with the logprob rows of its new tokens (output_ids[sent:]) and, on the first update, the prompt's.
    Slices are copies: the engine thread keeps appending to the request's lists."""
    if r.return_logprob:
        u.new_logprobs = r.output_token_logprobs[sent:]
        u.new_top_logprobs = r.output_top_logprobs[sent:] if r.top_logprobs_num else [None] * len(u.new_ids)
        if first:
            u.prompt_logprobs = (list(r.input_token_logprobs), list(r.input_top_logprobs))
    return u


def _snapshot_result(out: dict) -> dict:
    """Copies the lists Engine.result shares with the live request, so the event loop thread can
    serialise them while the engine thread keeps appending."""
    meta = {k: list(v) if isinstance(v, list) else v for k, v in out.get("meta_info", {}).items()}
    return {**out, "output_ids": list(out.get("output_ids", [])), "meta_info": meta}
