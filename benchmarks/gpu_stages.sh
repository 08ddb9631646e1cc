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
