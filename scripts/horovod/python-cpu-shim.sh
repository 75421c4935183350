#!/usr/bin/env bash
# Python shim for Horovod's CMake probes: runs `-c CODE` with torch.version.cuda hidden, so the
# probes see the CPU-only build we want (the CUDA torch wheel runs fine on the CPU).
py=${DPUOFFLOAD_SHIM_PYTHON:?DPUOFFLOAD_SHIM_PYTHON must point at the venv python}
if [ "${1:-}" = "-c" ]; then
  code=$2; shift 2
  exec "$py" -c "import torch; torch.version.cuda = None
$code" "$@"
fi
exec "$py" "$@"
