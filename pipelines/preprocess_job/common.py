"""What the preprocess job's stage modules share: the user-facing error and the metrics namespace."""

from __future__ import annotations

METRICS_NAMESPACE = "shardprep"  # Beam metrics of the job (the runner's UI shows them; tests query them)


class PreprocessError(RuntimeError):
    """The job cannot start or finish; the message is meant for the user."""
