"""The host program's recoveries from a dead host rank (the decisions come from
`dpuoffload.common.faults.policy`):

- `survivors`: `--recovery lossy-forward`, the surviving host ranks shrink their group and go on
  (`SurvivorGroup`), optionally taking the dead rank's samples over (`--reassign`);
- `spares`: `--recovery rollback`, a pool of spare ranks, one of which takes the dead rank's seat
  and replays the step (`SparePool`);
- `build`: `HostRecovery`, all of the above that a run uses, built before the trainer and handed
  to the parts that use it at their construction (what a spare rank runs is `host.spare`);
- `carried`: under rollback, what rides in each step's allreduce so a spare starts from its seat's
  own state (host rank 0's BatchNorm buffers, every seat's epoch progress).
"""
