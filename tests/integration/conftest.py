"""Shared fixtures for the SGLang overlay tests.

Tests marked ``sglang`` need SGLang 0.5.23 importable (run them with ``bash .ci/run_sglang_tests.sh``);
elsewhere they are skipped with the reason below. Importing SGLang takes ~12 s, so the decision uses
``find_spec`` and the real import happens once, inside the fixtures.
"""

from __future__ import annotations

import importlib.util

import pytest

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
SKIP_REASON = ("sglang is not importable in this environment; run these with "
               "`bash .ci/install_sglang.sh && bash .ci/run_sglang_tests.sh`")
needs_sglang = pytest.mark.skipif(not HAVE_SGLANG, reason=SKIP_REASON)


@pytest.fixture
def overlay():
    """The overlay module, removed again after the test whatever happened."""
    from sglang_eagle3.integration import sglang_overlay

    sglang_overlay.remove()
    yield sglang_overlay
    sglang_overlay.remove()
