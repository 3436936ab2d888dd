"""Error types whose messages name the offending file/key and the fix."""

from __future__ import annotations


class CaptioningError(Exception):
    """Base class: a user-facing error with a one-line message."""


class ConfigError(CaptioningError):
    """A configuration mistake (unknown key, wrong type, missing value, mismatch)."""


class DataError(CaptioningError):
    """Bad input data: missing file, malformed annotation, unsafe path."""


class CheckpointError(CaptioningError):
    """A checkpoint that is missing, truncated, corrupt or unsafe to load."""


class StorageError(CaptioningError):
    """A write failed (full disk, quota, I/O error); work committed before it is intact."""
