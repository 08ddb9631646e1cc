#!/usr/bin/env bash
# One round on the lent H200: GPU tests of the runtime (graphs, fallback accounting, TP=1 workers) and the
# verify-graph benchmark. Run through the device tool from the repo root; results land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" | tee -a "$OUT/gpu.txt"
timeout 200 python -m pytest -q -p no:cacheprovider -o addopts="" -m gpu tests/gpu ${EXTRA_TESTS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
timeout 300 python benchmarks/bench_verify_graph.py --out "$OUT/verify_graph.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/verify_graph.log"
