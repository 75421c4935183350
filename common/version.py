"""Project and wire-protocol versions, checked by every rank at start-up (see `handshake`)."""

__version__ = "0.1.0"

# Bump whenever a message layout in `dpuoffload.common.runtime.messages` changes meaning or size.
PROTOCOL_VERSION = 2  # 2: StateKind.HEARTBEAT (keeper -> clone rank while the clone stands by)
