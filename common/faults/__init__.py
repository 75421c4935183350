"""What happens when a rank fails: the one door to fault tolerance (read in this order).

- `policy`: what the run survives, derived once from `--recovery` and `--dpu-failure`
  (`RecoveryPolicy`); every decision asks it instead of comparing flag strings.
- `abort`: a failing rank says who it is and why, and the job ends instead of hanging
  (`collective_call`, `run_program`, `abort_job`).
- `watch`: under ULFM a thread per rank learns of any death (`FailureWatch`) and judges whether
  the run survives it (`verdict`); the dead ranks known so far.
- `inject`: `--inject WHO@WHEN[:HOW]`, failing on purpose at a chosen step (and `--inject-simulate`'s
  specs).
- `simulate`: `--inject-simulate`, the recovery study's failures in which no process is lost.

What the host program then does lives in `dpuoffload.host.recovery` (the group of survivors under
lossy forward, spare ranks under rollback); the DPU side's part is in `dpu.keeper` (state kept for
recovery) and `dpu.serve` (feeding whoever is alive).
"""
