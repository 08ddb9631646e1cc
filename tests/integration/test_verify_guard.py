"""Verify-path accounting and strict mode, through SGLang's real ModelRunner._forward_raw and
DecodeCudaGraphRunner.can_run_graph (objects built with object.__new__; only execute() is faked)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace as NS

import pytest

from .conftest import needs_sglang

pytestmark = [needs_sglang, pytest.mark.sglang]

MAX_BS, WIDTH = 8, 4


@pytest.fixture
def sg(overlay, monkeypatch):
    """Overlay applied (verify guard only) + a target ModelRunner wired to a decode graph runner."""
    import torch
    from sglang.srt.model_executor import model_runner as mr_mod
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    overlay.apply(moe_routing=False, draft_wiring=False, worker_env=False)
    # _forward_raw enters SGLang's runtime-context config bag, which only a launched server publishes.
    monkeypatch.setattr(mr_mod, "get_model", lambda: NS(override=lambda **kw: contextlib.nullcontext()))

    runner = object.__new__(DecodeCudaGraphRunner)
    runner.__dict__.update(
        ragged_verify_mode=False, captured_req_width=WIDTH, require_mlp_tp_gather=False, enable_pdmux=False,
        disable_padding=False, max_bs=MAX_BS, require_mlp_sync=False, is_encoder_decoder=False,
        enable_two_batch_overlap=False, record_nolora_graph=False,
        model_runner=NS(is_draft_worker=False, spec_algorithm=NS(is_ngram=lambda: False)))
    runner.execute = lambda fb, pp_proxy_tensors=None: "graph"
    model_runner = object.__new__(ModelRunner)
    model_runner.__dict__.update(
        model=NS(shared_experts_config=None), attn_backend=None, device="cuda", decode_cuda_graph_runner=runner,
        hisparse_coordinator=None, prefill_cuda_graph_runner=None, is_draft_worker=False,
        pp_group=NS(is_last_rank=True), eager_runner=NS(execute=lambda fb, pp_proxy_tensors=None: "eager"))
    model_runner._prepare_eager_forward_batch = lambda fb: None
    model_runner._maybe_execute_deferred_mamba_cow_and_clear = lambda fb: None

    def batch(bs, width=WIDTH, mode=ForwardMode.TARGET_VERIFY):
        return NS(forward_mode=mode, replace_embeds=None, spec_info=NS(num_tokens_per_req=width), batch_size=bs,
                  global_num_tokens_cpu=None, moe_num_token_non_padded=None, input_ids=torch.zeros(bs * width))

    return NS(overlay=overlay, runner=runner, model_runner=model_runner, batch=batch, ForwardMode=ForwardMode)


def run(sg, fb):
    return sg.model_runner._forward_raw(fb, None).logits_output


def test_counts_graph_and_each_fallback_reason(sg):
    assert run(sg, sg.batch(4)) == "graph"
    assert run(sg, sg.batch(MAX_BS)) == "graph"
    assert run(sg, sg.batch(16)) == "eager"  # above the largest captured batch
    assert run(sg, sg.batch(2, width=3)) == "eager"  # a width the runner in place was not captured for
    stats = sg.overlay.verify_stats()
    assert (stats["graph"], stats["prefill_graph"], stats["eager"], stats["total"]) == (2, 0, 2, 4)
    assert stats["reasons"] == {
        "batch size 16 > max captured batch size 8 (raise --cuda-graph-max-bs-decode)": 1,
        "draft width mismatch: 3 tokens per request vs 4 captured "
        "(the runner in place was captured for another --speculative-num-draft-tokens)": 1}
    assert stats["max_fallback_bs"] == 16


def test_non_verify_forwards_and_draft_workers_are_not_counted(sg):
    run(sg, sg.batch(4, width=1, mode=sg.ForwardMode.DECODE))
    sg.model_runner.is_draft_worker = True
    assert run(sg, sg.batch(4)) == "graph"
    assert sg.overlay.verify_stats()["total"] == 0


def test_graphs_disabled_and_prefill_graph_paths(sg, monkeypatch):
    import sglang.srt.model_executor.model_runner as mr_mod
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    sg.model_runner.decode_cuda_graph_runner = None  # --disable-cuda-graph
    assert run(sg, sg.batch(4)) == "eager"
    # A captured piecewise prefill graph that admits the batch (its real eligibility needs capture buckets).
    prefill = object.__new__(PrefillCudaGraphRunner)
    prefill.can_run_graph = lambda fb: True
    prefill.execute = lambda fb, **kw: "prefill"
    sg.model_runner.__dict__.update(prefill_cuda_graph_runner=prefill, device_timer=None)
    sg.model_runner._extend_forward_kwargs = lambda fb, pp: {}
    monkeypatch.setattr(mr_mod, "_prefill_cuda_graph_allows_context_parallel", lambda runner, fb: True)
    fb = sg.batch(4)
    fb.token_indices_to_pool = None
    assert run(sg, fb) == "prefill"
    stats = sg.overlay.verify_stats()
    assert (stats["graph"], stats["prefill_graph"], stats["eager"]) == (0, 1, 1)
    (reason, count), = stats["reasons"].items()
    assert count == 2 and reason.startswith("no decode CUDA graph runner")


def test_strict_mode_raises_before_any_fallback(sg):
    from sglang_eagle3.integration.verify_guard import VerifyFallbackError

    sg.overlay.apply(strict_verify=True, moe_routing=False, draft_wiring=False, worker_env=False)
    assert run(sg, sg.batch(4)) == "graph"
    sg.model_runner.eager_runner = NS(execute=lambda *a, **k: pytest.fail("eager ran in strict mode"))
    with pytest.raises(VerifyFallbackError, match=r"batch size 9 > max captured batch size 8"):
        run(sg, sg.batch(9))
    # eagle_prepare_for_verify's own can_run_graph call is where SGLang asks first: it raises there too.
    with pytest.raises(VerifyFallbackError, match="draft width mismatch"):
        sg.runner.can_run_graph(sg.batch(2, width=5))
    sg.model_runner.decode_cuda_graph_runner = None
    with pytest.raises(VerifyFallbackError, match="no decode CUDA graph runner"):
        run(sg, sg.batch(1))
    assert sg.overlay.verify_stats()["graph"] == 1


def test_dp_attention_fallback_reason_uses_the_largest_dp_batch(sg):
    """DP attention (require_mlp_tp_gather): SGLang's can_run_graph sizes the graph by the largest batch of any DP
    rank, so a rank with a small batch falls back when another rank's batch is above the captured size; the reason
    must say so (it said "condition not identified" on every rank but the largest)."""
    sg.runner.__dict__.update(require_mlp_tp_gather=True, require_mlp_sync=True)
    fb = sg.batch(2)
    fb.original_global_num_tokens_cpu = [2, MAX_BS + 4]  # per-rank request counts; this rank has 2
    fb.can_run_decode_cuda_graph = True  # every rank voted for the decode graph (a verify batch)
    assert sg.runner.can_run_graph(fb) is False  # SGLang's own decision: eager
    fb_ok = sg.batch(2)
    fb_ok.original_global_num_tokens_cpu = [2, MAX_BS]
    fb_ok.can_run_decode_cuda_graph = True
    assert run(sg, fb_ok) == "graph"
    assert run(sg, fb) == "eager"
    stats = sg.overlay.verify_stats()
    assert stats["reasons"] == {
        f"largest batch across DP ranks {MAX_BS + 4} > max captured batch size {MAX_BS} "
        "(raise --cuda-graph-max-bs-decode)": 1}


def test_padding_disabled_reason_names_the_failing_condition(sg):
    """--disable-cuda-graph-padding: only captured sizes replay (the backend decides). A size that was not captured
    is named with the captured ones; a captured size that fails DP attention's sync vote gets that reason (it was
    reported as "no graph captured (padding disabled)" whatever failed)."""
    sizes = [1, 2, 4, 8]
    sg.runner.__dict__.update(disable_padding=True, capture_bs=sizes, attention_graph_variants=None,
                              backend=NS(can_run=lambda fb, key: key.size in sizes))
    assert run(sg, sg.batch(4)) == "graph"
    assert run(sg, sg.batch(3)) == "eager"
    sg.runner.require_mlp_sync = True
    fb = sg.batch(2)
    fb.can_run_decode_cuda_graph = False  # another DP rank cannot run the decode graph this step
    assert sg.runner.can_run_graph(fb) is False  # SGLang's own decision
    assert run(sg, fb) == "eager"
    assert sg.overlay.verify_stats()["reasons"] == {
        "no graph captured for batch size 3 (padding disabled; captured: 1, 2, 4, 8)": 1,
        "DP/MLP sync: another rank cannot run the decode graph this step": 1}
