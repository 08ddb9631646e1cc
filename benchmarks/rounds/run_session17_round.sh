#!/usr/bin/env bash
# The seventeenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session17_round.sh u1
# Part "u1": MLA prefill in the non-absorbed form (kernels.mla_mha_prefill: the context's latents decompressed once
# into per-head keys and values, then the split kernel with one kv head a query head). Its GPU tests (Kimi TP=8
# shapes, a tiny model's ragged prefill over a prefix), the absorbed and the MHA form at prefill chunks of 16..1024
# tokens over fresh prompts and 4k / 16k / 32k contexts and whole 4k / 16k / 32k prompts in 1024-token chunks
# (bench_mla_prefill.py), then the MHA form's configs on three chunks.
# Part "u1b" (u1 at 336f641: MHA 2.1-2.5x faster from 4k contexts at 1024-token chunks, 32k prompt's MLA 60.5 ->
# 24.9 ms a layer, and BLOCK_N 32 / 4 warps / 3 stages 0.75 -> 0.43 ms at 16k; but 2x slower on fresh prompts,
# ~55 us whatever the size: the decompression's grid covered the 131072-slot table's 2048 tiles x 16 columns, all
# but a few exiting at once): the decompression's programs now stride over the request's tiles (4 a SM), 8 warps and
# 3 stages by default (4 warps spill on sm_120). Its GPU tests again, then both forms at 16..1024-token chunks over
# fresh prompts and 4k..32k contexts, the MHA form at the defaults and at sm_90 table candidates.
# Part "u2" (u1b at 7d8022b: fresh prompts now as fast as absorbed or faster, 16-token chunks 0.018 vs 0.021 ms;
# MHA wins from 64-token chunks, 1.02x at 4k and 1.44x at 32k, 2.3-2.6x at 1024-token chunks with 32-key tiles, 4
# warps, 3 stages; the sm_90 table takes them, 128-row blocks at 65..128 tokens): the CUDA engine and graph-runner
# tests with the MHA prefill on by default (every prompt of >= 64 tokens), both forms at the table over whole
# 4k / 16k / 32k prompts.
# Part "u3": the Kimi-shaped slice end to end: a 16k-token prompt's prefill (time to first token) with
# mha_prefill_tokens 0 (absorbed) and 64 (the default).
# Part "u4": the whole single-GPU suite at the session's code (the MHA prefill on in every engine test).
# Part "u5": end to end again, a 32k-token prompt's prefill and the usual 256-token workload (baseline and EAGLE-3 at
# accept 3.0, 96 new tokens), mha_prefill_tokens 0 and 64.
# Part "u6": the decompression's configs (K step, key tile, warps, stages, programs a SM) where it dominates (16-token
# chunks over 32k keys) and at 1024 / 256-token chunks.
# Part "u7": after the launchers' shared page-table and rope checks (b9c6019), the MLA / MHA / GQA / rope GPU tests.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: u1, u1b, u2, u3, u4, u5, u6, u7}

case $part in
u1)
  TAIL=8 stage mha_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "mha or mla_split or gqa_capacity"
  TAIL=60 stage mla_prefill 240 python benchmarks/bench_mla_prefill.py --out "$OUT/mla_prefill_mha.json"
  TAIL=40 stage mha_configs 150 python benchmarks/bench_mla_prefill.py --out "$OUT/mha_configs.json" --only-mha \
    --prompts --cases 1024:16384 256:4096 64:32768 1024:1024 \
    --variants '' BLOCK_M=128 BLOCK_N=32 num_stages=3 BLOCK_M=128,BLOCK_N=32,num_stages=3 num_warps=4,num_stages=3 \
      BLOCK_N=32,num_warps=4,num_stages=3 ctas_per_sm=2 min_keys_per_split=2048 decompress_block_n=128 \
      decompress_warps=8,decompress_block_n=128 decompress_stages=3
  ;;
u1b)
  TAIL=8 stage mha_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "mha"
  A=BLOCK_N=32,num_warps=4,num_stages=3
  TAIL=40 stage mha_table 300 python benchmarks/bench_mla_prefill.py --out "$OUT/mha_table.json" --prompts \
    --cases 16:16 64:64 128:128 256:256 1024:1024 16:4096 64:4096 128:4096 256:4096 512:4096 1024:4096 \
      16:32768 64:32768 128:32768 256:32768 512:32768 1024:32768 128:16384 1024:16384 \
    --variants '' $A BLOCK_M=128 num_warps=4,num_stages=3 BLOCK_M=128,$A $A,decompress_warps=4,decompress_stages=2 \
      $A,decompress_block_n=128 $A,decompress_ctas_per_sm=8
  ;;
u2)
  TAIL=15 stage engine_tests 330 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py
  TAIL=8 stage mha_prompts 150 python benchmarks/bench_mla_prefill.py --out "$OUT/mha_prompts.json" \
    --cases 64:64 64:4096 256:4096 1024:16384
  ;;
u3)
  TAIL=12 stage e2e_long 420 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 4 \
    --prompt-len 16384 --simulate-accept --mha-prefill-tokens 0 64 --out "$OUT/e2e_prefill_16k.json"
  ;;
u4)
  TAIL=15 stage gpu_suite 570 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 300 \
    tests/kernels tests/loaders/test_layouts.py tests/test_graph_runner.py tests/test_overlap.py tests/gpu
  ;;
u5)
  TAIL=6 stage e2e_32k 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 4 \
    --prompt-len 32768 --simulate-accept --mha-prefill-tokens 0 64 --out "$OUT/e2e_prefill_32k.json"
  TAIL=10 stage e2e_256 200 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --mha-prefill-tokens 0 64 --out "$OUT/e2e_256.json"
  ;;
u6)
  TAIL=12 stage decompress_configs 200 python benchmarks/bench_mla_prefill.py --out "$OUT/decompress_configs.json" \
    --only-mha --prompts --cases 16:32768 1024:32768 256:4096 \
    --variants '' decompress_block_k=128 decompress_block_n=32 decompress_block_n=32,decompress_warps=4 \
      decompress_block_n=128 decompress_block_n=128,decompress_stages=2 decompress_ctas_per_sm=2 \
      decompress_ctas_per_sm=8 decompress_warps=4
  ;;
u7)
  TAIL=8 stage mla_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_mla_rope_gpu.py -k "mla or mha or gqa or rope"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
