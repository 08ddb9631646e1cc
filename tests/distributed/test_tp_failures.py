"""The TP worker path as a user meets it when something goes wrong (TP=2 on CPU, gloo): a rank killed mid-run or
hung in a step is named with its signal or its stack, not the rank that waited for it; the engine's process killed
leaves no worker behind; worker_env reaches the workers before their interpreter starts, what a worker changed is
reported, and a pair the OS would refuse is named before anything is spawned. Everything that could hang runs
under a timeout: a subprocess's, or the engine's own worker_timeout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from sglang_eagle3 import Engine
from sglang_eagle3.config import ConfigError
from sglang_eagle3.distributed.workers import FAULT_ENV, WorkerError

pytestmark = [pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available"),
              pytest.mark.usefixtures("torch_one_thread")]

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


def _engine(pair, **kw) -> Engine:
    return Engine(model_path=pair.target, device="cpu", tp_size=2, skip_tokenizer_init=True, **kw)


def _gone(pid: int) -> bool:
    """No such process, or a zombie (its parent gone, nothing reaped it yet: it holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pids, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def test_killed_rank_is_named_with_its_signal(small_pair):
    """A rank SIGKILLed between two requests (what the OOM killer does): the next call names rank 1 and the signal
    (it said "pipe closed ... (exit code None)"), the other rank's gloo error comes after it, and no worker is left."""
    eng = _engine(small_pair, worker_timeout=30)
    try:
        eng.generate(input_ids=[3, 1, 4], sampling_params=GREEDY)
        pids = [p.pid for p in eng.backend.procs]
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerError, match=r"^TP worker rank 1 failed: killed by SIGKILL"):
            eng.generate(input_ids=[3, 1, 4], sampling_params=GREEDY)
        assert time.monotonic() - t0 < 10
    finally:
        eng.shutdown()
    assert not _wait_gone(pids, 10)


def test_hung_rank_is_named_with_its_stack(small_pair, monkeypatch):
    """Rank 1 stops answering in its second step while rank 0 waits for it in an all-reduce: the timeout names
    rank 1 and where it hangs (it named rank 0, the lowest rank without a reply, or rank 0's gloo timeout)."""
    monkeypatch.setenv(FAULT_ENV, "rank=1,at=step:2,hang=1")
    eng = _engine(small_pair, worker_timeout=4)  # (the start-up is worker_start_timeout's)
    try:
        pids = [p.pid for p in eng.backend.procs]
        t0 = time.monotonic()
        with pytest.raises(WorkerError) as err:
            eng.generate(input_ids=[3, 1, 4], sampling_params=GREEDY)
        assert time.monotonic() - t0 < 15
    finally:
        eng.shutdown()
    first, *rest = str(err.value).splitlines()
    assert re.match(r"TP worker rank 1 failed: no reply to step in \d+\.\d s.*; its stack", first), first
    assert "_inject (sglang_eagle3/distributed/workers.py" in first, first
    assert rest and rest[0].startswith("  then rank 0 (inside torch.distributed)"), rest
    assert not _wait_gone(pids, 10)


def test_start_up_is_bounded_by_time_without_progress(small_pair, monkeypatch):
    """The workers' start (spawn, torch's import, the load, graph capture) is bounded by worker_start_timeout of time
    without progress from any rank, not by each command's worker_timeout nor by a fixed total: a start longer than
    both whose rank keeps reporting progress succeeds (a Kimi-K2.5 load from slow storage passes 300 s, and an hour
    where storage is slow enough), and a rank that stops reporting is named under worker_start_timeout with the last
    progress it reported and its stack, over rank 0 waiting for it in the rendezvous."""
    monkeypatch.setenv(FAULT_ENV, "rank=1,at=start,slow=10")
    t0 = time.monotonic()
    eng = _engine(small_pair, worker_timeout=0.05, worker_start_timeout=8)  # 0.05: less than an import of torch
    assert time.monotonic() - t0 > 10  # (the start did outlast the bound)
    eng.shutdown()
    monkeypatch.setenv(FAULT_ENV, "rank=1,at=start,slow=2,hang=1")
    t0 = time.monotonic()
    with pytest.raises(WorkerError) as err:
        _engine(small_pair, worker_timeout=300, worker_start_timeout=8)
    assert 10 < time.monotonic() - t0 < 40
    first, *rest = str(err.value).splitlines()
    assert re.match(r"TP worker rank 1 failed: no reply to ready in \d+\.\d s \(worker_start_timeout=8 s without "
                    r"progress from any rank\); its last progress: 'an injected slow start-up \(.*\)', "
                    r"([89]|1\d)\.\d s ago; its stack, innermost first: _inject", first), first
    assert rest and rest[0].startswith("  then rank 0 (inside torch.distributed)"), rest


_KILLED_ENGINE = """
import os, signal, sys, threading, time
import multiprocessing as mp
from sglang_eagle3 import Engine

def kill_self_once_started():
    while len([p for p in mp.active_children() if p.name.startswith("sglang_eagle3-tp")]) < 2:
        time.sleep(0.05)
    time.sleep(1.0)
    print(*[p.pid for p in mp.active_children() if p.name.startswith("sglang_eagle3-tp")], flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

if __name__ == "__main__":
    threading.Thread(target=kill_self_once_started, daemon=True).start()
    Engine(model_path=sys.argv[1], device="cpu", tp_size=2, skip_tokenizer_init=True, worker_timeout=120)
"""


def test_engine_killed_mid_start_leaves_no_worker(small_pair, tmp_path):
    """The engine's process SIGKILLed (or SIGTERMed: no clean-up runs either way) while its workers are busy (rank
    1 stuck at start-up, rank 0 waiting for it in the rendezvous): both workers exit within seconds, instead of
    holding their memory until the process group's timeout or for ever."""
    script = tmp_path / "killed_engine.py"
    script.write_text(textwrap.dedent(_KILLED_ENGINE))
    env = {**os.environ, FAULT_ENV: "rank=1,at=start,hang=1", "OMP_NUM_THREADS": "1"}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    # Files, not pipes: workers left behind would hold a pipe open, and reading it would wait for them.
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen([sys.executable, str(script), small_pair.target], env=env, stdout=fo, stderr=fe)
        try:
            code = proc.wait(timeout=60)
        finally:
            proc.kill()
    assert code == -signal.SIGKILL, err.read_text()[-3000:]
    pids = [int(p) for p in out.read_text().split()]
    assert len(pids) == 2, (out.read_text(), err.read_text()[-3000:])
    left = _wait_gone(pids, 8)
    for pid in left:  # ours: started by the script above
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived the engine's process"


_RESET_IN_WORKER = """
import os
if os.environ.get("NCCL_PROTO") == "Simple":  # as a library of the worker resetting a variable at import
    os.environ["NCCL_PROTO"] = "LL"
"""


def test_worker_env_applies_before_the_interpreter_and_changes_are_reported(small_pair, tmp_path, monkeypatch,
                                                                             caplog):
    """worker_env is in the workers' environment when their interpreter starts: OMP_NUM_THREADS=1 is the thread
    count torch runs with (applied after torch's import, it was reported as set while torch ran with every core),
    PYTHONPATH's sitecustomize runs there. A variable changed inside the worker (here by that sitecustomize, as by
    a library) is reported per rank as changed, with a warning."""
    (tmp_path / "sitecustomize.py").write_text(_RESET_IN_WORKER)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("NCCL_PROTO", raising=False)
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    caplog.set_level("WARNING", logger="sglang_eagle3.distributed.workers")
    eng = _engine(small_pair, worker_timeout=60,
                  worker_env={"OMP_NUM_THREADS": "1", "NCCL_PROTO": "Simple", "PYTHONPATH": path})
    try:
        reports = eng.get_server_info()["worker_env"]
        changed = eng.backend.env_changed
    finally:
        eng.shutdown()
    assert "OMP_NUM_THREADS" not in os.environ and "NCCL_PROTO" not in os.environ  # the caller's is as it was
    assert [r["rank"] for r in reports] == [0, 1]
    for r in reports:
        assert r["torch_threads"] == 1, r
        assert r["env"]["OMP_NUM_THREADS"] == "1" and r["env"]["NCCL_PROTO"] == "LL", r["env"]
        assert r["env_changed"] == {"NCCL_PROTO": "LL"}, r
    assert changed == [f"rank {r}: NCCL_PROTO was spawned as 'Simple', runs with 'LL' (changed inside the worker)"
                       for r in (0, 1)]
    assert sum("NCCL_PROTO was spawned as 'Simple'" in m for m in caplog.messages) == 2


@pytest.mark.parametrize("bad,why", [({"": "1"}, r"'=1': '' is not an environment variable name"),
                                     ({"NCCL_ALGO=Ring": "1"}, r"'NCCL_ALGO=Ring=1': 'NCCL_ALGO=Ring' is not an"),
                                     ({"NCCL_ALGO ": "Ring"}, r"'NCCL_ALGO =Ring': 'NCCL_ALGO ' is not an"),
                                     ({"NCCL_ALGO": "Ri\0ng"}, r"'NCCL_ALGO=Ri\\x00ng': a NUL byte in the value"),
                                     ({"hf_token": "Ri\0ng"}, r"'hf_token=<hidden>': a NUL byte in the value")])
def test_invalid_worker_env_is_named_before_spawning(small_pair, bad, why):
    """Pairs the OS refuses are named in a ConfigError before any worker starts (each rank failed with
    "OSError: [Errno 22] Invalid argument" or "illegal environment variable name", naming no variable), and so is
    a name no program reads by that spelling ("NCCL_ALGO " was set, and NCCL ran with its default); a secret's value
    stays out of the message."""
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=f"worker_env: invalid variable\\(s\\): {why}"):
        _engine(small_pair, worker_env=bad)
    assert time.monotonic() - t0 < 2  # refused before spawning (starting the workers takes seconds)


def test_two_engines_at_once_in_one_process(small_pair):
    """Two TP engines started at the same moment from two threads of one process: each rendezvous on its own port
    (rank 0's store takes one the OS picks), both serve the same tokens."""
    outs, errors = {}, []

    def serve(name):
        try:
            with _engine(small_pair, worker_timeout=60) as eng:
                outs[name] = eng.generate(input_ids=[3, 1, 4], sampling_params=GREEDY)["output_ids"]
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "an engine start hung"
    assert not errors, errors
    assert outs["a"] == outs["b"] and len(outs["a"]) == GREEDY["max_new_tokens"]
