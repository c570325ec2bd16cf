"""What the preprocess job's stage modules share: the user-facing error and the metrics namespace."""

from __future__ import annotations

import contextlib

METRICS_NAMESPACE = "shardprep"  # Beam metrics of the job (the runner's UI shows them; tests query them)
# The decode stage's counters, in the order of journal.ResumeCounts
DECODE_COUNTERS = ("decode_groups", "decode_groups_kept", "decode_groups_redone", "inputs_decoded")


class PreprocessError(RuntimeError):
    """The job cannot start or finish; the message is meant for the user."""


@contextlib.contextmanager
def failing_as(message: str):
    """An error in the block becomes a PreprocessError: ``message``, the error's type and its text."""
    try:
        yield
    except Exception as e:
        raise PreprocessError(f"{message}: {type(e).__name__}: {e}") from e
