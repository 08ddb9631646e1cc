#!/usr/bin/env bash
# Create (or reuse) the SGLang test environment: .venv-sglang at the repo root, holding
# sglang==0.5.23 from PyPI, our package (editable, no deps) and pytest.
#
# Idempotent: when the venv already has sglang 0.5.23 importable and our package installed, it
# only refreshes the editable install (seconds). A fresh install takes ~4.5 minutes and ~11 GB
# (sglang brings torch 2.14.1 with its CUDA wheels; /etc/xdg/pip caps torch at <=2.14.1 on the CI
# machines, which is the version sglang 0.5.23 wants).
#
# Environment knobs:
#   SGLANG_VERSION  version to install (default 0.5.23; the overlay only supports 0.5.23)
#   SGLANG_VENV     venv path (default <repo>/.venv-sglang)
#   PYTHON          interpreter used to create the venv (default python3)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
VENV="${SGLANG_VENV:-${REPO_ROOT}/.venv-sglang}"
PYTHON="${PYTHON:-python3}"
VPY="${VENV}/bin/python"

log() { echo "[install_sglang] $*" >&2; }

installed_version() {
    # Prints the installed sglang version, or nothing. Reads package metadata only: importing
    # sglang itself takes several seconds.
    "${VPY}" - <<'PY' 2>/dev/null || true
from importlib.metadata import PackageNotFoundError, version
try:
    print(version("sglang"))
except PackageNotFoundError:
    pass
PY
}

if [[ ! -x "${VPY}" ]]; then
    log "creating ${VENV} with $(${PYTHON} --version 2>&1)"
    "${PYTHON}" -m venv "${VENV}"
    "${VPY}" -m pip install --quiet --upgrade pip
fi

have="$(installed_version)"
if [[ "${have}" == "${SGLANG_VERSION}" ]]; then
    log "sglang ${have} already installed in ${VENV}; skipping the sglang install"
else
    log "installing sglang==${SGLANG_VERSION} (found: '${have:-none}'); this takes several minutes"
    "${VPY}" -m pip install --quiet "sglang==${SGLANG_VERSION}"
fi

if ! "${VPY}" -c "import pytest, pytest_timeout, pytest_benchmark" >/dev/null 2>&1; then
    log "installing pytest"
    "${VPY}" -m pip install --quiet pytest pytest-timeout pytest-benchmark
fi

# Editable install of our package without dependencies: it must not touch sglang's torch. Skipped when
# the venv already resolves sglang_eagle3 to this checkout (a fresh clone elsewhere reinstalls).
have_pkg="$(cd / && "${VPY}" -c 'import os, sglang_eagle3; print(os.path.dirname(os.path.dirname(sglang_eagle3.__file__)))' 2>/dev/null || true)"
if [[ "${have_pkg}" != "${REPO_ROOT}" ]]; then
    log "installing sglang_eagle3 (editable, --no-deps) from ${REPO_ROOT}"
    "${VPY}" -m pip install --quiet --no-deps --no-build-isolation -e "${REPO_ROOT}" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" || true
fi

# SGLang runs our plugin (setup.py entry point, group sglang.srt.plugins) in its worker processes; entry points
# live in the install metadata, so a venv installed before the entry point existed needs a reinstall. Checked
# from the repo root, as the tests run: a stale sglang_eagle3.egg-info there (a build artifact of another
# install) comes first on sys.path and hides the venv's metadata, so it is regenerated too.
has_plugin() {
    (cd "${REPO_ROOT}" && "${VPY}" -c 'import sys; from importlib.metadata import entry_points
sys.exit(not any(ep.name == "sglang_eagle3" for ep in entry_points(group="sglang.srt.plugins")))' 2>/dev/null)
}
if ! has_plugin; then
    log "registering the sglang_eagle3 SGLang plugin (editable reinstall)"
    "${VPY}" -m pip install --quiet --no-deps --no-build-isolation -e "${REPO_ROOT}" 2>&1 \
        | grep -v "is ignored: it is neither a file nor a directory" || true
    if [[ -d "${REPO_ROOT}/sglang_eagle3.egg-info" ]] && ! has_plugin; then
        log "regenerating the stale ${REPO_ROOT}/sglang_eagle3.egg-info"
        (cd "${REPO_ROOT}" && "${VPY}" setup.py --quiet egg_info >/dev/null 2>&1) || true
    fi
    has_plugin || { log "the sglang_eagle3 SGLang plugin is still not registered"; exit 1; }
fi

log "ready: $("${VPY}" -c 'import importlib.metadata as m; print("sglang", m.version("sglang"), "torch", m.version("torch"))')"
