"""Errors aisim reports to its users."""


class AisimError(Exception):
    """Base class of every error aisim reports with a clear message."""


class ConfigError(AisimError, ValueError):
    """An engine or pipeline configuration is invalid; the message names the key and file."""


class TraceError(AisimError, ValueError):
    """A trace row is invalid; the message names the file, line and field."""


class ReplayError(AisimError, RuntimeError):
    """A replay could not complete (a stalled engine, a step outside a measured profile)."""
