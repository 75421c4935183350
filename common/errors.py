"""Typed exceptions. User mistakes are `ConfigError` (a `ValueError`); wire faults are `PeerError`."""


class DpuOffloadError(Exception):
    """Base class of every error this project raises on purpose."""


class ConfigError(DpuOffloadError, ValueError):
    """A flag, file or combination the user can fix. The message names the problem and the fix."""


class HandshakeError(DpuOffloadError):
    """Host and DPU programs disagree on version, protocol or run config."""


class PeerError(DpuOffloadError):
    """A peer rank did not answer in time or sent something unexpected."""
