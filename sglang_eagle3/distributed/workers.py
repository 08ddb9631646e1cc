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
rank and cause (its traceback, or the signal that killed it: SIGKILL is what the OOM killer sends) at once, and a
rank silent for ``timeout`` seconds (``start_timeout`` while the workers start: the load and graph capture take
longer than any command) one naming it too; then every worker is terminated (then killed). One rank's failure
makes the others fail in the collective they wait in (gloo raises at once, NCCL waits), so the engine looks at
every rank before it names one: a rank that died or raised outside torch.distributed is the cause, the others
are listed after it. A rank that gives no reply (a hang) is asked for its Python stack (faulthandler, SIGUSR1):
one stuck outside a collective is named over those waiting for it inside one. A worker exits by itself when the
engine's process is gone (killed with SIGKILL or SIGTERM, which run no clean-up), so none is left holding a GPU.

Rendezvous: rank 0 opens the TCP store on a port the OS picks and hands it to the others through the engine, so
engines started at once on one machine never race for a port.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import logging
import multiprocessing as mp
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import traceback
import weakref
from datetime import timedelta
from multiprocessing.connection import wait as wait_for

from sglang_eagle3 import env
from sglang_eagle3.config import ConfigError
from sglang_eagle3.progress import beat, listening
from sglang_eagle3.runtime.grammar import GrammarBackend
from sglang_eagle3.runtime.interrupts import defer_interrupt

logger = logging.getLogger(__name__)

# Test hook: "rank=R,at=start" or "rank=R,at=step:N" makes that rank raise there; with ",hang=1" it stops answering
# there instead (sleeps until killed), as a rank stuck in a driver call would; with ",slow=S" (at=start) it spends S
# seconds there reporting progress, as a long healthy load does, then goes on.
FAULT_ENV = env.FAULT_INJECT.name
# After the first rank fails, how long the others get to fail too (a peer's death reaches gloo at once), so the
# rank named is the cause rather than the first one read.
_FAILURE_GRACE_S = 1.0
_STACK_SIGNAL = getattr(signal, "SIGUSR1", None)  # a hung worker writes its Python stack on it (faulthandler)
_SPAWN_LOCK = threading.Lock()  # the environment swap around a spawn (_spawn_environment)


class WorkerError(RuntimeError):
    """A TP worker failed; the message names the rank and the cause."""


def check_worker_env(pairs) -> dict[str, str]:
    """``worker_env`` as a dict; a ConfigError names every pair that could not reach a worker as meant
    (env_report.env_pair_problems: a name the OS refuses or no program reads, a NUL byte), before any worker is
    spawned (a worker failing on it named only ``[Errno 22] Invalid argument``; "NCCL_ALGO " was set and unread)."""
    from sglang_eagle3.env_report import env_pair_problems

    bad = env_pair_problems(pairs)
    if bad:
        raise ConfigError(f"worker_env: invalid variable(s): {'; '.join(bad)}")
    return dict(pairs)


@contextlib.contextmanager
def _spawn_environment(extra: dict[str, str]):
    """This process's environment plus ``extra`` while workers are spawned, then put back: a spawned worker gets
    it at exec, before its interpreter imports anything. Set in the worker instead, it came after torch's import
    (unpickling the worker's entry point imports it), too late for what torch and OpenMP read there:
    OMP_NUM_THREADS given that way was reported as set while the worker ran with every core's thread.
    NOTE: other threads of this process see ``extra`` for that moment."""
    with _SPAWN_LOCK, env.overrides(extra):
        yield


def _fault(rank: int) -> tuple[str | None, bool, float]:
    """(where this rank fails, whether it hangs there rather than raising, seconds it is slow there instead) from
    FAULT_ENV."""
    spec = env.FAULT_INJECT.raw() or ""
    kv = dict(p.split("=", 1) for p in spec.split(",") if "=" in p)
    if not spec or int(kv.get("rank", -1)) != rank:
        return None, False, 0.0
    return kv.get("at"), kv.get("hang") == "1", float(kv.get("slow", 0))


def _inject(rank: int, where: str, hang: bool, slow: float = 0.0) -> None:
    """Raises, hangs, or is slow (then hangs with ``hang``, else goes on) at ``where``, as FAULT_ENV says."""
    end = time.monotonic() + slow
    while time.monotonic() < end:
        beat("an injected slow %s (%s)", where, FAULT_ENV)
        time.sleep(0.2)
    if slow and not hang:
        return
    if hang:
        logging.getLogger(__name__).warning("rank %d: hanging at %s (%s)", rank, where, FAULT_ENV)
        while True:
            time.sleep(1)
    raise RuntimeError(f"fault injected at {where} ({FAULT_ENV})")


def _exit_with_engine(stack_path: str) -> None:
    """Exits this worker once the engine's process is gone. Its pipe tells only when the worker reads it, and a
    worker loading weights or waiting in a collective does not: after a SIGKILL or SIGTERM of the engine (no
    clean-up runs) it kept its GPU memory for the whole load or the process group's timeout."""
    parent, ppid = mp.parent_process(), os.getppid()

    def watch():
        while os.getppid() == ppid:  # the sentinel says at once; the parent pid, where there is no sentinel
            if parent is None:
                time.sleep(1.0)
            elif wait_for([parent.sentinel], 1.0):
                break
        os.write(2, f"sglang_eagle3 TP worker {os.getpid()}: the engine process is gone; exiting\n".encode())
        shutil.rmtree(os.path.dirname(stack_path), ignore_errors=True)  # the engine's: it ran no clean-up
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-engine", daemon=True).start()


class _StartBeats:
    """A worker's start-up progress (progress.beat) to the engine: the latest beat, at most every ``interval``
    seconds (a checkpoint's tensors beat by the hundred thousand)."""

    def __init__(self, conn, interval: float = 1.0):
        self.conn, self.interval = conn, interval
        self.sent = -float("inf")

    def __call__(self, doing: str, *args) -> None:
        now = time.monotonic()
        if now - self.sent >= self.interval:
            self.sent = now
            self.conn.send((0, "progress", doing % args if args else doing))


_STACK_FILE = None  # kept open: faulthandler holds only its descriptor


def _enable_stack_dump(path: str) -> None:
    """SIGUSR1 makes this process write every thread's Python stack to ``path`` (the engine asks a rank that
    gives no reply); the first line names the main thread, whose stack is the one that matters."""
    global _STACK_FILE
    if _STACK_SIGNAL is None:
        return
    _STACK_FILE = open(path, "w")  # noqa: SIM115 - lives as long as the process
    _STACK_FILE.write(f"main thread 0x{threading.get_ident():016x}\n")
    _STACK_FILE.flush()
    faulthandler.register(_STACK_SIGNAL, file=_STACK_FILE, all_threads=True)


def _in_torch_distributed(filenames) -> bool:
    return any("torch/distributed/" in f.replace(os.sep, "/") for f in filenames)


def _worker_main(rank: int, size: int, args, plan: dict, conn, spawned_env: dict, stack_path: str) -> None:
    """One rank. ``spawned_env``: the variables the engine spawned it with that a report shows (worker_env among
    them), to name those changed inside the worker by the time it is ready."""
    # A Ctrl-C in the terminal signals every process of the group: a worker raising KeyboardInterrupt mid-step (or
    # mid-collective) would leave the engine without it. The engine process takes the interrupt and aborts.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_engine(stack_path)
    try:
        _enable_stack_dump(stack_path)
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
        fault, hang, slow = _fault(rank)
        timeout = timedelta(seconds=plan["timeout"])
        if rank == 0:  # the OS picks the port; the engine hands it to the other ranks
            store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=timeout, wait_for_workers=False)
            conn.send((0, "port", store.port))
        else:
            _, _, port = conn.recv()
            store = dist.TCPStore("127.0.0.1", port, size, False, timeout=timeout)
        # From here to "ready", the start-up's progress (progress.beat: each checkpoint tensor, each graph) reaches
        # the engine, whose start-up bound counts time without progress.
        with listening(_StartBeats(conn)):
            if fault == "start":
                _inject(rank, "start-up", hang, slow)
            beat("joining the process group")
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank,
                                    world_size=size, timeout=timeout)
            init_tp(rank, size)
            # Every rank runs the same scheduler and must stop a request at the same token: each decodes for the
            # stop strings itself (without it, stop strings were ignored under TP).
            tokenizer = None
            if not args.skip_tokenizer_init:
                from sglang_eagle3.tokenizer import load_tokenizer

                beat("loading the tokenizer")
                tokenizer = load_tokenizer(args.tokenizer_path or args.model_path)
            # Each rank compiles the grammars of its requests itself (the engine's process did too, to validate
            # them).
            beat("starting the grammar backend")
            grammar = GrammarBackend.for_engine(args, tokenizer, plan["vocab_size"], plan["eos"])
            worker = ModelWorker(args, plan, device, detokenize=tokenizer.decode if tokenizer is not None else None,
                                 grammar=grammar)
        report = collect_env_report()
        report["rank"] = rank
        report["kv_pages"] = worker.kv_pages  # the same on every rank (fit_kv_pages takes the smallest)
        report["torch_threads"] = torch.get_num_threads()  # what OMP_NUM_THREADS (or its absence) came to
        # Variables it was spawned with that something inside it (a library at import, the model's code) changed
        # or removed since: name -> the value it runs with (None: unset).
        report["env_changed"] = {k: os.environ.get(k) for k, v in spawned_env.items() if os.environ.get(k) != v}
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
                    _inject(rank, f"step {steps}", hang)
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
        # Raised inside torch.distributed: most often this rank's side of another rank's failure (a peer gone from
        # the collective, its timeout); the engine names a rank that failed elsewhere first.
        collective = _in_torch_distributed(f.filename for f in traceback.extract_tb(e.__traceback__))
        try:
            conn.send((-1, "error", (f"{type(e).__name__}: {e}\n{traceback.format_exc()}", collective)))
        except (BrokenPipeError, OSError):
            pass
        raise SystemExit(1) from None


@dataclasses.dataclass
class _Failure:
    cause: str
    kind: int  # _DIED, _RAISED or _SILENT: the order in which a failure is taken for the cause
    collective: bool  # it raised, or waits, inside torch.distributed: most often because another rank failed


_DIED, _RAISED, _SILENT = 0, 1, 2


@dataclasses.dataclass
class _Progress:
    doing: str  # a worker's latest start-up beat (progress.beat)


# The store's and process group's own timeout (the rendezvous, every collective) is at least this: a rank that loads
# faster than a peer waits for it in the first collective after the load for as long as the peer still loads (and
# reports progress), which worker_start_timeout, a bound on time without progress, does not bound.
_PG_TIMEOUT_MIN_S = 3600.0


class TPWorkerGroup:
    """tp_size worker processes behind the ModelWorker interface (add/abort/step/has_work/info)."""

    def __init__(self, args, plan: dict, *, timeout: float = 300.0, start_timeout: float = 600.0):
        """``timeout``: seconds each command may take (worker_timeout); ``start_timeout``: seconds the start-up (the
        load and graph capture included) may go without progress from any rank (worker_start_timeout)."""
        self.size = args.tp_size
        self.timeout = timeout
        extra = check_worker_env(args.worker_env)
        from sglang_eagle3.env_report import is_reported, is_secret

        # What a worker checks for changes at start-up: the reported variables and worker_env's (a secret's value
        # never goes into a report or a warning).
        spawned_env = {k: v for k, v in {**os.environ, **extra}.items()
                       if is_reported(k) or k in extra and not is_secret(k)}
        ctx = mp.get_context("spawn")
        # The store's and process group's own timeout (the rendezvous, every collective): longer than both bounds,
        # so that neither a slow start-up nor a rank slower to load than its peers trips it. A hang is this engine's
        # to name (_gather's deadlines), with the stuck rank's stack; gloo raising first on the waiting rank blamed it.
        plan = dict(plan, timeout=max(timeout, start_timeout, _PG_TIMEOUT_MIN_S))
        self.procs, self.conns = [], []
        self._pending: dict = {}  # rid -> the caller's Request, until a step() returns it finished
        self._resync_due = False  # a call was cut short: _pending and the workers' queues may disagree (_resync)
        self._recovered: list = []  # finished snapshots found by _resync, for the next step() to return
        self._closed = False
        # Set once a rank failed (the WorkerError's message): the group is stopped and cannot serve again, which the
        # server reads to refuse new requests and turn /health 503 rather than fail every one of them.
        self.failure: str | None = None
        self._seq = 0  # the last command's number (replies carry it); 0: the workers' "ready"
        self._doing: dict[int, tuple[str, float]] = {}  # rank -> its latest start-up beat, and when it came
        self._stack_dir = tempfile.mkdtemp(prefix="sglang_eagle3-tp-")  # each rank's stack on request
        self._finalizer = weakref.finalize(self, _terminate, self.procs, self._stack_dir)
        try:
            with _spawn_environment(extra):
                for rank in range(self.size):
                    parent, child = ctx.Pipe()
                    p = ctx.Process(target=_worker_main, name=f"sglang_eagle3-tp{rank}", daemon=True,
                                    args=(rank, self.size, args, plan, child, spawned_env, self._stack_path(rank)))
                    p.start()
                    child.close()
                    self.procs.append(p)
                    self.conns.append(parent)
            # The start-up's bound is on time without progress: each worker's beats (a checkpoint tensor, a graph,
            # progress.beat) push the deadline on, so a healthy load takes as long as it takes.
            limit = ("worker_start_timeout", start_timeout)
            t0 = time.monotonic()
            (port,) = self._gather("the rendezvous port", 0, t0 + start_timeout, ranks=[0], limit=limit, renew=True)
            for conn in self.conns[1:]:
                with contextlib.suppress(BrokenPipeError, OSError):  # a rank gone: the gather below reads why
                    conn.send((0, "port", port))
            replies = self._gather("ready", 0, t0 + start_timeout, limit=limit, renew=True, since=t0)
        except BaseException:
            self.close(graceful=False)
            raise
        self.env_reports = replies
        self.kv_pages = replies[0]["kv_pages"]
        from sglang_eagle3.env_report import PER_RANK_KEYS, compare_reports

        self.env_disagreements = compare_reports(replies, ignore=PER_RANK_KEYS | {"rank"})
        for line in self.env_disagreements:
            logger.warning("TP ranks disagree: %s", line)
        # A variable the worker was spawned with (worker_env's above all) that it no longer runs with: the report
        # shows what it runs with, this says that it is not what was asked for.
        self.env_changed = [f"rank {r['rank']}: {name} was spawned as {spawned_env[name]!r}, runs with "
                            f"{'<unset>' if now is None else repr(now)} (changed inside the worker)"
                            for r in replies for name, now in r["env_changed"].items()]
        for line in self.env_changed:
            logger.warning("TP worker environment: %s", line)

    def _stack_path(self, rank: int) -> str:
        return os.path.join(self._stack_dir, f"rank{rank}.stack")

    # -- plumbing -------------------------------------------------------------------------------------
    def _gather(self, what: str, seq: int, deadline: float, ranks=None, failures=None,
                limit: tuple[str, float] | None = None, renew: bool = False, since: float | None = None) -> list:
        """Waits for every rank's reply to command ``seq`` (or those of ``ranks``); raises WorkerError naming the
        rank that failed (_fail_ranks). Once one failed (``failures``: known already) or the deadline passed, the
        others get _FAILURE_GRACE_S more: to fail too (a peer's death reaches gloo at once), or to reply after all.
        Replies to earlier commands, left unread by a call that was interrupted, are dropped. ``limit``: the setting
        the deadline came from, (name, seconds); worker_timeout's by default. ``renew``: any rank's progress (a
        start-up beat) moves the deadline to ``limit`` seconds after it: a bound on time without progress.
        ``since``: when the wait began, for the message (the deadline less the limit by default)."""
        limit = limit or ("worker_timeout", self.timeout)
        since = deadline - limit[1] if since is None else since
        out: list = [None] * self.size
        waiting = set(range(self.size) if ranks is None else ranks)
        failures = dict(failures or {})
        grace_end, timed_out = None, False
        while waiting:
            for rank in sorted(waiting):
                got = self._poll(rank, what, seq)
                if isinstance(got, _Progress):
                    now = time.monotonic()
                    self._doing[rank] = (got.doing, now)
                    if renew:
                        deadline = max(deadline, now + limit[1])
                elif isinstance(got, _Failure):
                    failures[rank] = got
                    waiting.discard(rank)
                elif got is not None:
                    out[rank] = got[0]
                    waiting.discard(rank)
            now = time.monotonic()
            if grace_end is None and (failures or now > deadline):
                grace_end, timed_out = now + _FAILURE_GRACE_S, not failures
            if grace_end is not None and now > grace_end:
                break
        if failures or waiting:
            self._fail_ranks(what, waiting, failures, timed_out, since=since, limit=limit, renew=renew)
        return [out[r] for r in ranks] if ranks is not None else out

    def _poll(self, rank: int, what: str, seq: int, wait_s: float = 0.01):
        """One look at a rank: (its reply,), a _Failure, or None (nothing yet, or a stale reply dropped)."""
        conn, proc = self.conns[rank], self.procs[rank]
        if conn.poll(wait_s):
            try:
                got, tag, payload = conn.recv()
            except (EOFError, OSError):
                return _Failure(f"{_exit_cause(proc)} while waiting for {what}", _DIED, False)
            if tag == "error":  # whichever command it ran: the worker is gone
                text, collective = payload
                return _Failure(text, _RAISED, collective)
            if got < seq:
                logger.debug("rank %d: stale reply to command %d dropped (waiting for %d, %s)", rank, got, seq, what)
                return None
            if got != seq:
                return _Failure(f"reply numbered {got} while waiting for command {seq} ({what}): the command stream "
                                "is out of order", _RAISED, False)
            if tag == "progress":
                return _Progress(payload)
            return (payload,)
        if not proc.is_alive():
            return _Failure(f"{_exit_cause(proc)} while waiting for {what}", _DIED, False)
        return None

    def _fail_ranks(self, what: str, waiting: set, failures: dict, timed_out: bool, since: float,
                    limit: tuple[str, float], renew: bool = False) -> None:
        """Names the rank that failed first in cause, not in reading order, then stops every worker: a rank still
        silent (``waiting``) is asked for its stack, and one stuck outside torch.distributed is the cause over ranks
        that raised or wait inside it. ``renew``: the wait's bound was on time without progress (the start-up):
        each rank's last reported progress is named."""
        stacks = self._stacks(sorted(waiting))
        now = time.monotonic()
        for rank in sorted(waiting):
            frames = stacks.get(rank)
            why = f"no reply to {what} in {now - since:.1f} s"
            if timed_out:
                why += f" ({limit[0]}={limit[1]:g} s{' without progress from any rank' if renew else ''})"
            if renew:
                doing, at = self._doing.get(rank, (None, None))
                why += (f"; its last progress: {doing!r}, {now - at:.1f} s ago" if doing is not None
                        else "; it reported no progress")
            where = f"; its stack, innermost first: {' <- '.join(frames)}" if frames else ""
            failures[rank] = _Failure(why + where, _SILENT, bool(frames) and _in_torch_distributed(frames))
        order = list(failures)
        cause = min(order, key=lambda r: (failures[r].collective, failures[r].kind, order.index(r)))
        lines = [f"TP worker rank {cause} failed: {failures[cause].cause}"]
        for r in order:
            if r != cause:
                first = failures[r].cause.strip().splitlines()[0]
                lines.append(f"  then rank {r}{' (inside torch.distributed)' if failures[r].collective else ''}: "
                             f"{first}")
        self.failure = "\n".join(lines)
        self.close(graceful=False)
        raise WorkerError(self.failure)

    def _stacks(self, ranks: list[int]) -> dict[int, list[str]]:
        """The innermost frames of each rank's main thread ("func (dir/file.py:line)"), from a faulthandler dump.
        NOTE: a rank that has not registered the dump yet (still importing) dies of the signal: it is being stopped
        anyway."""
        if _STACK_SIGNAL is None or not ranks:
            return {}
        for r in ranks:  # (one dump a worker: the group is stopped after it, so the file holds only that one)
            with contextlib.suppress(OSError):
                os.kill(self.procs[r].pid, _STACK_SIGNAL)
        out: dict[int, list[str]] = {}
        end = time.monotonic() + 1.0
        while len(out) < len(ranks) and time.monotonic() < end:
            time.sleep(0.05)
            for r in ranks:
                if r not in out:
                    with contextlib.suppress(OSError), open(self._stack_path(r)) as f:
                        frames = _main_thread_frames(f.read())
                        if frames:
                            out[r] = frames
        return out

    def _fail(self, rank: int, cause: str, what: str):
        """``rank`` is gone (its pipe is closed): names it, with what the others were doing."""
        others = [r for r in range(self.size) if r != rank]
        self._gather(what, self._seq, time.monotonic() + self.timeout, ranks=others,
                     failures={rank: _Failure(cause, _DIED, False)})

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
                    self._fail(rank, f"cannot send {cmd!r}: {_exit_cause(self.procs[rank])}", cmd)

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
        self._finalizer()  # _terminate
        for conn in self.conns:
            conn.close()


def _terminate(procs, stack_dir: str) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)
    shutil.rmtree(stack_dir, ignore_errors=True)


def _exit_cause(proc) -> str:
    """How a worker whose pipe closed ended: its exit code, or the signal that killed it."""
    proc.join(1.0)  # its pipe closes a moment before the process is reaped
    code = proc.exitcode
    if code is None:
        return "its pipe closed (the process is still running)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:  # a real-time signal has no name
            name = f"signal {-code}"
        hint = " (the kernel's OOM killer sends it: see dmesg)" if -code == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code} without an error report"


# '  File "/path/to/file.py", line 12 in func' in a faulthandler dump
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>\S+)')


def _main_thread_frames(dump: str, n: int = 4) -> list[str]:
    """The ``n`` innermost frames of the main thread in a dump written by _enable_stack_dump."""
    lines = dump.splitlines()
    if not lines or not lines[0].startswith("main thread "):
        return []
    ident = lines[0].split()[-1]
    frames: list[str] = []
    inside = False
    for line in lines[1:]:
        if line.startswith(("Thread ", "Current thread ")):
            inside = ident in line
            continue
        m = _FRAME.match(line) if inside else None
        if m is None:
            if frames:
                break
            continue
        short = "/".join(m["file"].replace(os.sep, "/").split("/")[-3:])
        frames.append(f"{m['func']} ({short}:{m['line']})")
        if len(frames) == n:
            break
    return frames
