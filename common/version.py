"""Project and wire-protocol versions, checked by every rank at start-up (see `handshake`)."""

__version__ = "0.1.0"

# Bump whenever a message layout in `dpuoffload.common.runtime.messages` changes meaning or size.
PROTOCOL_VERSION = 11  # 2: StateKind.HEARTBEAT (keeper -> clone rank while the clone stands by); 3: API loader streams;
# 4: OpenLoader.host_share (--da-host-share: the host builds some steps, plans skip them); 5: Tag.RESTORE /
# StateKind.RESTORE (restart from DPU memory); 6: CKPT_HEADER.lost_keepers (a dead keeper's host ranks rerouted);
# 7: STATE_HEADER.senders/to_me/source and CKPT_HEADER.seat/to_me/leader (validation ranks and keepers under
# --recovery: the host group that hands the state over can change); 8: StateKind.JOIN (a spare that took a seat
# under --recovery rollback tells the seat's keeper where its hand-offs start); 9: BATCH_HEADER.flags (FLAG_POLL:
# the sender found that its large sends move only while it polls, so the receiver polls often too); 10: the numerics
# check (OpenLoader.check, NumericsQuery, Tag.NUMERICS); 11: the job's end as a handshake (ControlKind.ENDING and
# RELEASE; SHUTDOWN's `value` names its sender)

# The public host-side API (`import dpuoffload`: init, Job, DpuLoader, seeded), semantic versioning:
# a name or behaviour the README documents changes incompatibly only with a new major version.
API_VERSION = "1.2.0"
