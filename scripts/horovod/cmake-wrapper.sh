#!/usr/bin/env bash
# CMake wrapper used only while building Horovod for this platform (see scripts/setup.sh).
# On the configure call it (1) adds a compiler launcher that raises -std=gnu++14 to -std=gnu++20
# (torch >= 2.14 headers need C++20) and (2) swaps the Python used for CMake's torch probes for a
# shim that reports a CPU-only torch (the pip torch wheel is a CUDA build, and with nvcc present
# Horovod's CMake would otherwise try to build CUDA kernels). `cmake --build` passes through.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
real=${DPUOFFLOAD_REAL_CMAKE:?DPUOFFLOAD_REAL_CMAKE must point at the real cmake}
case "${1:-}" in
  --build|--install|-E|--version) exec "$real" "$@" ;;
esac
args=()
for a in "$@"; do
  case "$a" in
    -DPYTHON_EXECUTABLE=*|-DPYTHON_EXECUTABLE:*) args+=("-DPYTHON_EXECUTABLE:FILEPATH=$here/python-cpu-shim.sh") ;;
    *) args+=("$a") ;;
  esac
done
exec "$real" "-DCMAKE_CXX_COMPILER_LAUNCHER=$here/cxx20-launcher.sh" "${args[@]}"
