#!/usr/bin/env bash
# Idempotent set-up of everything hetsync needs on a fresh Debian machine.
#   - Debian packages: OpenMPI (libopenmpi-dev, openmpi-bin), g++, cmake
#   - .venv/ at the repository root with the pinned Python stack
#   - horovod 0.28.1 built from source once, its wheel cached outside the repository
#   - hetsync itself (editable), which compiles the op library in tf_ops/
# A second run takes seconds: every step checks before it acts.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROOT}/.venv"
PY="${VENV}/bin/python"
TF_VERSION="${HETSYNC_TF_VERSION:-2.18.1}"
HOROVOD_VERSION="0.28.1"
MPI4PY_VERSION="4.1.2"
CACHE="${HETSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hetsync}"

log() { printf '[deps] %s\n' "$*"; }

# 1. Debian packages -------------------------------------------------------------
need_apt=()
command -v mpicc >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
if [ "${#need_apt[@]}" -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

# 2. Virtual environment ------------------------------------------------------------
if [ ! -x "$PY" ]; then
  log "creating ${VENV}"
  python3 -m venv "$VENV"
fi
PIP=("$PY" -m pip --disable-pip-version-check -q)

have() {  # have DIST VERSION -> 0 if the exact version is installed in .venv
  "$PY" - "$1" "$2" <<'PYEOF'
import sys
from importlib import metadata
try:
    sys.exit(0 if metadata.version(sys.argv[1]) == sys.argv[2] else 1)
except metadata.PackageNotFoundError:
    sys.exit(1)
PYEOF
}

if ! have tensorflow-cpu "$TF_VERSION" || ! have mpi4py "$MPI4PY_VERSION"; then
  log "installing tensorflow-cpu==${TF_VERSION}, mpi4py==${MPI4PY_VERSION} and the Python stack"
  "${PIP[@]}" install --upgrade "pip<26" setuptools wheel packaging
  "${PIP[@]}" install "tensorflow-cpu==${TF_VERSION}" "mpi4py==${MPI4PY_VERSION}"
fi
"${PIP[@]}" install -r "${ROOT}/requirements-dev.txt"

# 3. horovod from source, wheel cached ----------------------------------------------
if ! have horovod "$HOROVOD_VERSION"; then
  PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  WHEELDIR="${CACHE}/horovod-${HOROVOD_VERSION}-tf${TF_VERSION}-${PYTAG}"
  mkdir -p "$WHEELDIR"
  if ! ls "$WHEELDIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod ${HOROVOD_VERSION} from source (about 5 minutes, once; cached in ${WHEELDIR})"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
    MAKEFLAGS="-j$(nproc)" \
      "${PIP[@]}" wheel --no-build-isolation --no-deps -w "$WHEELDIR" "horovod==${HOROVOD_VERSION}"
  fi
  log "installing horovod from ${WHEELDIR}"
  "${PIP[@]}" install "$WHEELDIR"/horovod-*.whl
fi

# 4. hetsync itself (compiles tf_ops/ against the installed TensorFlow) ---------------
log "installing hetsync (editable)"
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"
"$PY" -c 'import hetsync.ops; hetsync.ops.load_library()' 
log "ready: ${PY}"
