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
# One pytest process by default. DPUOFFLOAD_TEST_WORKERS=2 runs two workers, one test file each at a
# time (--dist loadfile, so the jobs a file's tests share run once): on 2 cores that saved only 12 %
# (18.0 vs 20.5 min; the CPU is already busy) and puts two jobs' load on every timing, so it is not
# the default.
WORKERS=${DPUOFFLOAD_TEST_WORKERS:-0}
exec "$VENV/bin/python" -m pytest -ra -n "$WORKERS" --dist loadfile "$@"
