#!/usr/bin/env bash
# Idempotent set-up of everything hetsync needs on a fresh Debian machine.
#   - Debian packages: OpenMPI (libopenmpi-dev, openmpi-bin), g++, cmake, openssh-server and iproute2 (the
#     emulated cluster), chromium and chromium-driver (the documentation site's browser check)
#   - a virtual environment (default .venv/ at the repository root) with the pinned Python stack
#   - horovod 0.28.1 built from source once per TensorFlow version, its wheel cached outside the
#     repository (keyed by horovod, TensorFlow and Python versions)
#   - hetsync itself (editable), which compiles the op library in tf_ops/
# A second run takes seconds: every step checks before it acts.
#
# Variables (the Makefile passes them: `make deps VENV=.venv-tf218 TF_VERSION=2.18.1`):
#   HETSYNC_VENV        path of the virtual environment (default: .venv at the repository root)
#   HETSYNC_TF_VERSION  tensorflow-cpu version (default below); one venv holds one TF version
#   HETSYNC_CACHE       wheel cache (default ~/.cache/hetsync)
#
# TensorFlow 2.19 and newer: horovod 0.28.1 (its last release) does not build against their wheels
# unmodified. Its only failing file on CPU builds, horovod/tensorflow/xla_mpi_ops.cc, holds nothing
# but includes outside HAVE_GPU, and those includes are missing from the wheel's include path:
# highwayhash and farmhash sit under include/external/..., and xla/client/xla_builder.h moved to
# xla/hlo/builder/xla_builder.h. build_horovod() adds those directories through CXXFLAGS and
# generates a one-line forwarding header for the old xla_builder.h path in a temporary directory;
# horovod's sources are not touched. cmake must be Debian's (3.x): cmake 4 from PyPI rejects gloo's
# cmake_minimum_required.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${HETSYNC_VENV:-${ROOT}/.venv}"
case "$VENV" in /*) ;; *) VENV="${ROOT}/${VENV}" ;; esac
PY="${VENV}/bin/python"
TF_VERSION="${HETSYNC_TF_VERSION:-2.21.0}"
[[ "$TF_VERSION" =~ ^2\.[0-9]+\.[0-9]+$ ]] || { echo "[deps] HETSYNC_TF_VERSION must look like 2.N.M, got '${TF_VERSION}'" >&2; exit 2; }
TF_MINOR="$(echo "$TF_VERSION" | cut -d. -f2)"
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
# the emulated multi-host cluster (hetsync-cluster): an sshd per emulated host; ip and tc (iproute2)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v tc >/dev/null 2>&1 || need_apt+=(iproute2)
# the documentation site's browser check (make test-full): Debian's chromium and its chromedriver
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium-driver)
if [ "${#need_apt[@]}" -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  # no service is started by the install (openssh-server would start an sshd on this machine's port 22;
  # the cluster starts its own, one per emulated host, on the hosts' addresses only)
  policy_rc=/usr/sbin/policy-rc.d
  own_policy=0
  if [ ! -e "$policy_rc" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy_rc" >/dev/null && $SUDO chmod +x "$policy_rc" && own_policy=1
  fi
  install_rc=0
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" || install_rc=$?
  if [ "$own_policy" -eq 1 ]; then $SUDO rm -f "$policy_rc"; fi
  [ "$install_rc" -eq 0 ] || exit "$install_rc"
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

# Build the horovod wheel into $1 against the TensorFlow installed in the venv.
build_horovod() {
  local wheeldir="$1" extra_cxxflags="" shim="" rc=0
  local cmake_bin
  cmake_bin="$(command -v cmake)"
  case "$("$cmake_bin" --version | head -1)" in
    "cmake version 3."*) ;;
    *) echo "[deps] horovod ${HOROVOD_VERSION} needs cmake 3.x (gloo's cmake_minimum_required); $cmake_bin is" \
            "'$("$cmake_bin" --version | head -1)'. Put Debian's cmake (/usr/bin/cmake) first on PATH." >&2
       return 1 ;;
  esac
  if [ "$TF_MINOR" -ge 19 ]; then
    local tf_inc
    tf_inc="$("$PY" -c 'import os, tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)"
    shim="$(mktemp -d)"
    # Forwarding headers: the old paths of the XLA builder (horovod includes
    # tensorflow/compiler/xla/client/xla_builder.h), pointing at where TF >= 2.19 ships it.
    local old_path
    for old_path in tensorflow/compiler/xla/client/xla_builder.h xla/client/xla_builder.h; do
      if [ ! -e "${tf_inc}/${old_path}" ] && [ -e "${tf_inc}/xla/hlo/builder/xla_builder.h" ]; then
        mkdir -p "${shim}/$(dirname "$old_path")"
        printf '%s\n' '// Generated by hetsync scripts/deps.sh: xla_builder.h moved in TensorFlow 2.19+.' \
          '#include "xla/hlo/builder/xla_builder.h"' > "${shim}/${old_path}"
      fi
    done
    extra_cxxflags="-I${shim} -I${tf_inc}/external/highwayhash -I${tf_inc}/external/farmhash_archive/src"
    log "TensorFlow ${TF_VERSION}: extra CXXFLAGS for horovod: ${extra_cxxflags}"
  fi
  # --no-cache-dir: pip's own wheel cache is keyed by the sdist, not by the TensorFlow it was built
  # against, and would hand a TF 2.18 build to a TF 2.21 venv (undefined absl symbols at import).
  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_CMAKE="$cmake_bin" \
  CXXFLAGS="${CXXFLAGS:-} ${extra_cxxflags}" \
  MAKEFLAGS="-j$(nproc)" \
    "${PIP[@]}" wheel --no-cache-dir --no-build-isolation --no-deps -w "$wheeldir" "horovod==${HOROVOD_VERSION}" || rc=$?
  [ -z "$shim" ] || rm -rf "$shim"
  return $rc
}

# 3. horovod from source, wheel cached ----------------------------------------------
# horovod's compiled library is tied to the TensorFlow it was built against: the venv records that
# version, and a venv switched to another TensorFlow gets the matching wheel.
HVD_MARK="${VENV}/.hetsync-horovod-tf"
horovod_works() {  # horovod's TensorFlow ops load against this TensorFlow, with MPI and Gloo
  "$PY" -c 'import horovod.tensorflow as h, sys; sys.exit(0 if h.mpi_built() and h.gloo_built() else 1)' >/dev/null 2>&1
}
if ! have horovod "$HOROVOD_VERSION" || [ "$(cat "$HVD_MARK" 2>/dev/null)" != "$TF_VERSION" ] || ! horovod_works; then
  PYTAG="$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')"
  WHEELDIR="${CACHE}/horovod-${HOROVOD_VERSION}-tf${TF_VERSION}-${PYTAG}"
  mkdir -p "$WHEELDIR"
  if ! ls "$WHEELDIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building horovod ${HOROVOD_VERSION} against tensorflow-cpu ${TF_VERSION} from source (about 5 minutes, once; cached in ${WHEELDIR})"
    build_horovod "$WHEELDIR"
  fi
  log "installing horovod from ${WHEELDIR}"
  "${PIP[@]}" install --force-reinstall --no-deps "$WHEELDIR"/horovod-*.whl
  "${PIP[@]}" install "$WHEELDIR"/horovod-*.whl  # its own dependencies (cloudpickle, psutil, pyyaml)
  horovod_works || { echo "[deps] horovod from ${WHEELDIR} does not load against tensorflow-cpu ${TF_VERSION}" \
    "(or lacks MPI/Gloo); delete that folder and rerun" >&2; exit 1; }
  echo "$TF_VERSION" > "$HVD_MARK"
fi

# 4. hetsync itself (compiles tf_ops/ against the installed TensorFlow) ---------------
log "installing hetsync (editable)"
"${PIP[@]}" install --no-build-isolation --no-deps -e "$ROOT"
"$PY" -c 'import hetsync.ops; hetsync.ops.load_library()' 
log "ready: ${PY}"
