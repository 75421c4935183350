#!/usr/bin/env bash
# A GPU node in one command: set up (scripts/setup.sh; offline where DPUOFFLOAD_WHEELS is set, see
# docs/quickstart.md "A GPU node with its own torch"), run the gpu-marked tests, then the issue-12
# table (benchmarks/gpu.py) for each workload, every job's line printed as it ends and each
# workload's JSON and table written to OUTDIR (the jobs so far in <workload>.partial.json while it runs: a run
# cut short keeps what it measured).
#
#   bash scripts/gpu-check.sh [OUTDIR] [WORKLOAD ...]     (default: runs/gpu-check, resnet50 shufflenet_v2)
#
# After the first workload's table: checkpoint blocking on the GPU (ours staged and overlapped, DCP
# async_save, rank-0 torch.save; OUTDIR/checkpoint-gpu.json, about a minute and a half).
# Knobs: DPUOFFLOAD_GPU_TABLE_ARGS, gpu.py's sizes (default: 8 host + 8 DPU cores at speed 0.5, epochs of
# 24 batches, short epochs of 6; 7 of resnet50's 12 jobs took 4.6 min on an H200 node on 2026-11-27).
# Without a GPU it runs the tests (they skip) and stops before the table, saying so.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUTDIR=${1:-$ROOT/runs/gpu-check}
shift || true
WORKLOADS=${*:-resnet50 shufflenet_v2}
ARGS=${DPUOFFLOAD_GPU_TABLE_ARGS:---host-cores 8 --dpu-cores 8 --dpu-speed 0.5 --long-steps 24 --short-steps 6 --short-epochs 3}
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }
mkdir -p "$OUTDIR"
say "the gpu-marked tests (log: $OUTDIR/tests.log)"
failed=()
bash "$ROOT/scripts/test.sh" -m gpu -p no:cacheprovider 2>&1 | tee "$OUTDIR/tests.log" | tail -n 15 ||
  failed+=("the gpu-marked tests")  # (the table runs anyway: a GPU lease is short)
gpu=$("$VENV/bin/python" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
if [ -z "$gpu" ]; then
  say "torch sees no GPU here: the table needs one (python benchmarks/gpu.py --device cpu --quick runs its plumbing)"
  [ ${#failed[@]} -eq 0 ]
  exit
fi
checkpoints() {  # the overlapped copy's figure: a GPU host rank's blocking per checkpoint beside DCP's
  say "checkpoints on $gpu: benchmarks/checkpoint.py --device cuda (resnet50, 1 host rank; $OUTDIR/checkpoint-gpu.json)"
  PYTHONUNBUFFERED=1 "$VENV/bin/python" "$ROOT/benchmarks/checkpoint.py" --device cuda --models resnet50 --reps 1 \
    --host-ranks 1 --methods ours-staged ours-overlap dcp-async_save rank0-torch.save \
    --out "$OUTDIR/checkpoint-gpu.json" > "$OUTDIR/checkpoint-gpu.md" || failed+=("the checkpoint table")
  cat "$OUTDIR/checkpoint-gpu.md"
}
first=1
for w in $WORKLOADS; do
  say "$w on $gpu: benchmarks/gpu.py --workloads $w $ARGS (every job's line as it ends; $OUTDIR/$w.json)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 "$VENV/bin/python" "$ROOT/benchmarks/gpu.py" --workloads "$w" $ARGS --out "$OUTDIR/$w.json" \
    > "$OUTDIR/$w.md" || failed+=("$w's table")
  cat "$OUTDIR/$w.md"
  if [ $first = 1 ]; then checkpoints; first=0; fi  # (after the first workload's table, before the rest)
done
if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]} (above; logs in $OUTDIR)"
  exit 1
fi
say "done: $OUTDIR"
