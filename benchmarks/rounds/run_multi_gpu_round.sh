#!/usr/bin/env bash
# Multi-GPU calls (issue 10), on the device tool's nvidia-h200-x2 (each call <= 10 min):
#   GIT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/rounds/run_multi_gpu_round.sh m1
# Part "m1": the machine (GPUs, topology, NCCL), the TP GPU tests (TP=2 == TP=1 with graphs on the embedded pair and
# a Kimi-like pair in fp32; TP=2 on the kernels with a Kimi-layout INT4 checkpoint: speculation lossless, first
# logprob within bf16 of TP=1), the all-reduce benchmark (eager and in-graph, 1..64 tokens x 7168, NCCL
# settings including peer access off) and the Kimi TP=8 rank-slice step, alone on GPU 0 and then on both GPUs with
# its all-reduces over NCCL (decode and verify of 4 and 8 at 1k and 8k).
# Part "m2": the step with peer access off (NCCL_P2P_DISABLE=1: through host memory, nearer a PCIe box without
# peer access) and the end-to-end Kimi slice, baseline vs EAGLE-3 at pinned accept lengths, alone and on 2 GPUs;
# the embedded pair end to end at TP=1 and TP=2; the TP=2 INT4 kernels test again (m1 compared bf16 TP=2 with bf16
# TP=1 on a model so peaky that bf16 rounding alone flips its argmax; now against fp32 at weight scale 1).
# (m1 at 1737818: 4 TP tests passed, the INT4 one failed as said; all-reduce in a graph 10.3-10.8 us for 1-8
# tokens by default over NVLink (NV18), 17-27 us with peer access off; the step: 122 all-reduces, decode 4.92 ->
# 6.48 ms at 1k, verify of 4 6.50 -> 8.13 (1.56-1.69 ms more, about 13 us an all-reduce).)
# (m2 at 3d28beb: the INT4 test passed; the step with peer access off 7.14-12.27 ms; end to end, the Kimi slice
# baseline 155.8 -> 118.7 tok/s from one GPU to two, EAGLE-3 at accept 3.0 261.5 -> 198.0; docs/BENCHMARKS.md 5.)
# Part "m3": the TP GPU tests again once the greedy speculative round became one CUDA graph (NCCL inside it).
# (m3 at 095d3b5: 5 passed.)
source "$(dirname "$0")/gpu_stages.sh"
part=${1:?part: m1, m2 or m3}
STEP=(python benchmarks/bench_verify_graph.py --backends triton --contexts 1024 8192 --tokens 1 4 8 --eager-iters 2
      --graph-iters 30)

case $part in
m1)
  stage machine 40 bash -c 'nvidia-smi; nvidia-smi topo -m; python -c "import torch; print(torch.cuda.device_count(),
    torch.__version__, torch.cuda.nccl.version())"'
  TAIL=20 stage tp_tests 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_tp_cuda.py tests/distributed/test_ranks.py
  TAIL=60 stage allreduce 110 python benchmarks/bench_allreduce.py --gpus 2 --out "$OUT/allreduce.json"
  TAIL=8 stage step_1gpu 120 env CUDA_VISIBLE_DEVICES=0 "${STEP[@]}" --out "$OUT/step_1gpu.json"
  TAIL=8 stage step_2gpu 140 "${STEP[@]}" --comm-gpus 2 --out "$OUT/step_2gpu.json"
  ;;
m2)
  TAIL=8 stage tp_int4_test 150 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 140 \
    tests/gpu/test_tp_cuda.py -k int4
  TAIL=8 stage step_2gpu_p2poff 200 env NCCL_P2P_DISABLE=1 "${STEP[@]}" --comm-gpus 2 --out "$OUT/step_2gpu_p2poff.json"
  E2E=(python benchmarks/bench_e2e.py --kimi-slice --num-prompts 3 --max-new-tokens 96 --repeat 2)
  TAIL=8 stage e2e_1gpu 150 env CUDA_VISIBLE_DEVICES=0 "${E2E[@]}" --out "$OUT/e2e_kimi_1gpu.json"
  TAIL=8 stage e2e_2gpu 170 "${E2E[@]}" --comm-gpus 2 --out "$OUT/e2e_kimi_2gpu.json"
  TAIL=10 stage e2e_embedded_tp 120 bash -c "python benchmarks/bench_e2e.py --ks 3 --num-prompts 4 --repeat 2 \
    --out $OUT/e2e_embedded_tp1.json && python benchmarks/bench_e2e.py --ks 3 --num-prompts 4 --repeat 2 \
    --tp-size 2 --out $OUT/e2e_embedded_tp2.json"
  ;;
m3)
  TAIL=12 stage tp_tests 280 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu --timeout 200 \
    tests/gpu/test_tp_cuda.py tests/distributed/test_ranks.py
  ;;
*) echo "unknown part $part"; exit 2 ;;
esac
collect
