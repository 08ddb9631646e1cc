#!/usr/bin/env bash
# The sixteenth session's single-GPU calls (nvidia-h200, each <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_session16_round.sh t1
# Part "t1": MLA's split loop with the page table entries loaded one key tile ahead (until now Triton's pipeliner
# spent a stage on the page -> cache-row load chain and kept ONE buffer of key tiles at num_stages 2-4, so every
# tile waited for its own load; offline the TTGIR now has num_stages - 1 buffers). The MLA / GQA GPU tests, then
# the split kernel at 1k..128k contexts, T = 1 and 4, at the table's config (2 stages: still one buffer) and at
# configs that now double- or triple-buffer; the previous checkout's kernel at its table config beside it
# (.old: `git archive b22bb47 sglang_eagle3 benchmarks`).
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: t1}
MLA_CASES="1:1024:8448 4:1024:8448 1:8192:8448 4:8192:8448 1:32768:131072 4:32768:131072 1:131000:131072 4:131000:131072"

case $part in
t1)
  TAIL=8 stage mla_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 150 \
    tests/kernels/test_kernels_gpu.py -k "mla or gqa or draft"
  TAIL=60 stage mla_pipe 300 python benchmarks/bench_small_ops.py --out "$OUT/mla_pipe.json" --repeat 2 \
    --mla-cases $MLA_CASES \
    --mla-variants '' num_stages=3 BLOCK_N=32,num_stages=3 BLOCK_N=32,num_stages=4 \
      BLOCK_N=32,num_stages=3,ctas_per_sm=2 num_stages=3,num_warps=4
  TAIL=10 stage mla_old 100 env GIT_COMMIT=b22bb47 python .old/benchmarks/bench_small_ops.py \
    --out "$OUT/mla_old.json" --repeat 2 --mla-cases $MLA_CASES --mla-variants ''
  ;;
*)
  echo "unknown part $part"; exit 2 ;;
esac
collect
