#!/usr/bin/env bash
# Run tests/integration inside the SGLang venv made by .ci/install_sglang.sh (installs it when missing).
# Extra arguments go to pytest, e.g. `bash .ci/run_sglang_tests.sh -k overlay -x`.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SGLANG_VENV:-${REPO_ROOT}/.venv-sglang}"
bash "${REPO_ROOT}/.ci/install_sglang.sh"
cd "${REPO_ROOT}"
# SGLang warns about every CPU-unsupported quantization method at import; keep the log readable.
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::UserWarning}"
exec "${VENV}/bin/python" -m pytest -q tests/integration -p no:cacheprovider "$@"
