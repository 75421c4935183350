#!/usr/bin/env bash
# A GPU node in one command: set up (scripts/setup.sh; offline where DPUOFFLOAD_WHEELS is set, see
# docs/quickstart.md "A GPU node with its own torch"), run the gpu-marked tests, then the issue-12
# table (benchmarks/gpu.py) for each workload, every job's line printed as it ends and each
# workload's JSON and table written to OUTDIR (the jobs so far in <workload>.partial.json while it runs: a run
# cut short keeps what it measured).
#
#   bash scripts/gpu-check.sh [--device cpu] [OUTDIR] [WORKLOAD ...]
#                                          (default: runs/gpu-check, resnet50 shufflenet_v2)
#
# After the first workload's table: checkpoint blocking on the GPU (ours staged and overlapped, DCP
# async_save, rank-0 torch.save; OUTDIR/checkpoint-gpu.json, about a minute and a half).
# Knobs: DPUOFFLOAD_GPU_TABLE_ARGS, gpu.py's sizes (default: 8 host + 8 DPU cores at speed 0.5, epochs of
# 24 batches, short epochs of 6; 7 of resnet50's 12 jobs took 4.6 min on an H200 node on 2026-11-27).
# DPUOFFLOAD_GPU_CHECK_BUDGET_S (default 480): a part that would start after this many seconds of the
# script is skipped and named at the end (a lease's call is cut at 10 minutes; what ran is written).
#
# --device cpu rehearses the whole script on a machine without a GPU, in the same order: the gpu-marked
# tests (they skip), each workload's table as gpu.py's CPU smoke run (--device cpu --quick) and the
# checkpoint table on the CPU (--quick), into OUTDIR (default runs/gpu-check-cpu). Its numbers say
# nothing about a GPU; it checks the script, its outputs and its budget before a lease.
# Without a GPU and without --device cpu it runs the tests (they skip) and stops before the table, saying so.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEVICE=cuda
if [ "${1:-}" = "--device" ]; then
  case "${2:-}" in
    cpu|cuda) DEVICE=$2; shift 2 ;;
    *) echo "gpu-check.sh: --device ${2:-}: give cpu (a rehearsal without a GPU) or cuda (the default)" >&2; exit 2 ;;
  esac
fi
OUTDIR=${1:-$ROOT/runs/gpu-check$([ "$DEVICE" = cpu ] && echo -cpu)}
shift || true
WORKLOADS=${*:-resnet50 shufflenet_v2}
ARGS=${DPUOFFLOAD_GPU_TABLE_ARGS:---host-cores 8 --dpu-cores 8 --dpu-speed 0.5 --long-steps 24 --short-steps 6 --short-epochs 3}
CKPT_ARGS="--models resnet50 --reps 1"
if [ "$DEVICE" = cpu ]; then  # (the rehearsal: CPU smoke-run sizes, the same parts in the same order)
  ARGS="--quick"
  CKPT_ARGS="--quick --models resnet20 --reps 1"
fi
BUDGET=${DPUOFFLOAD_GPU_CHECK_BUDGET_S:-480}
case "$BUDGET" in
  ''|*[!0-9]*) echo "gpu-check.sh: DPUOFFLOAD_GPU_CHECK_BUDGET_S=$BUDGET: give whole seconds (default 480)" >&2; exit 2 ;;
esac
VENV=${DPUOFFLOAD_VENV:-$ROOT/.venv}
say() { printf '\033[1m[gpu-check]\033[0m %s\n' "$*"; }
mkdir -p "$OUTDIR"
say "the gpu-marked tests (log: $OUTDIR/tests.log)"
failed=()
skipped=()
in_budget() {  # (true while the script is within its budget; else the part is recorded as skipped)
  if [ "$SECONDS" -lt "$BUDGET" ]; then return 0; fi
  skipped+=("$1")
  say "skipping $1: ${SECONDS} s spent of a ${BUDGET} s budget (DPUOFFLOAD_GPU_CHECK_BUDGET_S)"
  return 1
}
bash "$ROOT/scripts/test.sh" -m gpu -p no:cacheprovider 2>&1 | tee "$OUTDIR/tests.log" | tail -n 15 ||
  failed+=("the gpu-marked tests")  # (the table runs anyway: a GPU lease is short)
gpu=$("$VENV/bin/python" -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')")
if [ "$DEVICE" = cpu ]; then
  gpu="the CPU (a rehearsal: --device cpu)"
elif [ -z "$gpu" ]; then
  say "torch sees no GPU here: the table needs one (bash scripts/gpu-check.sh --device cpu rehearses the whole script)"
  [ ${#failed[@]} -eq 0 ]
  exit
fi
checkpoints() {  # the overlapped copy's figure: a GPU host rank's blocking per checkpoint beside DCP's
  in_budget "the checkpoint table" || return 0
  say "checkpoints on $gpu: benchmarks/checkpoint.py --device $DEVICE $CKPT_ARGS (1 host rank; $OUTDIR/checkpoint-gpu.json)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 "$VENV/bin/python" "$ROOT/benchmarks/checkpoint.py" --device "$DEVICE" $CKPT_ARGS \
    --host-ranks 1 --methods ours-staged ours-overlap dcp-async_save rank0-torch.save \
    --out "$OUTDIR/checkpoint-gpu.json" > "$OUTDIR/checkpoint-gpu.md" || failed+=("the checkpoint table")
  cat "$OUTDIR/checkpoint-gpu.md"
}
first=1
for w in $WORKLOADS; do
  in_budget "$w's table" || continue
  say "$w on $gpu: benchmarks/gpu.py --device $DEVICE --workloads $w $ARGS (every job's line as it ends; $OUTDIR/$w.json)"
  # shellcheck disable=SC2086
  PYTHONUNBUFFERED=1 "$VENV/bin/python" "$ROOT/benchmarks/gpu.py" --device "$DEVICE" --workloads "$w" $ARGS \
    --out "$OUTDIR/$w.json" > "$OUTDIR/$w.md" || failed+=("$w's table")
  cat "$OUTDIR/$w.md"
  if [ $first = 1 ]; then checkpoints; first=0; fi  # (after the first workload's table, before the rest)
done
[ $first = 0 ] || checkpoints  # (no workload's table ran: the checkpoint table still gets its turn)
say "$SECONDS s in all (budget ${BUDGET} s)"
if [ ${#skipped[@]} -gt 0 ]; then
  say "not run (over the budget): ${skipped[*]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]} (above; logs in $OUTDIR)"
  exit 1
fi
say "done: $OUTDIR${skipped[*]:+ (not everything: see above)}"
