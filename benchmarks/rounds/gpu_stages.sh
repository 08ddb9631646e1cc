# Sourced by the benchmarks/rounds/run_*.sh device scripts: the environment every GPU run needs and `stage`, which runs
# one step with its own time limit so that a step that fails or runs out of time does not stop the next.
# Results land in $OUT (the device tool brings back at most 8 files from there).
set -uo pipefail
# Every result file records GIT_COMMIT; without it the harness asks git, and the device's copy of the tree carries a
# stale .git (the thirty-seventh session's k4 recorded e436d6d-dirty for 8886fef): refused, not guessed.
if [ -z "${GIT_COMMIT:-}" ]; then
  echo "GIT_COMMIT is not set: run as GIT_COMMIT=<this tree's commit, from your checkout> bash $0 PART (results record it; the device copy's own git is stale)" >&2
  exit 2
fi
export GIT_COMMIT
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

# Installs xgrammar from wheels carried in .carry/wheels (benchmarks/rounds/fetch_device_wheels.sh), never from
# the network (the device has none): packages the device already has are kept. Without them, the structured-output
# GPU test skips.
install_carried_wheels() {
  [ -d .carry/wheels ] || { echo "no .carry/wheels: xgrammar not installed"; return 0; }
  python -m pip install -q --no-index --find-links .carry/wheels xgrammar 2>&1 | grep -v -i warn | tail -3
  python -c "import xgrammar; print('xgrammar', xgrammar.__file__)" || echo "xgrammar did not install"
}
# Every round, not only the parts that ask: twice in the forty-third session and once in the forty-fourth a part that
# ran the structured-output case had not, and it skipped. (Installed once a machine: a second call finds it there.)
python -c "import xgrammar" 2>/dev/null || install_carried_wheels

# The card a call got, in $OUT/gpu.txt and printed (every round records it first).
record_gpu() {
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv > "$OUT/gpu.txt"
  cat "$OUT/gpu.txt"
}
# on_h200 PART OTHER: PART on an H200 (record_gpu's card), else OTHER: a part that only an H200 should run (its
# tables) falls back to one any card can.
on_h200() { if grep -q H200 "$OUT/gpu.txt"; then echo "$1"; else echo "$2"; fi; }

# Gather the stage logs into one round.txt (the device tool brings back at most 8 files).
collect() { for f in "$OUT"/*.log; do [ -e "$f" ] || continue; echo "##### $(basename "$f")"; cat "$f"; done > "$OUT/round.txt" && rm -f "$OUT"/*.log; }
# Nsight Compute, and its per-instruction stall reasons (cycles a warp spends per issued instruction in each).
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
STALLS=smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio
# The tables docs/BENCHMARKS.md calls current: the 61-layer verify table (1k and 8k, T = 1..8) and the kernels'.
# With T_STEP_UNIFORM=SECONDS the step table with uniform routing too (a trained router's spread: docs/BENCHMARKS.md,
# fiftieth session; ~80 s on an H100 once compiled): the three stages' limits must fit one call (600 s).
head_tables() {
  TAIL=20 stage verify_graph "${T_STEP:-300}" python benchmarks/bench_verify_graph.py --backends triton \
    --eager-iters 1 --graph-iters 30 --out "$OUT/verify_graph.json"
  if [ -n "${T_STEP_UNIFORM:-}" ]; then
    TAIL=20 stage verify_graph_uniform "$T_STEP_UNIFORM" python benchmarks/bench_verify_graph.py \
      --backends triton --eager-iters 1 --graph-iters 30 --routing uniform --out "$OUT/verify_graph_uniform.json"
  fi
  TAIL=45 stage kernels "${T_KERNELS:-240}" python benchmarks/bench_kernels.py --out "$OUT"
}

# The MoE alone at T = 1..16 over the table's configs and the variants in V (bench_moe_dot.py arguments), the best
# per T written as a table of KIND's op (gemv: gate_up, gemv_down: down), then the 61-layer step at 1k with the
# checked-in table, the settings given (--env-variants) and the sweep's table, alternating twice:
# sweep_step NAME KIND SWEEP_LIMIT STEP_LIMIT [SETTING ...].
sweep_step() {
  local name=$1 kind=$2 limit=$3 step_limit=$4; shift 4
  TAIL=130 stage "moe_$name" "$limit" python benchmarks/bench_moe_dot.py --out "$OUT/moe_$name.json" \
    --variants "gemv (table)" --tokens 1 2 4 8 16 --pools 12 384 "${V[@]}" \
    --table-path "$kind" --table-pool 0 --table-out "$OUT/${name}_table.json"
  cat "$OUT/${name}_table.json"
  local NEW="SGLANG_EAGLE3_CONFIG_TABLE=$OUT/${name}_table.json"
  TAIL=40 stage "step_$name" "$step_limit" python benchmarks/bench_verify_graph.py --backends triton \
    --contexts 1024 --tokens 1 2 4 8 --eager-iters 1 --graph-iters 30 --env-variants '' "$@" "$NEW" '' "$@" "$NEW" \
    --out "$OUT/step_$name.json"
}
