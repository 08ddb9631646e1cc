"""The public kernel ops' argument checks and the torch references' edge cases, on CPU (no interpreter: these
run the reference path or stop before a launch). Kept apart from test_kernels_interpret.py, whose module-scoped
case runner reads every parametrized test of its module as a kernel case."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("kw,needle", [
    (dict(top_k=9, n_group=4, topk_group=2), "exceeds the 8 experts"),
    (dict(top_k=2, n_group=4, topk_group=0), "topk_group"),
    (dict(top_k=2, n_group=0, topk_group=1), "n_group"),
    (dict(top_k=0, n_group=1, topk_group=1), "top_k"),
    (dict(top_k=2, n_group=16, topk_group=2), ">= 2 experts a group"),
    (dict(top_k=2, n_group=3, topk_group=1), "divisible"),
])
def test_cpu_routing_is_checked_as_the_kernel(kw, needle):
    """The reference path (CPU's default) routed impossible configurations silently (ids from dropped groups)."""
    import torch

    from sglang_eagle3 import kernels

    with pytest.raises(AssertionError, match=needle):
        kernels.moe_topk(torch.randn(3, 16), None, **kw)


def test_reference_routing_breaks_ties_as_the_kernel():
    """Lowest id first among equal scores (the kernel's documented order): torch.topk's tie order is unspecified."""
    import torch

    from sglang_eagle3 import kernels

    T, E, k = 40, 48, 8
    logits = torch.randint(0, 3, (T, E)).float() * 0.5  # many exact ties
    _, ids = kernels.ref_moe_topk(logits, None, top_k=k, n_group=1, topk_group=1)
    s = logits.sigmoid()
    for t in range(T):
        assert ids[t].tolist() == sorted(range(E), key=lambda i, t=t: (-s[t, i].item(), i))[:k]


def test_references_take_an_empty_batch():
    import torch

    from sglang_eagle3.kernels import ref

    E, I, H, k = 4, 8, 16, 2
    w13, w2 = torch.randn(E, 2 * I, H), torch.randn(E, H, I)
    ids, w = torch.zeros(0, k, dtype=torch.int32), torch.zeros(0, k)
    assert ref.ref_fused_moe(torch.zeros(0, H), w13, w2, w, ids).shape == (0, H)


def test_mla_widths_the_kernel_cannot_take_go_to_the_reference(monkeypatch):
    from sglang_eagle3 import kernels

    monkeypatch.setattr(kernels, "_kernel_ok", lambda *a, **k: True)  # as on a GPU
    assert kernels.mla_uses_kernel(64, 512)
    assert not kernels.mla_uses_kernel(24, 512)  # a rope width tl.dot cannot take (it raised inside the launcher)
    assert not kernels.mla_uses_kernel(64, 96)
    with pytest.raises(AssertionError, match="nothing to rotate"):
        kernels.apply_rotary(None, None, None, None, None, interleaved=True)
