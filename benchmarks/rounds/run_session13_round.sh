#!/usr/bin/env bash
# The thirteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session13_round.sh p1
# Part "p1": prefill as CUDA graphs (ModelRunner.prefill: a prompt replays the smallest token bucket that holds
# it, padded; the draft's extend over it likewise). The graph runner (a new test: prefill replays against the
# ragged eager prefill and against their own function), CUDA engine and overlap GPU tests; the Kimi rank slice's
# prefill eager and as a graph at 256 / 1024 / 2048 tokens (bench_moe_tile.py --prefill, alternating twice in one
# process); end to end on the Kimi slice with prefill graphs off and on, alternating twice in one process.
# (p1 at c25b58b: 16 of the 29 engine / graph / overlap tests FAILED: a batch of prompts prefilled as one replay
# per request kept each replay's output rows as views into the graphs' shared memory pool, which the next replay
# overwrote; fixed in 411cdaa (rows copied out per replay). The benchmarks run one request at a time, whose path
# copied its rows (torch.cat of one), so their numbers stand: the slice's 256-token prefill 126-148 ms eager ->
# 50.7-50.8 ms as a graph (1024: 157 -> 117.6, 2048: 335 -> 220.5); end to end at 96 new tokens, prefill graphs
# off / on alternating twice: baseline 161.0 / 148.0 -> 185.6 / 188.7 tok/s, EAGLE-3 k=3 accept 3.0 269.9 / 275.7
# -> 334.3 / 337.2, first step 117-166 ms -> 46.6-48.2 ms.)
# Part "p2": the whole single-GPU suite (prefill graphs are on by default in every GPU engine test now).
# (p2 at 411cdaa: 309 passed, 1 skipped.)
# Part "p3": the INT4 MoE tile path (batches above 128 tokens: prefill) loading 2 or 4 scale groups a step instead
# of 1 (config key groups_per_step, tables written here from sm_90.json): its GPU tests with 4 a step, then
# bench_moe_tile.py (the MoE at 256 / 512 / 2048 tokens, uniform routing, and the 61-layer prefill as a graph at
# 256 / 2048) with 1, 2 and 4 a step, alternating twice.
# (p3 at 34c9cf3: the tile tests passed at 4 a step (60), but both wider steps were SLOWER: MoE at T=256 / 512 /
# 2048 1230 / 1573 / 3175 us at 1 a step, 1283 / 1825 / 3696 at 2, 1366 / 1809 / 3602-3625 at 4; the prefill
# graph at 256 / 2048 tokens 50.0-50.2 / 216.0-216.4 ms at 1, 52.0 / 241.0 at 2, 54.4-54.6 / 237.2-237.3 at 4.
# Removed (code in 34c9cf3): the tile kernels are not short of bytes in flight.)
# Part "p4": long prompts prefill in chunks of the largest bucket: the graph runner (the prefill test now also
# chunks a 250-token prompt at a 128-token largest bucket) and CUDA engine GPU tests; the slice's prefill at 1024 /
# 2048 / 4096 tokens eager and as graphs with buckets 256 and 1024 (so 2048 and 4096 go in 1024-token chunks).
# (p4 at 1454f2a: 24 GPU tests passed; prefill 1024 / 2048 / 4096 tokens eager 156-158 / 334-335 / 862 ms, as
# graphs 116.4-117.0 / 237.0-237.7 (two chunks; one 2048-token graph was 216.0-220.6 in p1 and p3) / 498.1 ms.)
# Part "p5": prompts admitted together replay ONE prefill graph (batch bucket x token bucket, at most the largest
# bucket's tokens); the engine / graph runner GPU tests (the prefill test's batch of three is one replay of
# bucket 4 x 256 now), then the slice's prefill of 4 x 200 and 8 x 100 tokens: eager (one ragged extend), one
# batched replay, and a replay a prompt.
# (p5 at 8677f1e: 24 GPU tests passed; but the benchmark's context (the prompt + a page) dropped the 1024-token
# bucket and with it the batch graphs (their token cap was the largest bucket within the context): both runs
# replayed a prompt at a time, 4 x 200 tokens 198.6-199.1 ms against 227.2-227.8 eager, 8 x 100 510.2-510.4 ms
# against 313.7-314.1 eager: a replay a prompt reads the experts once a prompt. The cap is the largest
# configured bucket since.)
# Part "p6": p5's two benchmarks again.
# (p6 at cbcb10c: one replay for the batch: 4 x 200 tokens 121.8 ms (a prompt at a time 199.5-199.6, eager
# 207.6 / 251.4), 8 x 100 tokens 121.1-121.3 ms (a prompt at a time 510.2-510.3, eager 292.7 / 446.7).)
# Part "p7": consecutive prompts of an admitted batch grouped into replays (ef96a97): the engine and graph runner
# GPU tests again. (p7 at 79e7c1f: 24 passed.)
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: p1 .. p7}

case $part in
p1)
  TAIL=8 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py tests/test_overlap.py
  TAIL=8 stage prefill 150 python benchmarks/bench_moe_tile.py --out "$OUT" --label prefill --tokens \
    --prefill 256 1024 2048
  TAIL=12 stage e2e_kimi 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --prefill-graphs none default --repeat-variants 2 --out "$OUT/e2e_prefill.json"
  ;;
p2)
  TAIL=12 stage gpu_suite 540 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
p3)
  for d in 2 4; do
    python - "$d" > "/tmp/step$d.json" <<'PY'
import json, sys
t = json.load(open("sglang_eagle3/kernels/configs/sm_90.json"))
for op in ("fused_moe_int4_gate_up", "fused_moe_int4_down"):
    t["ops"][op] = [dict(c, groups_per_step=int(sys.argv[1])) for c in t["ops"][op]]
print(json.dumps(t))
PY
  done
  SGLANG_EAGLE3_CONFIG_TABLE=/tmp/step4.json TAIL=6 stage tile_tests_step4 150 python -m pytest -q -p no:cacheprovider \
    -o addopts="" -m gpu --timeout 120 tests/kernels/test_kernels_gpu.py -k "fused_moe_int4 or moe_align"
  for i in 1 2; do
    for d in 1 2 4; do
      table=$([ $d = 1 ] && echo "" || echo "/tmp/step$d.json")
      SGLANG_EAGLE3_CONFIG_TABLE=$table TAIL=6 stage "tile_step${d}_$i" 150 python benchmarks/bench_moe_tile.py \
        --out "$OUT/step${d}_$i" --label "step${d}_$i" --tokens 256 512 2048 --gemv-max 0 --prefill 256 2048
    done
  done
  python - "$OUT" <<'PY'
import glob, json, os, shutil, sys
runs = {os.path.basename(os.path.dirname(f)): json.load(open(f)) for f in sorted(glob.glob(sys.argv[1] + "/step*/*.json"))
        if os.path.basename(f).startswith("moe_tile")}
json.dump(runs, open(os.path.join(sys.argv[1], "tile_steps.json"), "w"), indent=1)
for d in glob.glob(sys.argv[1] + "/step*"):
    shutil.rmtree(d)
for name, r in runs.items():
    moe = " ".join(f"T={m['T']}:{m['us']:.0f}us" for m in r["moe"])
    pre = " ".join(f"{p['tokens']}:{p.get('graph_ms')}ms" for p in r["prefill"])
    print(f"{name}: moe {moe} | prefill graph {pre}")
PY
  ;;
p4)
  TAIL=6 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=8 stage prefill_chunks 200 python benchmarks/bench_moe_tile.py --out "$OUT" --label chunks --tokens \
    --prefill 1024 2048 4096 --prefill-buckets 256 1024
  ;;
p5)
  TAIL=6 stage engine_tests 240 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  ;&
p6)
  TAIL=4 stage prefill_batch4 120 python benchmarks/bench_moe_tile.py --out "$OUT" --label batch4 --tokens \
    --prefill 200 --prefill-buckets 256 1024 --prefill-batch 4
  TAIL=4 stage prefill_batch8 120 python benchmarks/bench_moe_tile.py --out "$OUT" --label batch8 --tokens \
    --prefill 100 --prefill-buckets 128 1024 --prefill-batch 8
  ;;
p7)
  TAIL=6 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
