#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite: unit tests and real mpirun jobs with host and
# DPU ranks (oversubscribed on small machines). Extra arguments go to pytest (e.g. -k handshake).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
cd "$ROOT"
# Lint first (ruff settings in pyproject.toml): findings fail the test command before any test runs.
"$VENV/bin/ruff" check .
# The minimum Python (3.10, pyproject.toml) byte-compiles the project and runs the torch-free tests.
bash "$ROOT/scripts/test-min-python.sh"
# Two pytest workers (DPUOFFLOAD_TEST_WORKERS; 0 = one process): an MPI test spends much of its wall
# time in start-up and in sleeping waits on peers, so a second job fills the gaps. Each test file
# stays on one worker (--dist loadfile) so the jobs a file's tests share run once.
WORKERS=${DPUOFFLOAD_TEST_WORKERS:-2}
exec "$VENV/bin/python" -m pytest -ra -n "$WORKERS" --dist loadfile "$@"
