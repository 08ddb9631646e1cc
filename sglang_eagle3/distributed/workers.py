"""Tensor-parallel worker processes spawned by the engine (no torchrun).

Every rank runs a ModelWorker over its slice; the engine sends each rank the same command stream (add,
abort, step, info, shutdown) through its own pipe, so the ranks step in lockstep and meet in the
collectives inside each forward. Rank 0's replies are the results; other ranks reply with acknowledgements.

Environment hand-off is explicit: a worker's environment is the launcher's ``os.environ`` at spawn time plus
``EngineArgs.worker_env``, applied first thing in the child before torch initialises NCCL; each worker then
reports its effective NCCL/CUDA environment, NCCL version and device (env_report.collect_env_report), the
engine keeps the per-rank reports and warns where ranks disagree.

Commands are numbered: each reply carries its command's number, so a reply the engine stopped waiting for (a
Ctrl-C in the engine process while it waited) is recognised and dropped by the next call instead of being read as
that call's reply. The command itself still runs on every rank (a worker ignores SIGINT: a terminal's Ctrl-C
reaches the whole process group, and the engine, not each worker, decides what an interrupt does), so the ranks
stay in lockstep and the engine's abort path, which follows an interrupt, frees the pages on every rank. A command
is sent to every rank whole before a Ctrl-C is let through (runtime/interrupts.py). A reply no one read may have
held the end of another caller's request: the next step first asks rank 0 what it finished and still holds
("resync"), so that request still reaches its caller.

Failure handling: a worker that raises sends its traceback before exiting; the engine polls every pipe with
a deadline and checks process liveness, so a crash at start-up or mid-run becomes a WorkerError naming the
rank and cause within ``timeout`` seconds, after which every worker is terminated (then killed).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import socket
import time
import traceback
import weakref
from datetime import timedelta

from sglang_eagle3 import env
from sglang_eagle3.runtime.grammar import GrammarBackend
from sglang_eagle3.runtime.interrupts import defer_interrupt

logger = logging.getLogger(__name__)

FAULT_ENV = env.FAULT_INJECT.name  # test hook: "rank=R,at=start" or "rank=R,at=step:N"


class WorkerError(RuntimeError):
    """A TP worker failed; the message names the rank and the cause."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fault(rank: int) -> str | None:
    spec = env.FAULT_INJECT.raw() or ""
    if not spec:
        return None
    kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    return kv.get("at") if int(kv.get("rank", -1)) == rank else None


def _worker_main(rank: int, size: int, args, plan: dict, port: int, conn, extra_env: dict) -> None:
    # A Ctrl-C in the terminal signals every process of the group: a worker raising KeyboardInterrupt mid-step (or
    # mid-collective) would leave the engine without it. The engine process takes the interrupt and aborts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.environ.update(extra_env)  # before torch touches NCCL/CUDA; inside the try so a failure is reported
        import torch
        import torch.distributed as dist

        from sglang_eagle3.distributed.parallel_state import init_tp
        from sglang_eagle3.env_report import collect_env_report
        from sglang_eagle3.runtime.worker import ModelWorker, resolve_device

        logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.WARNING),
                            format=f"[tp{rank}] %(levelname)s %(name)s: %(message)s")
        device = resolve_device(args.device)
        if device.type == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        elif "OMP_NUM_THREADS" not in os.environ:  # the user's choice stands
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))
        fault = _fault(rank)
        if fault == "start":
            raise RuntimeError(f"fault injected at start-up ({FAULT_ENV})")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=rank, world_size=size, timeout=timedelta(seconds=plan["timeout"]))
        init_tp(rank, size)
        # Every rank runs the same scheduler and must stop a request at the same token: each decodes for the
        # stop strings itself (without it, stop strings were ignored under TP).
        tokenizer = None
        if not args.skip_tokenizer_init:
            from sglang_eagle3.tokenizer import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
        # Each rank compiles the grammars of its requests itself (the engine's process did too, to validate them).
        grammar = GrammarBackend.for_engine(args, tokenizer, plan["vocab_size"], plan["eos"])
        worker = ModelWorker(args, plan, device, detokenize=tokenizer.decode if tokenizer is not None else None,
                             grammar=grammar)
        report = collect_env_report()
        report["rank"] = rank
        report["kv_pages"] = worker.kv_pages  # the same on every rank (fit_kv_pages takes the smallest)
        conn.send((0, "ready", report))
        fail_step = int(fault.split(":")[1]) if fault and fault.startswith("step:") else None
        steps = 0
        last_seq = 0
        # Rank 0's requests that finished in its latest step: that step's reply may be the one an interrupted engine
        # never read, and "resync" hands them over again (TPWorkerGroup._resync).
        last_finished: list = []
        while True:
            seq, cmd, payload = conn.recv()
            if seq <= last_seq:  # the engine sends each command once, whole (TPWorkerGroup._send_all)
                raise ValueError(f"command {seq} ({cmd}) after command {last_seq}: the command stream is out of order")
            last_seq = seq
            if cmd == "shutdown":
                conn.send((seq, "ok", None))
                break
            if cmd == "add":
                for r in payload:
                    worker.add(r)
                conn.send((seq, "ok", None))
            elif cmd == "abort":
                conn.send((seq, "ok", worker.abort(payload)))
            elif cmd == "step":
                steps += 1
                if fail_step is not None and steps >= fail_step:
                    raise RuntimeError(f"fault injected at step {steps} ({FAULT_ENV})")
                changed = worker.step()
                snapshots = [r.snapshot() for r in changed] if rank == 0 else None
                if rank == 0:
                    last_finished = [r for r in snapshots if r.finished]
                conn.send((seq, "ok", snapshots))
            elif cmd == "resync":
                # payload: the ids the engine still waits on. Each rank aborts what it holds beyond them (an abort
                # cut short before it was sent), the same on every rank, as the queues are the same.
                sched = worker.scheduler
                held = {r.rid for q in (sched.waiting, sched.running) for r in q}
                for rid in sorted(held - set(payload)):
                    worker.abort(rid)
                conn.send((seq, "ok", (last_finished, held & set(payload)) if rank == 0 else None))
            elif cmd == "set_num_steps":
                worker.set_num_steps(payload)
                conn.send((seq, "ok", None))
            elif cmd == "info":
                # Other ranks report their own pool: after an interrupt, each rank's pages are checked, not rank 0's.
                sched = worker.scheduler
                mine = {"kv_pages_free": worker.runner.allocator.num_free, "running_requests": len(sched.running),
                        "waiting_requests": len(sched.waiting)}
                conn.send((seq, "ok", worker.info() if rank == 0 else mine))
            else:
                raise ValueError(f"unknown command {cmd!r}")
        if dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the engine with its traceback
        try:
            conn.send((-1, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        except (BrokenPipeError, OSError):
            pass
        raise SystemExit(1) from None


class TPWorkerGroup:
    """tp_size worker processes behind the ModelWorker interface (add/abort/step/has_work/info)."""

    def __init__(self, args, plan: dict, *, timeout: float = 300.0):
        self.size = args.tp_size
        self.timeout = timeout
        extra = dict(args.worker_env)
        ctx = mp.get_context("spawn")
        port = _free_port()
        plan = dict(plan, timeout=timeout)
        self.procs, self.conns = [], []
        self._pending: dict = {}  # rid -> the caller's Request, until a step() returns it finished
        self._resync_due = False  # a call was cut short: _pending and the workers' queues may disagree (_resync)
        self._recovered: list = []  # finished snapshots found by _resync, for the next step() to return
        self._closed = False
        self._seq = 0  # the last command's number (replies carry it); 0: the workers' "ready"
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker_main, args=(rank, self.size, args, plan, port, child, extra),
                            name=f"sglang_eagle3-tp{rank}", daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self._finalizer = weakref.finalize(self, _terminate, list(self.procs))
        try:
            replies = self._gather("ready", 0, deadline=time.monotonic() + timeout)
        except BaseException:
            self.close()
            raise
        self.env_reports = replies
        self.kv_pages = replies[0]["kv_pages"]
        from sglang_eagle3.env_report import PER_RANK_KEYS, compare_reports

        self.env_disagreements = compare_reports(replies, ignore=PER_RANK_KEYS | {"rank"})
        for line in self.env_disagreements:
            logger.warning("TP ranks disagree: %s", line)

    # -- plumbing -------------------------------------------------------------------------------------
    def _gather(self, what: str, seq: int, deadline: float) -> list:
        """Waits for every rank's reply to command ``seq``; raises WorkerError naming the first rank that failed.
        Replies to earlier commands, left unread by a call that was interrupted, are dropped."""
        out: list = [None] * self.size
        waiting = set(range(self.size))
        while waiting:
            for rank in sorted(waiting):
                conn, proc = self.conns[rank], self.procs[rank]
                if conn.poll(0.01):
                    try:
                        got, tag, payload = conn.recv()
                    except (EOFError, OSError):
                        self._fail(rank, f"pipe closed while waiting for {what} (exit code {proc.exitcode})")
                    if tag == "error":  # whichever command it ran: the worker is gone
                        self._fail(rank, payload)
                    if got < seq:
                        logger.debug("rank %d: stale reply to command %d dropped (waiting for %d, %s)", rank, got,
                                     seq, what)
                        continue
                    if got != seq:
                        self._fail(rank, f"reply numbered {got} while waiting for command {seq} ({what}): "
                                         "the command stream is out of order")
                    out[rank] = payload
                    waiting.discard(rank)
                elif not proc.is_alive():
                    self._fail(rank, f"process exited with code {proc.exitcode} while waiting for {what}")
            if waiting and time.monotonic() > deadline:
                self._fail(min(waiting), f"no reply to {what} within {self.timeout:.0f} s")
        return out

    def _fail(self, rank: int, cause: str):
        self.close(graceful=False)
        raise WorkerError(f"TP worker rank {rank} failed: {cause}")

    def _call(self, cmd: str, payload=None):
        """Sends a command to every rank and returns rank 0's reply."""
        return self._call_all(cmd, payload)[0]

    def _call_all(self, cmd: str, payload=None) -> list:
        """Sends a command to every rank and returns every rank's reply."""
        if self._closed:
            raise WorkerError("the TP worker group is shut down")
        self._seq += 1
        self._send_all(self._seq, cmd, payload)
        return self._gather(cmd, self._seq, deadline=time.monotonic() + self.timeout)

    def _send_all(self, seq: int, cmd: str, payload) -> None:
        """Sends command ``seq`` to every rank, whole, with a Ctrl-C held back until the last rank has it: ranks that
        got it step into collectives the others would never join (a hang until the process group's timeout), and a
        message larger than the pipe's buffer is written in pieces, so one cut short leaves a fragment in the pipe
        that no resend repairs (the worker reads the next bytes as the rest of it)."""
        with defer_interrupt():
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send((seq, cmd, payload))
                except (BrokenPipeError, OSError):
                    self._fail(rank, f"cannot send {cmd!r}: pipe closed (exit code {self.procs[rank].exitcode})")

    @contextlib.contextmanager
    def _watch(self):
        """Marks the group for _resync when the body is cut short (a Ctrl-C, most often): a step's reply then went
        unread, and with it the end of requests of other callers; an add or abort may have reached no worker."""
        try:
            yield
        except WorkerError:  # the group is shut down: nothing left to bring in line
            raise
        except BaseException:
            self._resync_due = True
            raise

    def _resync(self) -> None:
        """Brings _pending in line with the workers after a call was cut short. A request rank 0 finished in its
        latest step (whose reply may be the one no one read) is handed to the next step() caller as it finished;
        one rank 0 does not hold and did not just finish (an add cut short before it was sent) ends with an abort
        reason, so its caller hears of it; one the workers hold but _pending does not (an abort cut short before it
        was sent) is aborted on every rank. Without it, a lost request stayed in _pending: has_work() true for ever
        and its caller waiting for ever."""
        finished, held = self._call("resync", sorted(self._pending))
        recovered = {r.rid for r in self._recovered}
        for r in finished:
            if r.rid in self._pending and r.rid not in recovered:
                self._recovered.append(r)
                recovered.add(r.rid)
        for rid, req in self._pending.items():
            if rid not in held and rid not in recovered:
                logger.warning("request %s: lost by a call to the TP workers that was cut short; ended as aborted",
                               rid)
                lost = req.snapshot()
                lost.finished_reason = {"type": "abort", "message": "lost by an interrupted call to the TP workers"}
                self._recovered.append(lost)
        self._resync_due = False

    # -- ModelWorker interface ------------------------------------------------------------------------
    def add(self, req) -> None:
        with self._watch():
            self._pending[req.rid] = req
            self._call("add", [req.snapshot()])

    def abort(self, rid: str) -> bool:
        with self._watch():
            self._pending.pop(rid, None)
            self._recovered = [r for r in self._recovered if r.rid != rid]  # its caller no longer waits for it
            if self._closed:  # after a failure there is nothing left to cancel
                return False
            return bool(self._call("abort", rid))

    def step(self) -> list:
        with self._watch():
            if self._resync_due:
                self._resync()
            changed = self._call("step")
            if self._recovered:
                changed, self._recovered = self._recovered + changed, []
            for r in changed:
                if r.finished:
                    self._pending.pop(r.rid, None)
            return changed

    def has_work(self) -> bool:
        if self._resync_due and not self._closed:
            # After an interrupt only: _pending may name a request that is gone, and the workers may hold one whose
            # abort never reached them, so the answer is asked of them (one round trip).
            try:
                with self._watch():
                    self._resync()
            except WorkerError:  # the next step() raises it where its callers handle a failure
                return True
        return bool(self._pending)

    def info(self) -> dict:
        replies = self._call_all("info")
        # Each rank's own pool and queues (rank 0's are the top-level keys): every rank must free what it holds.
        ranks = [{k: r[k] for k in ("kv_pages_free", "running_requests", "waiting_requests")} for r in replies]
        return dict(replies[0], tp_ranks=ranks)

    def set_num_steps(self, k: int) -> None:
        self._call("set_num_steps", k)

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if graceful:
            self._seq += 1
            for conn in self.conns:
                try:
                    conn.send((self._seq, "shutdown", None))
                except (BrokenPipeError, OSError):
                    pass
            deadline = time.monotonic() + 10
            for p in self.procs:
                p.join(max(0.0, deadline - time.monotonic()))
        _terminate(self.procs)
        for conn in self.conns:
            conn.close()


def _terminate(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
