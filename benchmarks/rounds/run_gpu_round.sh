#!/usr/bin/env bash
# One round on the lent H200, in stages with their own time limits (a stage that fails or runs out of time
# does not stop the next): GPU tests of the runtime and kernels, the verify-graph benchmark on a Kimi-K2.5
# rank slice, end-to-end tokens/s of the embedded pair, and the Kimi-shaped slice with pinned accept length.
# Run through the device tool from the repo root; results land in $OUT (8 files at most come back).
source "$(dirname "$0")/gpu_stages.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), torch.cuda.device_count())" \
  | tee -a "$OUT/gpu.txt"
stage gpu_tests "${T_TESTS:-140}" python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu \
  tests/kernels/test_kernels_gpu.py tests/test_graph_runner.py
stage verify_graph "${T_VERIFY:-110}" python benchmarks/bench_verify_graph.py --backends triton --eager-iters 3 \
  --graph-iters 20 --out "$OUT/verify_graph.json"
stage e2e_embedded "${T_E2E:-70}" python benchmarks/bench_e2e.py --num-prompts 8 --max-new-tokens 64 \
  --out "$OUT/e2e_embedded.json"
stage e2e_kimi "${T_KIMI:-130}" python benchmarks/bench_e2e.py --kimi-slice --num-prompts 2 --max-new-tokens 48 \
  --out "$OUT/e2e_kimi_slice.json"
