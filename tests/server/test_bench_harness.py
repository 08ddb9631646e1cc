"""The end-to-end benchmark harness against a real server: metrics, provenance, side-by-side compare."""

from __future__ import annotations

import copy

from sglang_eagle3.bench.harness import compare_table, provenance_diff, run_workload


def test_harness_measures_and_records_provenance(server):
    res = run_workload(server.url, name="eagle3", prompts=["And God said,", "In the beginning"], num_requests=3,
                       concurrency=2, max_tokens=12, warmup=1)
    m = res["metrics"]
    assert m["requests_ok"] == 3 and m["requests_failed"] == 0
    assert m["output_tokens"] == 3 * 12  # ignore_eos: every request runs to max_tokens
    assert m["end_to_end_output_tok_per_s"] > 0 and m["mean_ttft_ms"] > 0
    assert m["server_accept_length"] is not None and m["server_accept_length"] >= 1.0
    assert m["server_verify_batches_graph"] + m["server_verify_batches_eager"] > 0
    assert m["server_num_steps_after"] == 3 and m["server_adaptive_after"] is None  # (the session server: fixed k)
    prov = res["provenance"]
    assert prov["server_args"]["speculative_num_steps"] == 3 and prov["model"]["layers"] > 0
    assert prov["server_kind"] == "sglang_eagle3" and prov["client_git_commit"] and prov["time_utc"]
    # TP=1: the model runs in the server process, whose environment is the worker's; the server's own commit
    assert [w["rank"] for w in prov["worker_env"]] == [0] and prov["worker_env"][0]["pid"] > 0
    assert prov["server_git_commit"] == prov["client_git_commit"]  # one checkout here

    other = copy.deepcopy(res)
    other["name"] = "baseline"
    other["provenance"]["server_args"]["speculative_algorithm"] = None
    other["provenance"]["worker_env"][0]["env"]["NCCL_P2P_DISABLE"] = "1"
    diffs = provenance_diff([res, other])
    assert any("speculative_algorithm" in d for d in diffs)
    assert any("NCCL_P2P_DISABLE" in d and 'baseline="1"' in d for d in diffs), diffs
    table = compare_table([other, res])
    assert "| eagle3 |" in table and "1.00x" in table
