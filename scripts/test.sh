#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: its three tiers (docs/testing.md, "Three tiers"),
# tests/unit (one process each: no mpirun, dpurun, subprocess or worker process), tests/jobs (real mpirun
# and dpurun jobs with host and DPU ranks, oversubscribed on small machines, and other processes) and
# tests/cluster (root set-ups: emulated machines, an aarch64 DPU through qemu, Slurm). Extra arguments go
# to pytest (e.g. -k handshake, or a folder: bash scripts/test.sh tests/jobs).
#
#   bash scripts/test.sh --unit [pytest arguments]     (or DPUOFFLOAD_TEST_TIER=unit)
# runs the unit tier alone, about 25 s of pytest on this 2-core box: the set-up of the main venv, the lint
# and the type check as below, but no MPICH, aarch64, Slurm or minimum-Python environment and no docs
# build, then pytest on tests/unit only.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TIER=${DPUOFFLOAD_TEST_TIER:-all}
if [ "${1:-}" = "--unit" ]; then
  TIER=unit
  shift
fi
case "$TIER" in
  all|unit) ;;
  *) echo "test.sh: DPUOFFLOAD_TEST_TIER=$TIER: 'all' (the default) or 'unit'" >&2; exit 2 ;;
esac
bash "$ROOT/scripts/setup.sh"
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
cd "$ROOT"
# No package index (DPUOFFLOAD_WHEELS set, e.g. a GPU node: docs/quickstart.md "A GPU node with its own
# torch"): the extra environments below need one (or apt-get), so they are off unless asked for, and
# their tests say so.
if [ -n "${DPUOFFLOAD_WHEELS:-}" ]; then
  export DPUOFFLOAD_TEST_MPICH=${DPUOFFLOAD_TEST_MPICH:-0} DPUOFFLOAD_TEST_AARCH64=${DPUOFFLOAD_TEST_AARCH64:-0} \
    DPUOFFLOAD_TEST_SLURM=${DPUOFFLOAD_TEST_SLURM:-0} DPUOFFLOAD_TEST_MIN_PYTHON=${DPUOFFLOAD_TEST_MIN_PYTHON:-0}
  echo "test.sh: no package index (DPUOFFLOAD_WHEELS): no MPICH, aarch64, Slurm or minimum-Python environment; their tests skip"
fi
# A second venv on MPICH (PyPI's wheel, Hydra's mpiexec) sharing the first one's torch through a
# .pth file, so tests/jobs/test_mpich.py runs real MPMD jobs under MPICH too (~1 min the first time;
# DPUOFFLOAD_TEST_MPICH=0 skips it and those tests say so).
if [ "$TIER" = all ] && [ "${DPUOFFLOAD_TEST_MPICH:-1}" = "1" ]; then
  DPUOFFLOAD_VENV="$ROOT/.venv-mpich" DPUOFFLOAD_MPI=mpich-wheel DPUOFFLOAD_HOROVOD=0 \
    DPUOFFLOAD_TORCH_FROM="$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")" \
    bash "$ROOT/scripts/setup.sh"
fi
# An aarch64 venv run through qemu-user (scripts/aarch64.sh: sysroot, binfmt handler, torch 2.9.1 CPU
# wheels; ~2.5 min and ~0.8 GB the first time, seconds after), so the mixed-architecture tests run the
# DPU program as a real aarch64 process on an aarch64 emulated machine (scripts/nodes.sh up h0 d0:aarch64).
# DPUOFFLOAD_TEST_AARCH64=0 skips it and those tests say so; without root it cannot be made (apt-get,
# binfmt_misc), and they say that instead.
if [ "$TIER" = all ] && [ "${DPUOFFLOAD_TEST_AARCH64:-1}" = "1" ]; then
  if [ "$(id -u)" = 0 ]; then
    bash "$ROOT/scripts/aarch64.sh" setup
  else
    echo "test.sh: not root: no aarch64 environment (scripts/aarch64.sh needs apt-get and binfmt_misc); its tests skip"
  fi
fi
export DPUOFFLOAD_TEST_AARCH64=${DPUOFFLOAD_TEST_AARCH64:-1}
# A real Slurm: Debian's slurm-wlm 22.05 and munge (scripts/slurm.sh install: apt-get, ~15 s the first
# time, nothing after), so tests/cluster/test_slurm_cluster.py sbatches dpurun jobs on a Slurm cluster of
# emulated machines that it brings up and takes down. DPUOFFLOAD_TEST_SLURM=0 skips it and those tests
# say so; without root, or where the packages cannot be installed, they say that instead.
if [ "$TIER" = all ] && [ "${DPUOFFLOAD_TEST_SLURM:-1}" = "1" ]; then
  if [ "$(id -u)" = 0 ]; then
    bash "$ROOT/scripts/slurm.sh" install || echo "test.sh: Slurm could not be installed (above): its tests skip"
  else
    echo "test.sh: not root: no Slurm (scripts/slurm.sh needs apt-get and network namespaces); its tests skip"
  fi
fi
export DPUOFFLOAD_TEST_SLURM=${DPUOFFLOAD_TEST_SLURM:-1}
# Lint first (ruff settings in pyproject.toml): findings fail the test command before any test runs.
if [ -x "$VENV/bin/ruff" ]; then
  "$VENV/bin/ruff" check .
else
  echo "test.sh: no ruff in $VENV (set up offline?): the lint is skipped"
fi
# The type check (scripts/typecheck.sh: mypy on the product, pyproject.toml [tool.mypy]): findings fail it.
bash "$ROOT/scripts/typecheck.sh"
# The docs (mkdocs.yml, docs/): a strict build, so a broken link or anchor fails; into a temporary
# directory, so nothing is left in the tree. A venv set up offline (DPUOFFLOAD_WHEELS) may have no MkDocs.
if [ "$TIER" = unit ]; then
  echo "test.sh: --unit: the docs are not built"
elif [ -x "$VENV/bin/mkdocs" ]; then
  SITE=$(mktemp -d)
  "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$SITE" || { rm -rf "$SITE"; exit 1; }
  rm -rf "$SITE"
else
  echo "test.sh: no mkdocs in $VENV (set up offline?): the docs are not built; tests/jobs/test_docs_build.py skips it too"
fi
# The minimum Python (3.10, pyproject.toml) byte-compiles the project and runs the torch-free tests.
if [ "$TIER" = all ] && [ "${DPUOFFLOAD_TEST_MIN_PYTHON:-1}" = "1" ]; then
  bash "$ROOT/scripts/test-min-python.sh"
fi
# The project's bytecode, written once here: with PYTHONDONTWRITEBYTECODE set (as on this box and its CI)
# no import ever saves it, so every rank and every dpurun command the suite starts compiled the
# project again: a 1 + 1-rank job spent 9.24 s of CPU without, 8.95 s with (RESULTS.md, "Measurements
# by hand"). Python reads these files whatever that variable says, and skips any a later edit made stale.
"$VENV/bin/python" -m compileall -q -j 0 api common host dpu launch benchmarks examples tests >/dev/null
# Three pytest workers on the two cores by default, one test file each at a time (--dist loadfile, so
# the jobs a file's tests share run once), in lanes (tests/conftest.py): two workers take the job files
# that keep the cores busy, longest first, and the third the unit tier and the jobs that mostly wait
# (emulated machines, Slurm, peer timeouts), so the waits fill the busy jobs' gaps; a busy worker with no
# busy file left takes a waiting one, never the other way round (docs/testing.md).
# DPUOFFLOAD_TEST_WORKERS=0 runs the tests in this one process (easier to read when debugging).
# The 25 slowest tests are listed at the end: where the suite's time goes (target: 20 minutes on 2 cores).
WORKERS=${DPUOFFLOAD_TEST_WORKERS:-3}
if [ "$TIER" = unit ]; then
  set -- tests/unit "$@"
fi
# DPUOFFLOAD_TEST_CENSUS=FILE: the CPU seconds of every process the suite starts, by kind and test file
# (tests/census.py; docs/testing.md).
CENSUS=()
if [ -n "${DPUOFFLOAD_TEST_CENSUS:-}" ]; then
  CENSUS=("$VENV/bin/python" -m tests.census "$DPUOFFLOAD_TEST_CENSUS" --)
fi
exec "${CENSUS[@]}" "$VENV/bin/python" -m pytest -ra --durations=25 -n "$WORKERS" --dist loadfile "$@"
