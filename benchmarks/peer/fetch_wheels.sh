#!/usr/bin/env bash
# Re-creates .whl/ (repo root): the wheels benchmarks/bench_peer_mla.py needs on the GPU machine that its image
# lacks, at pinned versions and hashes. That machine has no network: .whl/ travels with the working tree (it is
# git-ignored, so the device run must carry it) and is installed there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     .whl/*.whl && export PYTHONPATH=/tmp/site
#
# flashinfer-python 0.6.0 (released 2026-01-07) is pure Python; its kernels are compiled there by nvcc + ninja
# on first use. Its Requires-Dist, and where each one comes from:
#   apache-tvm-ffi>=0.1.6,<0.2   fetched: 0.1.7 (2025-12-28), the newest release when 0.6.0 came out; the JIT'd
#                                kernels compile against its headers. cp312-abi3 wheel.
#   nvidia-cudnn-frontend>=1.13  left out: only cuDNN attention/GEMM paths use it, and flashinfer imports it
#                                inside try/except (cudnn/*.py, gemm/gemm_base.py); MLA never touches it.
#   nvidia-cutlass-dsl>=4.3.4    left out: hundreds of MB (CuTe DSL for Blackwell GEMMs / fp4 norms), imported
#                                only inside try/except ImportError (norm.py); MLA never touches it.
#   click einops ninja numpy nvidia-ml-py packaging requests tabulate torch tqdm: on the GPU machine already.
#   Imported but undeclared: jinja2, filelock, typing-extensions: torch's own dependencies, so present.
# Usage (needs network; run here, not there): bash benchmarks/peer/fetch_wheels.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="$ROOT/.whl"
# spec  file  sha256
WHEELS=(
  "flashinfer-python==0.6.0 flashinfer_python-0.6.0-py3-none-any.whl e8be4fd2f9229a7faef411579439eebc6c6dc54893d62bd50498f374cd04cc16"
  "apache-tvm-ffi==0.1.7 apache_tvm_ffi-0.1.7-cp312-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl fbbf87df625930bafbd979c2c510d5bd989e9171098e5bb65320d0e7336d0095"
)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
for entry in "${WHEELS[@]}"; do
  read -r spec file sha <<< "$entry"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DEST" "$spec"
  echo "$sha  $DEST/$file" | sha256sum -c --quiet
done
# git ignores .whl/ (.gitignore has it too); keep it out of commits in this clone either way.
EXCLUDE="$ROOT/.git/info/exclude"
if [ -d "$ROOT/.git" ]; then
  mkdir -p "$(dirname "$EXCLUDE")"
  grep -qxF '/.whl/' "$EXCLUDE" 2>/dev/null || echo '/.whl/' >> "$EXCLUDE"
fi
ls -l "$DEST"
du -ch "$DEST"/*.whl | tail -n 1
