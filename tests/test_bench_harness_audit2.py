"""python -m sglang_eagle3.bench audited a second time, as a demanding user runs it: against our own server on CPU
(the tiny pair of tests/server) and against the in-process fake of tests/server/test_bench_cli.py.

Every number is checked against an independent computation from the per-request records the result file keeps
(numpy's percentiles, bench_serving's TPOT formula, sums over the records), never against a recorded output."""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys

import numpy as np
import pytest

from sglang_eagle3.bench import harness
from sglang_eagle3.bench.__main__ import main
from sglang_eagle3.bench.harness import RequestResult, load_result, provenance_diff, run_workload, save, warnings
from tests.server.conftest import running_server, tiny_model  # noqa: F401 (tiny_model: the fixture)
from tests.server.test_bench_cli import FakeServer, _report, ours_info, sglang_info
from tests.test_bench_audit import _FAKE_LAUNCHER


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):  # noqa: F811 (the imported fixture, used by name)
    with running_server(tiny_model, str(tmp_path_factory.mktemp("audit2_logs")), "--max-running-requests", "8") as srv:
        yield srv


@pytest.fixture
def fake():
    srv = FakeServer()
    srv.info = lambda: ours_info([_report(100, 0)])
    srv.thread.start()
    yield srv
    srv.httpd.shutdown()
    srv.httpd.server_close()


def _run(url: str, out, name: str, *extra: str) -> dict:
    code = main(["run", "--url", url, "--name", name, "--out", str(out), *extra])
    assert code == 0
    return load_result(str(out / f"{name}.json"))


def _ok(records: list[dict]) -> list[dict]:
    return [q for q in records if q["error"] is None]


# --- our server, for real -------------------------------------------------------------------------------------------

def test_latencies_follow_the_per_request_records(server, tmp_path, capsys):
    """Before: the file kept no request, only a mean TTFT and a median ITL, with no p99 and no TPOT. Now every request
    is kept (one line each) and the latency distributions are bench_serving's, recomputed here with numpy; a p99
    over fewer than 100 samples is withheld and printed as n<100."""
    res = _run(server.url, tmp_path, "lat", "--num-requests", "12", "--concurrency", "3", "--max-tokens", "12",
               "--repeats", "2", "--warmup", "1")
    m = res["metrics"]
    recs = m["requests"]
    assert len(recs) == 24 and [q["pass"] for q in recs].count(1) == 12 and {q["round"] for q in recs} == {1}
    ok = _ok(recs)
    assert len(ok) == 24 and all(q["output_tokens"] == 12 for q in ok)
    # the throughput of each pass from the records: its requests' tokens over its wall time
    for i, p in enumerate(m["passes"], start=1):
        toks = sum(q["output_tokens"] for q in ok if q["pass"] == i)
        assert p["end_to_end_output_tok_per_s"] == pytest.approx(toks / p["wall_s"])
    lat = m["latency"]
    ttft = np.array([1e3 * q["ttft_s"] for q in ok])
    itl = np.array([1e3 * x for q in ok for x in q["itl_s"]])
    tpot = np.array([1e3 * (q["latency_s"] - q["ttft_s"]) / (q["output_tokens"] - 1) for q in ok])
    e2e = np.array([1e3 * q["latency_s"] for q in ok])
    tol = 2e-3  # ms: the records keep microseconds
    assert lat["ttft_ms"]["n"] == 24 and lat["ttft_ms"]["mean"] == pytest.approx(ttft.mean(), abs=tol)
    assert lat["ttft_ms"]["median"] == pytest.approx(np.median(ttft), abs=tol)
    assert lat["ttft_ms"]["p90"] == pytest.approx(np.percentile(ttft, 90), abs=tol)
    assert lat["ttft_ms"]["p99"] is None  # 24 samples: the p99 would be the slowest request
    assert lat["itl_ms"]["n"] == len(itl) >= 100
    assert lat["itl_ms"]["p99"] == pytest.approx(np.percentile(itl, 99), abs=tol)
    assert lat["itl_ms"]["median"] == pytest.approx(np.median(itl), abs=tol)
    assert lat["tpot_ms"]["median"] == pytest.approx(np.median(tpot), abs=tol)
    assert lat["e2e_latency_ms"]["max"] == pytest.approx(e2e.max(), abs=tol)
    assert m["median_itl_ms"] == pytest.approx(np.median(itl), abs=tol)  # the table's column, the same gaps
    out = capsys.readouterr().out
    line = [ln for ln in out.splitlines() if ln.startswith("  lat: TTFT")][0]
    # the printed figures are the summary's, rounded; recomputed from the records (kept to the microsecond) they
    # can sit across a rounding boundary (31.23 against 31.24 once), so compare within the printed precision
    got = re.search(r"TTFT ([\d.]+) / ([\d.]+) / n<100 ms \[24\]", line)
    assert got, line
    assert [float(g) for g in got.groups()] == pytest.approx([ttft.mean(), np.median(ttft)], abs=0.05 + tol)
    got = re.search(r"ITL ([\d.]+) / ([\d.]+) / ([\d.]+) ms \[(\d+) gaps\]", line)
    assert got and int(got.group(4)) == len(itl), line
    assert [float(g) for g in got.groups()[:3]] == pytest.approx(
        [itl.mean(), np.median(itl), np.percentile(itl, 99)], abs=0.005 + tol)
    # one line per request in the file
    text = (tmp_path / "lat.json").read_text()
    assert sum(ln.lstrip().startswith('{"round": 1, "pass": ') for ln in text.splitlines()) == 24


def test_accept_length_has_one_definition_for_both_servers(server, fake, tmp_path):
    """Before: the accept length column was our server's counters (tokens of verify rounds / rounds) for ours but
    SGLang's per-request completion_tokens / spec_verify_ct (the prefill's first token counted too) for SGLang,
    and compare did not say so. Now "accept length / verify round" is one definition, from the stream, for both;
    on our server it equals the server's own counters, and compare names the differing source."""
    ours = _run(server.url, tmp_path, "ours", "--num-requests", "4", "--max-tokens", "10", "--warmup", "0")
    recs = _ok(ours["metrics"]["requests"])
    verify = sum(q["verify_ct"] for q in recs)
    per_verify = sum(q["output_tokens"] - 1 for q in recs) / verify
    assert verify > 0 and ours["metrics"]["accept_length_per_verify"] == pytest.approx(per_verify)
    assert ours["metrics"]["server_accept_length"] == pytest.approx(per_verify)  # the server's counters agree
    assert sum(q["output_tokens"] for q in recs) / verify != pytest.approx(per_verify)  # SGLang's ratio would not

    fake.info = lambda: sglang_info("EAGLE3", "1")
    fake.verify_ct = 2  # 4 tokens: the first from prefill, 3 from 2 verify rounds
    theirs = _run(fake.url, tmp_path, "sglang", "--num-requests", "2", "--max-tokens", "4", "--warmup", "0")
    assert theirs["metrics"]["server_accept_length"] == pytest.approx(4 / 2)  # SGLang's own ratio, as before
    assert theirs["metrics"]["accept_length_per_verify"] == pytest.approx((4 - 1) / 2)
    lines = [d for d in provenance_diff([ours, theirs]) if d.startswith("metrics.accept_length_source")]
    assert len(lines) == 1 and "ours=" in lines[0] and "sglang=" in lines[0]


def test_a_different_prompt_set_of_as_many_prompts_is_named(server, tmp_path):
    """Before: the workload recorded only the number of prompts, so two prompt files of 2 lines compared as the
    same workload. Now the prompt set's hash is in the provenance, and the measured prompt tokens differ too."""
    short, long_ = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text("The quick fox\nA lazy dog\n")
    long_.write_text("The quick brown fox jumps over the lazy dog again and again and again\n"
                     "Pack my box with five dozen liquor jugs, then pack another box with more\n")
    args = ("--num-requests", "2", "--max-tokens", "2", "--warmup", "0")
    a = _run(server.url, tmp_path, "short", "--prompts-file", str(short), *args)
    b = _run(server.url, tmp_path, "long", "--prompts-file", str(long_), *args)
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "short.txt").write_text(short.read_text())
    c = _run(server.url, tmp_path, "short_again", "--prompts-file", str(copy / "short.txt"), *args)
    assert a["workload"] == b["workload"]  # the count alone: the same
    diffs = provenance_diff([a, b])
    assert any(d.startswith("prompt_set_sha256: short=") for d in diffs), diffs
    mean = [statistics.mean(q["prompt_tokens"] for q in _ok(r["metrics"]["requests"])) for r in (a, b)]
    assert mean[0] < mean[1]
    assert f"measured prompt tokens a request (another prompt set or tokenizer): short={mean[0]:.1f} | " \
           f"long={mean[1]:.1f}" in diffs
    # the same prompts read from another path: nothing to report about the prompts
    assert not [d for d in provenance_diff([a, c]) if "prompt" in d]


# --- bad input: a clear message naming the value, before any request -----------------------------------------------

@pytest.mark.parametrize("url, said", [("http://[::1", "Invalid IPv6 URL"), ("http://127.0.0.1:99999", "Port out of")])
def test_an_invalid_url_is_named(fake, tmp_path, url, said):
    with pytest.raises(SystemExit) as e:
        main(["run", "--url", url, "--name", "x", "--out", str(tmp_path)])
    msg = str(e.value.code)
    assert url in msg and said in msg and "\n" not in msg and fake.posts == 0


def test_an_unusable_out_folder_stops_the_run_before_any_request(fake, tmp_path):
    """Before: the whole benchmark ran, then save() failed with FileExistsError and nothing was written."""
    taken = tmp_path / "a_file"
    taken.write_text("")
    with pytest.raises(SystemExit) as e:
        main(["run", "--url", fake.url, "--name", "x", "--out", str(taken), "--num-requests", "1",
              "--max-tokens", "2", "--warmup", "0"])
    assert str(taken) in str(e.value.code) and "is a file, not a folder" in str(e.value.code)
    assert fake.posts == 0


def test_a_prompts_file_that_is_not_text_is_named(fake, tmp_path):
    binary = tmp_path / "prompts.bin"
    binary.write_bytes(b"ok\n\xff\xfe\x00 not text\n")
    with pytest.raises(SystemExit) as e:
        main(["run", "--url", fake.url, "--name", "x", "--out", str(tmp_path), "--prompts-file", str(binary)])
    assert str(binary) in str(e.value.code) and "not UTF-8" in str(e.value.code) and fake.posts == 0


@pytest.mark.parametrize("path, value, field", [
    (("metrics", "end_to_end_output_tok_per_s"), None, "metrics.end_to_end_output_tok_per_s is null"),
    (("metrics", "requests_failed"), "2", 'metrics.requests_failed is "2", not an integer'),
    (("provenance", "worker_env"), {"rank": 0}, "provenance.worker_env is {\"rank\": 0}, not a list"),
    (("errors",), "boom", 'errors is "boom", not a list'),
    (("workload",), [], "workload is [], not an object"),
])
def test_a_damaged_result_file_is_refused_by_field(fake, tmp_path, path, value, field):
    """Before: compare failed inside the table with a TypeError / AttributeError traceback."""
    good = run_workload(fake.url, name="good", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    bad = json.loads(json.dumps(good))
    bad["name"] = "bad"
    holder = bad
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    files = [save(good, str(tmp_path)), save(bad, str(tmp_path))]
    with pytest.raises(SystemExit) as e:
        main(["compare", *files])
    msg = str(e.value.code)
    assert files[1] in msg and field in msg and "\n" not in msg


def test_a_file_from_before_this_format_compares_and_says_so(fake, tmp_path, capsys):
    new = run_workload(fake.url, name="new", prompts=["a"], num_requests=2, concurrency=1, max_tokens=3, warmup=0)
    old = json.loads(json.dumps(new))
    old["name"] = "old"
    for key in ("requests", "latency", "accept_length_per_verify", "prompt_tokens", "prompt_tokens_per_request_mean",
                "requests_short"):
        del old["metrics"][key]
    for key in ("prompt_set_sha256", "prompts_source", "server_hosts", "client_gpus"):
        del old["provenance"][key]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))  # as the harness wrote it before: no "format"
    written = save(new, str(tmp_path))
    assert json.loads((tmp_path / "new.json").read_text())["format"] == harness.RESULT_FORMAT
    assert main(["compare", written, str(path)]) == 0
    out = capsys.readouterr().out
    assert "old: written by an older harness (result format 1" in out
    assert "  old: - (not recorded" in out and "| old | 0/2 |" in out


def test_runs_of_one_name_are_told_apart_by_their_file(fake, tmp_path, capsys):
    """Before: before/eagle3.json and after/eagle3.json printed two "| eagle3 |" rows and difference lines
    reading eagle3=... | eagle3=..., with no way to tell which was which."""
    before, after = tmp_path / "before", tmp_path / "after"
    _run(fake.url, before, "eagle3", "--num-requests", "1", "--max-tokens", "2", "--warmup", "0")
    _run(fake.url, after, "eagle3", "--num-requests", "1", "--max-tokens", "3", "--warmup", "0")
    capsys.readouterr()
    first, second = str(before / "eagle3.json"), str(after / "eagle3.json")
    assert main(["compare", first, second]) == 0
    out = capsys.readouterr().out
    assert f"| eagle3 ({first}) |" in out and f"| eagle3 ({second}) |" in out
    assert f"workload.max_tokens: eagle3 ({first})=2 | eagle3 ({second})=3" in out


# --- comparisons that hid a difference ------------------------------------------------------------------------------

def test_a_baseline_from_another_server_machine_is_warned_about(fake, tmp_path, capsys):
    """Before: worker hostnames were left out of every comparison (they differ by rank), so a baseline measured
    on another machine of the same GPU, through the same client, compared without a warning."""
    fake.info = lambda: ours_info([_report(100, 0)])
    here = run_workload(fake.url, name="here", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2, warmup=0)
    fake.info = lambda: ours_info([{**_report(200, 0), "hostname": "gpu-node-2"}])
    there = run_workload(fake.url, name="there", prompts=["a"], num_requests=1, concurrency=1, max_tokens=2,
                         warmup=0)
    there["provenance"]["client_git_commit"] = here["provenance"]["client_git_commit"]  # (others commit meanwhile)
    assert (here["provenance"]["server_hosts"], there["provenance"]["server_hosts"]) == (["h"], ["gpu-node-2"])
    assert main(["compare", save(here, str(tmp_path)), save(there, str(tmp_path))]) == 0
    warning = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("WARNING")]
    assert len(warning) == 1 and "server_hosts" in warning[0], warning


def test_short_requests_and_idle_concurrency_are_warned_about(fake, monkeypatch):
    """A server that cut requests short (EOS is ignored: a context limit) did less work than asked, and
    --concurrency above --num-requests never had that many requests in flight; both were silent."""
    def short(base, prompt, max_tokens, temperature, timeout):
        return RequestResult(3, max_tokens - 1, 0.01, 0.001, [0.001] * (max_tokens - 2))

    monkeypatch.setattr(harness, "run_one", short)
    res = run_workload(fake.url, name="cut", prompts=["a"], num_requests=2, concurrency=8, max_tokens=5, warmup=0)
    said = warnings([res])
    assert res["metrics"]["requests_short"] == 2
    assert "cut: 2 request(s) ended before --max-tokens 5 (EOS is ignored" in said[0]
    assert said[1] == "cut: --concurrency 8 > --num-requests 2: at most 2 requests were in flight"


# --- progress on long runs ------------------------------------------------------------------------------------------

def test_progress_covers_the_warm_up_and_a_long_request(fake, tmp_path, monkeypatch, capsys):
    """Before: nothing was printed during the warm-up (minutes of compilation on a GPU), nor while a request that
    takes minutes ran, since a line came only when a request finished."""
    monkeypatch.setattr(harness, "HEARTBEAT_S", 0.2)
    fake.delay = 0.1  # 10 tokens: about 1 s a request
    assert main(["run", "--url", fake.url, "--name", "slow", "--out", str(tmp_path), "--num-requests", "1",
                 "--max-tokens", "10", "--warmup", "1"]) == 0
    err = capsys.readouterr().err
    assert "[slow] warm-up: 1 untimed request(s) of 10 tokens" in err and "[slow] warm-up 1/1 done" in err
    assert "[slow] pass 1/1: 0/1 requests done, 0 tokens" in err and "1 in flight" in err
    assert "[slow] pass 1/1: 1/1 requests done, 10 tokens" in err


# test_bench_audit's fake launcher, slow to answer /health (a checkpoint loading)
_SLOW_LAUNCHER = _FAKE_LAUNCHER.replace('print("fake server starting", flush=True)',
                                        'print("loading the checkpoint", flush=True)\nimport time\ntime.sleep(3)')
assert _SLOW_LAUNCHER != _FAKE_LAUNCHER


def test_sweep_says_it_is_waiting_for_a_slow_server(tmp_path, monkeypatch, capsys):
    """Before: a server loading a large checkpoint for many minutes left the sweep silent after its launch line."""
    from sglang_eagle3.bench import __main__ as cli

    monkeypatch.setattr(cli, "STARTUP_PROGRESS_S", 0.4)
    script = tmp_path / "slow_launcher.py"
    script.write_text(_SLOW_LAUNCHER)
    launcher = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    assert main(["sweep", "--launcher", launcher, "--out", str(tmp_path / "out"), "--num-requests", "1",
                 "--max-tokens", "1", "--warmup", "0", "--config", "slow="]) == 0
    err = capsys.readouterr().err
    assert "[slow] waiting for the server to answer /health:" in err and "its log ends: loading the checkpoint" in err
    assert os.path.exists(tmp_path / "out" / "slow.json")
