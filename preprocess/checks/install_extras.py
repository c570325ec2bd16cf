"""Which extra of the install a command line needs, checked before any work: ``gs://`` paths (and so Dataflow) need
``gcp``; without it Beam fails deep in a run, so the CLI names the extra in one error."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable

GCP_EXTRA = "gcp"
# What lets Beam's FileSystems take gs:// (apache_beam.io.filesystems registers it when it imports).
_GCS_FILE_SYSTEM = "apache_beam.io.gcp.gcsfilesystem"
# A source kind's prefix wrapping a gs:// path (``tfrecord:gs://…``): every kind's, with no list of them to keep.
_WRAPPED_GCS = re.compile(r"\A[a-z][a-z0-9_]*:(?=gs://)")


class MissingExtraError(Exception):
    """A command line needs an extra this install leaves out; the message says what to install."""


def gcs_path(argument: str) -> str | None:
    """The ``gs://`` path an argument names (bare, as ``tfrecord:gs://…`` or ``--option=gs://…``), else None."""
    value = argument.split("=", 1)[1] if argument.startswith("--") and "=" in argument else argument
    value = _WRAPPED_GCS.sub("", value, count=1)
    return value if value.startswith("gs://") else None


def gcp_installed() -> bool:
    try:
        importlib.import_module(_GCS_FILE_SYSTEM)
    except ImportError:
        return False
    return True


def check_arguments(arguments: Iterable[str]) -> None:
    """Raises MissingExtraError naming the first ``gs://`` argument when the gcp extra is missing; imports nothing
    for a local command line."""
    path = next((path for path in map(gcs_path, arguments) if path is not None), None)
    if path is None or gcp_installed():
        return
    raise MissingExtraError(
        f"{path} needs shardprep's {GCP_EXTRA} extra (Cloud Storage and Dataflow), which is not installed: "
        f"pip install 'shardprep[{GCP_EXTRA}]' (in a checkout: pip install -e '.[{GCP_EXTRA}]')")
