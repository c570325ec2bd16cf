"""What `--setup_file ./setup.py` stages to Dataflow: only the workers' requirements (setup.py's docstring). Beam's
stager builds the sdist in a child process, which inherits this process's environment."""

from __future__ import annotations

import os

WORKER_SDIST_ENV = "SHARDPREP_WORKER_SDIST"  # read by setup.py


def stage_worker_requirements_only() -> None:
    """Marks the sdist Beam builds in ``Pipeline.run`` as the workers' (harmless where none is built)."""
    os.environ[WORKER_SDIST_ENV] = "1"
