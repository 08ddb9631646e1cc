#!/usr/bin/env bash
# The eighteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_session18_round.sh w1
# Part "w1": the INT4 GEMV MoE's gate_up with its chunk loop pipelined through shared memory (config num_stages > 1:
# the loop carries num_stages, so Triton's pipeliner copies the weight chunks asynchronously, cp.async, instead of
# the two chunks the kernel prefetches by hand into registers; 80-96 registers instead of 179 at the T=1 config).
# Its GPU tests, a sweep of staged configs against the table's at T = 1..16 (bench_moe_dot.py, uniform routing and
# tokens sharing 12 experts) writing the best per T as a table, then the 61-layer step with that table against the
# checked-in one, alternating twice in one process.
# Part "w2" (w1 at 851bdc6, whose num_stages key is no longer read: every staged config slower at every T, e.g. T=1 14.2-36.8 us against 12.9-14.4 for the
# table's, T=2 23.4 against 21.5, T=8 65.7 against 64.8; the step unchanged, so the staged loop was removed): the
# gate_up's dots in packed fp16 (config F16: HFMA2, two weights an op; ~3.0 SASS instructions a weight against ~4.2,
# 2.55-2.7 at 16-32 rows a program). Its GPU tests (the inline PTX bit-identical to its plain-op emulation), a sweep
# of F16 configs against the table's fp32 ones at T = 1..16 writing the best per T as a table, then the 61-layer
# step with that table against the checked-in one, alternating twice in one process.
# Part "w3" (w2 at 7f57fae: F16 faster from T=2, T = 2 / 4 / 8 / 16 over 12 shared experts 21.5 / 36.5 / 64.7 /
# 124.3 -> 19.2 / 31.3 / 52.0 / 96.2 us, uniform 23.9 / 39.3 / 67.7 / 126.9 -> 22.0 / 35.0 / 59.5 / 105.0; slower
# at T=1, 12.9 -> 14.6; the step's verify T = 2 / 4 / 8 2-8% faster; its 4 new GPU tests failed on an import):
# the sm_90 table now takes F16 at every T (T=1 too, so that decode and verify run one arithmetic) with 128-word
# chunks in every bucket. The MoE GPU tests, the CUDA engine and graph-runner tests, then the step with the table
# against the previous one (benchmarks/data/sm_90_gemv_fp32_table.json), alternating twice.
# Part "w4" (w3 at f40776f: MoE tests 69 passed, engine and graph-runner tests 25 passed; the step with the F16 table
# against the previous, medians of two alternations: 1k decode 4.82 vs 4.89 ms, verify T = 2 / 4 / 8 5.35 / 6.19 /
# 7.50 vs 5.43 / 6.50 / 8.28; 8k 4.90 vs 5.02, 5.44 / 6.50 / 7.94 vs 5.59 / 6.71 / 8.51): the other GPU tests that
# run the INT4 MoE (PDL, overlaps, the Kimi layouts), then end to end, the Kimi slice baseline and EAGLE-3 at a pinned
# accept length 3.0 with the F16 table and the previous one.
# Part "w5" (w4 at da1264d: 20 passed; end to end F16 table / previous, one pass each: baseline 190.5 / 183.9 tok/s,
# EAGLE-3 at accept 3.0 365.1 / 363.3, both inside their repeats' spread): the remaining kernel GPU tests, then end
# to end again, the two tables alternating twice.
# Part "w6" (w5 at bd6ab22: 230 kernel tests passed; end to end, two alternations, EAGLE-3 at accept 3.0 376.0 / 375.0
# tok/s with the F16 table against 361.9 / 367.7, baseline 190.3 / 191.3 against 190.8 / 193.3): the F16 decode
# now turns the odd nibbles' 1024 + 16q into q - 8 with one HFMA2 by 1/16 and -72 (was: an HSUB2 of 1152, with x
# scaled by another 1/16, which made x below 2^-4 subnormal in fp16): the MoE GPU tests (the PTX against its
# emulation), the table against explicit fp32 configs at T = 1..8, and the step at 1k against the previous table.
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: w1, w2, w3, w4, w5, w6}

# The MoE tests, then a sweep of gate_up configs (each "BLOCK_N,BLOCK_W,num_warps[,num_stages]" plus SUFFIX) against
# the table's at T = 1..16 writing the best per T as a table, then the 61-layer step with that table against the
# checked-in one, alternating twice: moe_sweep_step NAME "CONFIGS" SUFFIX.
moe_sweep_step() {
  local name=$1 configs=$2 suffix=$3 V=() bn bw w s
  TAIL=8 stage moe_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "int4"
  for c in $configs; do
    IFS=, read -r bn bw w s <<< "$c"
    V+=(--gemv-config "BLOCK_N=$bn,BLOCK_W=$bw,num_warps=$w${s:+,num_stages=$s}$suffix")
  done
  TAIL=120 stage "moe_$name" 240 python benchmarks/bench_moe_dot.py --out "$OUT/moe_$name.json" \
    --variants "gemv (table)" --tokens 1 2 4 8 16 --pools 12 384 "${V[@]}" \
    --table-path gemv --table-pool 0 --table-out "$OUT/gemv_${name}_table.json"
  cat "$OUT/gemv_${name}_table.json"
  local NEW="SGLANG_EAGLE3_CONFIG_TABLE=$OUT/gemv_${name}_table.json"
  TAIL=40 stage "step_$name" 300 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$NEW" '' "$NEW" \
    --out "$OUT/step_$name.json"
}

case $part in
w1)
  moe_sweep_step staged "16,128,8,3 16,128,8,4 8,128,4,3 8,128,4,4 8,128,8,4 16,64,4,4 8,64,2,4 4,128,2,4 16,64,8,6
    8,64,4,6" ""
  ;;
w2)
  moe_sweep_step f16 "16,128,8 8,128,4 16,128,4 32,128,8 32,64,4 16,64,4 8,64,2 16,64,2 4,128,2 32,128,4" ",F16=1"
  ;;
w3)
  TAIL=8 stage moe_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "int4"
  TAIL=15 stage engine_tests 300 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 280 \
    tests/test_graph_runner.py tests/gpu/test_cuda_engine.py
  OLD="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gemv_fp32_table.json"
  TAIL=40 stage step_table 240 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 \
    --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD" '' "$OLD" \
    --out "$OUT/step_table.json"
  ;;
w4)
  TAIL=8 stage other_tests 180 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 170 \
    tests/kernels/test_pdl_gpu.py tests/test_overlap.py tests/loaders/test_layouts.py
  OLD="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gemv_fp32_table.json"
  TAIL=12 stage e2e_table 260 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' "$OLD" --out "$OUT/e2e_table.json"
  ;;
w5)
  TAIL=8 stage kernel_tests 250 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/kernels/test_kernels_gpu.py tests/kernels/test_fold_gpu.py tests/kernels/test_mla_rope_gpu.py -k "not int4"
  OLD="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gemv_fp32_table.json"
  TAIL=12 stage e2e_table2 300 python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 \
    --repeat 2 --simulate-accept 3.0 --env-variants '' "$OLD" --repeat-variants 2 --out "$OUT/e2e_table2.json"
  ;;
w6)
  TAIL=8 stage moe_tests 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/kernels/test_kernels_gpu.py -k "int4"
  TAIL=40 stage moe_table 90 python benchmarks/bench_moe_dot.py --out "$OUT/moe_table.json" \
    --variants "gemv (table)" --tokens 1 2 4 8 --pools 12 384 \
    --gemv-config BLOCK_N=16,BLOCK_W=128,num_warps=8,F16=0 --gemv-config BLOCK_N=8,BLOCK_W=128,num_warps=4,F16=0
  OLD="SGLANG_EAGLE3_CONFIG_TABLE=benchmarks/data/sm_90_gemv_fp32_table.json"
  TAIL=12 stage step_table2 120 python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 \
    --tokens 1 4 --eager-iters 1 --graph-iters 30 --env-variants '' "$OLD" --out "$OUT/step_table2.json"
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
