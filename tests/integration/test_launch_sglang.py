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
