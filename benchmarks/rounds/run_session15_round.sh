#!/usr/bin/env bash
# The fifteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session15_round.sh s1
# Part "s1": the EAGLE-3 draft's attention on a Triton kernel (the MLA split kernel serving grouped-query
# attention; until now the draft ran the torch reference, which gathers the whole page table every step): its GPU
# tests and the MLA ones on the same kernel, the CUDA engine and graph runner tests (every engine test drafts
# through it now), then bench_draft_step.py: the op alone and one draft forward as a graph, torch reference vs
# kernel, at 1k / 8k / 32k contexts with the page table as wide as the context and as a 128k server's, and the
# kernel's tuning candidates (--sweep).
# Part "s2": end to end on the Kimi slice (baseline, EAGLE-3 k=3 at accept 3.0) with a 128k context limit (every
# graph's page table 131072 slots wide, as a server's), the draft's attention on the torch reference and on the
# kernel, one process each; then the same at the benchmark's usual limit (prompt + new tokens + 64).
# Part "s3": MLA (the target's attention) at 1k..128k contexts in a 131072-slot page table, split-plan and tile
# variants (bench_small_ops.py --mla-variants --mla-cases).
# Parts "s4", "s5": narrower key tiles, deeper pipelines, rows padded for warpgroup MMA (each header below).
# Part "s6": the whole single-GPU suite.
# Part "s7": the 61-layer step (decode, verify of 4) at 32k and 128k contexts.
# Part "s8": the MLA layer's eager prefill on the kernel: engine / graph runner GPU tests, reference vs kernel.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: s1 .. s8}

case $part in
s1)
  TAIL=8 stage attn_tests 120 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 110 \
    tests/kernels/test_kernels_gpu.py -k "gqa or draft or mla"
  TAIL=8 stage engine_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 190 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=70 stage draft_step 240 python benchmarks/bench_draft_step.py --sweep --out "$OUT/draft_step.json"
  ;;
s2)
  for attn in torch triton; do
    TAIL=6 stage e2e_128k_$attn 170 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 \
      --max-new-tokens 96 --repeat 2 --simulate-accept 3.0 --context-length 131072 --draft-attention $attn \
      --out "$OUT/e2e_128k_$attn.json"
  done
  TAIL=6 stage e2e_short 150 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --out "$OUT/e2e_short.json"
  ;;
s3)
  # MLA at long contexts in a 128k server's page table (the tables were swept at 1k and 8k): split-plan and tile
  # variants over the sm_90 table's config, alternating twice.
  TAIL=80 stage mla_long 300 python benchmarks/bench_small_ops.py --out "$OUT/mla_long.json" --repeat 2 \
    --mla-cases 1:1024:131072 1:8192:131072 1:32768:131072 1:131000:131072 4:8192:131072 4:32768:131072 \
      1:32768:32768 \
    --mla-variants '' ctas_per_sm=2 ctas_per_sm=4 num_stages=3 num_stages=3,ctas_per_sm=2 \
      BLOCK_N=32,ctas_per_sm=2 num_warps=4,ctas_per_sm=2 min_keys_per_split=256
  ;;
s4)
  # s3 at dff4f49: the table's config is the best of those variants from 1k to 32k; at 128k 3 stages and 2
  # programs a SM gain 14% but lose 35% at 1k. Here: narrower key tiles, deeper pipelines.
  TAIL=80 stage mla_long2 300 python benchmarks/bench_small_ops.py --out "$OUT/mla_long2.json" --repeat 2 \
    --mla-cases 1:1024:131072 1:8192:131072 1:32768:131072 1:131000:131072 4:8192:131072 4:32768:131072 \
    --mla-variants '' BLOCK_N=32,num_stages=3 BLOCK_N=32,num_stages=4 BLOCK_N=32,num_stages=4,ctas_per_sm=2 \
      BLOCK_N=16,num_stages=6 BLOCK_N=32,num_stages=4,num_warps=4 num_stages=3,ctas_per_sm=2,min_keys_per_split=512
  ;;
s5)
  # s4 at 082e8b5: narrower key tiles and deeper pipelines lose at every long context (the table's 64-key tiles
  # at 2 stages stay best to 32k): the split loop is bound per iteration, not by bytes in flight. Here the rows
  # padded to 64 (min_block_m=64), so Triton takes Hopper's warpgroup MMA with both operands in shared memory
  # (offline: no spills at 8 warps, 221 KB of shared memory) instead of mma.sync reloading q and p every key tile.
  TAIL=80 stage mla_wgmma 300 python benchmarks/bench_small_ops.py --out "$OUT/mla_wgmma.json" --repeat 2 \
    --mla-cases 1:1024:131072 1:8192:131072 1:32768:131072 1:131000:131072 4:1024:8448 4:8192:131072 \
      4:32768:131072 1:1024:8448 \
    --mla-variants '' min_block_m=64,BLOCK_M=64 min_block_m=64,BLOCK_M=64,BLOCK_N=32,num_stages=3 \
      min_block_m=64,BLOCK_M=64,ctas_per_sm=2 min_block_m=64,BLOCK_M=64,min_keys_per_split=256
  # (s5 at 8a75292: slower everywhere, 128k 70 -> 93 us, 1k 7.6 -> 10.8; the min_block_m knob was removed after it.)
  ;;
s6)
  # The whole single-GPU suite at the session's end (the draft kernel, the KV pool sized to memory).
  TAIL=12 stage gpu_suite 560 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
s7)
  # The 61-layer step at long contexts (decode and verify of 4 at 32k and 128k): MLA's share, against the floor
  # (which counts the context's latent cache).
  TAIL=12 stage step_long 280 python benchmarks/bench_verify_graph.py --backends triton --contexts 32768 131072 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph_long.json"
  ;;
s8)
  # The MLA layer's ragged (eager) prefill now runs the kernel per request (it ran the reference, which scores every
  # slot of the page table): the graph runner and engine GPU tests, then one prompt's MLA, reference vs kernel,
  # in a 131072-slot table.
  TAIL=8 stage engine_tests 220 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_cuda_engine.py tests/test_graph_runner.py
  TAIL=8 stage mla_prefill 150 python benchmarks/bench_small_ops.py --out "$OUT/mla_prefill.json" \
    --mla-prefill 256 1024 4096
  ;;
*)
  echo "unknown part $part"; exit 2 ;;
esac
collect
