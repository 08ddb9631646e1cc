#!/usr/bin/env bash
# Wheels the device machine lacks and cannot download (it has no network), fetched here into .carry/wheels (ignored
# by git; pass carry: [".carry"] to the device call). Today: xgrammar and what it needs beyond the device's own
# packages (torch, triton, transformers, numpy are there), so that the structured-output GPU test runs there
# instead of skipping. The device's Python is 3.12 (KINDS.md); gpu_stages.sh's install_carried_wheels installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.carry/wheels
mkdir -p "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$dest" \
  xgrammar==0.2.9 apache-tvm-ffi==0.1.15.post2 pydantic==2.13.4 pydantic-core==2.46.4 annotated-types \
  typing-inspection
ls -la "$dest"
