#!/usr/bin/env bash
# Check the minimum Python that pyproject.toml states (requires-python >= 3.10) on this machine:
# byte-compile every project file under it, install the project into a small cached venv (numpy,
# pytest, tomli; no torch, no MPI: those wheels are too large to install twice here) and run the
# torch-free tests: config parsing and config files, modes, plan/ (offload, perf model, validation
# split, naive) and the launch command. The torch and MPI paths run in the main venv only.
#
# Skipped, with the reason, when no such Python is found. Environment knobs:
#   DPUOFFLOAD_MIN_PYTHON   the interpreter (default: python3.10 on PATH, else pyenv's 3.10.x)
#   DPUOFFLOAD_MIN_VENV     its venv (default: <repo>/.cache/venv-min-python)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${DPUOFFLOAD_MIN_VENV:-$ROOT/.cache/venv-min-python}
TESTS="tests/unit/test_config.py tests/unit/test_config_file.py tests/unit/test_config_sections.py tests/unit/test_plan_pure.py
       tests/jobs/test_plan_pure.py tests/unit/test_perfmodel.py tests/unit/test_offload_plan.py tests/unit/test_validation_split.py
       tests/unit/test_roles.py tests/unit/test_launch_command.py tests/jobs/test_launch_command.py"
say() { printf '\033[1m[min-python]\033[0m %s\n' "$*"; }

is310() { [ -n "$1" ] && "$1" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; }
PY=${DPUOFFLOAD_MIN_PYTHON:-}
if [ -z "$PY" ]; then  # pyenv's shim answers for python3.10 even when 3.10 is not selected: try each
  for cand in $(command -v python3.10 || true) "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.10.*/bin/python3.10; do
    if is310 "$cand"; then PY=$cand; break; fi
  done
fi
if ! is310 "$PY"; then
  say "SKIPPED: no Python 3.10 found (set DPUOFFLOAD_MIN_PYTHON=/path/to/python3.10); only the main venv's Python was tested"
  exit 0
fi
say "$("$PY" --version) at $PY"

# Syntax of every project file (including host/dpu/torch code, which cannot run without torch here).
"$PY" - "$ROOT" <<'EOF'
import pathlib, py_compile, sys
root = pathlib.Path(sys.argv[1])
skip = {".venv", ".venv-mpich", ".venv-aarch64", ".cache", ".git", "build"}
files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
for p in files:
    source = p.read_text()
    compile(source, str(p), "exec", dont_inherit=True)  # compile only: writes no .pyc beside the sources
print(f"[min-python] {len(files)} files compile under Python {sys.version.split()[0]}")
EOF

stamp=$VENV/.stamp-$(cat "$ROOT/pyproject.toml" "$ROOT/setup.py" "$0" | sha256sum | cut -c1-16)
if [ ! -f "$stamp" ]; then
  say "creating $VENV (numpy, pytest, pytest-timeout, tomli, the project without its torch/MPI dependencies)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  pip() { "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@"; }
  pip install numpy pytest pytest-timeout tomli "setuptools>=80" wheel  # 65.5 (venv default) cannot read the version attr
  pip install --no-deps --no-build-isolation -e "$ROOT"
  touch "$stamp"
fi
cd "$ROOT"
# shellcheck disable=SC2086
# Left out: tests/jobs/test_config_file.py (it starts dpurun on generated data: needs pillow, torch), and
# deselected: a test that needs an mpirun on PATH. (tests/jobs/test_plan_pure.py and the rest of
# tests/jobs/test_launch_command.py start only a Python or a stand-in mpirun: they run here.)
NEEDS_RUNTIME="--deselect tests/jobs/test_launch_command.py::test_clone_cores_errors_name_the_fix"
"$VENV/bin/python" -m pytest -q -p no:cacheprovider $NEEDS_RUNTIME $TESTS
