#!/usr/bin/env bash
# The type check of the product (api, common, host, dpu, launch) with mypy at its default strictness,
# and strict on the public API (api/, checked as `dpuoffload.api`) and the planning code (common/plan/);
# settings in pyproject.toml ([tool.mypy] and its overrides). scripts/test.sh runs it after the lint;
# findings fail it. tests/unit/test_public_types.py holds the public API's signatures to no Any.
#
#   bash scripts/typecheck.sh            (about 15 s; a cache under .cache/mypy makes reruns faster)
#
# The repository root is the package `dpuoffload` (installed editable through an import hook that mypy
# does not follow), so mypy reads it through a symlink named dpuoffload in a temporary directory.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
if [ ! -x "$VENV/bin/mypy" ]; then
  echo "typecheck.sh: no mypy in $VENV (set up offline?): the type check is skipped"
  exit 0
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
ln -s "$ROOT" "$TMP/dpuoffload"
cd "$TMP"
"$VENV/bin/mypy" --config-file "$ROOT/pyproject.toml" --cache-dir "$ROOT/.cache/mypy" \
  -p dpuoffload.api -p dpuoffload.common -p dpuoffload.host -p dpuoffload.dpu -p dpuoffload.launch
