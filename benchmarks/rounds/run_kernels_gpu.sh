#!/usr/bin/env bash
# One device call: GPU kernel tests at real shapes, then the benchmark with the sm_90 config sweep.
# Everything lands in $OUT (<= 8 files): gpu.txt, gpu_tests.log, bench.log, kernels.json, sweep.json,
# sweep_table.json. Usage (repo root, on the GPU machine): OUT=/some/dir bash benchmarks/rounds/run_kernels_gpu.sh
set -o pipefail
export PYTHONUNBUFFERED=1
: "${OUT:?set OUT to the output folder}"
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)" >> "$OUT/gpu.txt" 2>&1
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu tests/kernels -q -p no:cacheprovider -o addopts="" \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -n 25
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_kernels.py --out "$OUT" ${BENCH_ARGS:---sweep} \
  2>&1 | tee "$OUT/bench.log"
