"""What `--setup_file ./setup.py` stages: only the workers' requirements, Beam with its gcp extra among them (see
setup.py's docstring; a default install leaves that extra out, the workers read and write gs://).

Beam's stager builds the sdist in a child process of the launcher (``python -m build --sdist`` or
``setup.py sdist``), which inherits this process's environment.
"""

from __future__ import annotations

import os

WORKER_SDIST_ENV = "SHARDPREP_WORKER_SDIST"  # read by setup.py


def stage_worker_requirements_only() -> None:
    """Makes the sdist Beam builds from setup.py in this process declare only the Dataflow workers' requirements.

    Call before a non-local pipeline runs (Beam stages ``--setup_file`` in ``Pipeline.run``). Harmless for a local
    run: nothing builds an sdist then.
    """
    os.environ[WORKER_SDIST_ENV] = "1"
