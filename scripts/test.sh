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
exec "$VENV/bin/python" -m pytest -ra "$@"
