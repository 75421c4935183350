"""What the host program and the DPU program share: config, roles, message layouts, models, data."""

from dpuoffload.common.version import PROTOCOL_VERSION, __version__

__all__ = ["__version__", "PROTOCOL_VERSION"]
