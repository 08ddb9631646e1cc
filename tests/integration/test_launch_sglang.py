"""`launch_server --backend sglang` applies the overlay, then runs SGLang's own launcher with the rest."""

from __future__ import annotations

from tests.integration.conftest import needs_sglang


@needs_sglang
def test_launch_sglang_applies_overlay_and_hands_flags_to_sglang(overlay, capsys):
    from sglang_eagle3.integration.launch import launch_sglang

    rc = launch_sglang(["--help"])  # SGLang's argparse prints its help and exits 0
    assert rc == 0
    assert overlay.is_applied()
    assert "--speculative-num-draft-tokens" in capsys.readouterr().out


def test_graph_buckets_cover_max_running_requests(monkeypatch):
    from sglang_eagle3.integration.launch import close_common_fallbacks

    monkeypatch.delenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", raising=False)
    assert close_common_fallbacks(["--model-path", "m", "--max-running-requests", "48"])[-2:] == \
        ["--cuda-graph-max-bs", "48"]
    assert close_common_fallbacks(["--max-running-requests=48", "--cuda-graph-max-bs", "8"]) == \
        ["--max-running-requests=48", "--cuda-graph-max-bs", "8"]  # the user's choice wins
    assert close_common_fallbacks(["--model-path", "m"]) == ["--model-path", "m"]
    monkeypatch.setenv("SGLANG_EAGLE3_KEEP_GRAPH_BS", "1")
    assert close_common_fallbacks(["--max-running-requests", "48"]) == ["--max-running-requests", "48"]
