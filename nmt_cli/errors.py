"""Errors the user can fix. The CLI prints them as one line and exits 1; anything else is a bug."""


class NmtError(Exception):
    """Base class for every error caused by user input or the environment."""


class ConfigError(NmtError):
    """An option or configuration value is invalid."""


class DataError(NmtError):
    """Input text or a binarized data directory is missing or malformed."""


class CheckpointError(NmtError):
    """A checkpoint is missing, unreadable, or does not fit."""


class ExportError(NmtError):
    """A checkpoint cannot be exported to the requested format, or the exporter is not installed."""
