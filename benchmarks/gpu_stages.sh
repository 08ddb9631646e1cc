# Sourced by the benchmarks/run_*.sh device scripts: the environment every GPU run needs and `stage`, which runs
# one step with its own time limit so that a step that fails or runs out of time does not stop the next.
# Results land in $OUT (the device tool brings back at most 8 files from there).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# NVLink multicast stays off on the lent machines (device notes, KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"

stage() {  # stage NAME SECONDS CMD...: log to $OUT/NAME.log, print its last TAIL lines (warnings dropped)
  local name=$1 limit=$2; shift 2
  echo "=== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; echo "=== $name exit $?" | tee -a "$OUT/$name.log"
  grep -v -i "warn" "$OUT/$name.log" | tail -n "${TAIL:-12}"
}

# Gather the stage logs into one round.txt (the device tool brings back at most 8 files).
collect() { for f in "$OUT"/*.log; do echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log; }
# Nsight Compute, and its per-instruction stall reasons (cycles a warp spends per issued instruction in each).
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
STALLS=smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
# The tables docs/BENCHMARKS.md calls current: the 61-layer verify table (1k and 8k, T = 1..8) and the kernels'.
head_tables() {
  TAIL=20 stage verify_graph "${T_STEP:-300}" python benchmarks/bench_verify_graph.py --backends triton \
    --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  TAIL=45 stage kernels "${T_KERNELS:-240}" python benchmarks/bench_kernels.py --out "$OUT"
}
