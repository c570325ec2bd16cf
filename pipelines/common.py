"""What the preprocess job's stage modules share: the user-facing error, the metrics namespace, local paths."""

from __future__ import annotations

from apache_beam.io.filesystems import FileSystems

METRICS_NAMESPACE = "shardprep"  # Beam metrics of the job (the runner's UI shows them; tests query them)


class PreprocessError(RuntimeError):
    """The job cannot start or finish; the message is meant for the user."""


def is_local(path: str) -> bool:
    """True for a path on this machine's file system (no scheme, or file://)."""
    return FileSystems.get_scheme(path) in (None, "file")
