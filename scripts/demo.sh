#!/usr/bin/env bash
# Set up (idempotent), write the bundled sample data once, and run a short MPMD training in
# --mode da: one host rank on core 0, and one emulated DPU rank on core 1 (throttled to half a
# core) that loads and augments the host rank's batches. Later flags override (e.g. --mode none).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
DATA=${DPUOFFLOAD_DATA:-$ROOT/.cache/data}
"$VENV/bin/dpurun" make-data "$DATA"
exec "$VENV/bin/dpurun" --host-ranks 1 --dpu-ranks 1 --dpu-speed 0.5 -- \
  --preset debug --dataset cifar10 --data "$DATA/cifar10" --mode da --log-dir "$ROOT/runs/demo" "$@"
