"""benchmarks/bench_grammar_host.py runs end to end on a small vocabulary and writes its rows (no timings
checked: speed lives in the benchmark's output)."""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("xgrammar")


def test_bench_grammar_host_writes_both_modes(tmp_path, monkeypatch):
    from benchmarks import bench_grammar_host

    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["bench_grammar_host.py", "--vocab", "6000", "--rounds", "2", "--batch", "1", "2",
                                      "--fill-threads", "2", "--out", str(out)])
    bench_grammar_host.main()
    got = json.loads(out.read_text())
    assert got["vocab"] == 6000 and got["command"].startswith("python")
    rows = got["rows"]
    names = [*bench_grammar_host.GRAMMARS, "kimi_forced", "kimi_strict_auto"]
    assert {(r["grammar"], r["batch"], r["mode"]) for r in rows} == {
        (g, b, m) for g in names for b in (1, 2) for m in ("ahead", "default", "default_t2")}
    assert all(r["rounds"] == 2 and r["serial_ms"] >= 0 and r["overlapped_ms"] >= 0 for r in rows)


def test_bench_grammar_host_runs_the_grammars_named(tmp_path, monkeypatch, capsys):
    """--grammars runs those alone (Kimi's markup among them: its markers special tokens of the synthetic
    vocabulary); an unknown name is refused, naming it."""
    from benchmarks import bench_grammar_host

    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["bench_grammar_host.py", "--vocab", "6000", "--rounds", "2", "--batch", "1",
                                      "--fill-threads", "--grammars", "kimi_forced", "json_schema", "--out", str(out)])
    bench_grammar_host.main()
    assert {r["grammar"] for r in json.loads(out.read_text())["rows"]} == {"kimi_forced", "json_schema"}
    monkeypatch.setattr(sys, "argv", ["bench_grammar_host.py", "--vocab", "6000", "--grammars", "nope"])
    with pytest.raises(SystemExit):
        bench_grammar_host.main()
    assert "--grammars nope" in capsys.readouterr().err
