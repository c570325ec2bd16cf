"""Choosing the Beam runner: local multi-process without network access, or whatever ``--runner`` says.

Without ``--runner`` in the pass-through Beam options, pipelines run on Beam's FnApiRunner in multi-processing mode
(one SDK worker process per core, talking gRPC on loopback). Beam's default and DirectRunner would first try to
download the Prism runner binary, which fails offline, so they are never picked implicitly.
"""

from __future__ import annotations

import logging
import os

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

LOCAL_RUNNER_NAMES = ("", "fnapirunner", "directrunner", "prismrunner", "swissknife")


def runner_name(beam_args: list[str]) -> str:
    """The ``--runner`` given in ``beam_args``, or '' when none was given."""
    return PipelineOptions(beam_args).view_as(StandardOptions).runner or ""


def is_local(beam_args: list[str]) -> bool:
    """True when the pipeline runs on this machine (no ``--runner`` or a local one)."""
    return runner_name(beam_args).lower() in ("", "fnapirunner")


def template_location(beam_args: list[str]) -> str | None:
    """``--template_location``: Dataflow then writes a job template instead of running the job."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    return PipelineOptions(beam_args).view_as(GoogleCloudOptions).template_location


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    """Options for ``beam_args``; local runs default to one worker process per core."""
    options = PipelineOptions(beam_args)
    if not runner_name(beam_args):
        direct = options.view_as(DirectOptions)
        given = " ".join(beam_args)
        if "direct_running_mode" not in given:
            direct.direct_running_mode = "multi_processing"
        if "direct_num_workers" not in given or not direct.direct_num_workers:
            direct.direct_num_workers = os.cpu_count() or 1
    return options


def make_pipeline(beam_args: list[str]) -> beam.Pipeline:
    """A ``beam.Pipeline`` for ``beam_args`` (the Beam options after ``--`` on the command line)."""
    options = pipeline_options(beam_args)
    name = runner_name(beam_args)
    if name.lower() in ("", "fnapirunner"):
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return beam.Pipeline(runner=FnApiRunner(), options=options)
    return beam.Pipeline(options=options)


def quiet_beam_logging() -> None:
    """Beam's local job service logs every worker's start-up warnings; a CLI user needs none of them."""
    for name in ("apache_beam", "apache_beam.runners.portability", "apache_beam.runners.worker"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
