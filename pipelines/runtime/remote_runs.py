"""What ``--runner`` must be for a run to start, checked before planning lists SOURCE (or validate lists DATA): a
runner Beam has, and on Dataflow no local path where the workers read or write. Beam itself would find out late:
after planning, or after a Dataflow job was submitted and failed on workers that cannot see this machine's files.
"""

from __future__ import annotations

import difflib
import types

from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, StandardOptions

from shardprep.pipelines.runtime import runner, storage
from shardprep.pipelines.sources import registry as source_registry
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.checks import text

# The runners Beam knows by name, as ``runner.normalized_name`` spells them; any other --runner is a module path.
_KNOWN = {path.rsplit(".", 1)[-1].lower() for path in StandardOptions.ALL_KNOWN_RUNNERS}
# Inputs planning reads on this machine, never a worker (their rows become the graph's first elements).
_READ_WHEN_PLANNING = ("labels file",)


def unknown_runner(beam_args: list[str]) -> str | None:
    """Why ``--runner`` names no runner Beam has (neither one of its names nor a module path), else None."""
    name = runner.runner_name(beam_args)
    if not name or "." in name or runner.normalized_name(name) in _KNOWN:
        return None
    near = difflib.get_close_matches(name, StandardOptions.KNOWN_RUNNER_NAMES, 1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return (f"--runner {name}: Beam has no runner of that name{hint}; give one of "
            f"{', '.join(StandardOptions.KNOWN_RUNNER_NAMES)}, or a runner class's module path")


def on_dataflow(beam_args: list[str]) -> bool:
    """True when ``--runner`` is Dataflow's (any spelling Beam takes)."""
    return runner.normalized_name(runner.runner_name(beam_args)) in ("dataflowrunner", "testdataflowrunner")


def local_paths(beam_args: list[str], paths: list[tuple[str, str]]) -> str | None:
    """Why a Dataflow run cannot use ``paths`` (``(what, path)``: what the workers read or write), else None."""
    if not on_dataflow(beam_args):
        return None
    local = [f"{what} {path}" for what, path in paths if storage.is_local(path)]
    if not local:
        return None
    named = text.series(local)
    return (f"--runner {runner.runner_name(beam_args)} runs the job on Dataflow, whose workers cannot read local "
            f"paths: {named} {'are' if len(local) > 1 else 'is'} local; give gs:// paths (gs://BUCKET/...)")


def refusal(beam_args: list[str], paths: list[tuple[str, str]]) -> str | None:
    """Why a run of ``beam_args`` on ``paths`` cannot start, else None."""
    return unknown_runner(beam_args) or local_paths(beam_args, paths)


def preprocess_refusal(config, beam_args: list[str]) -> str | None:
    """Why a preprocess run of ``config`` on ``beam_args`` cannot start, else None."""
    return refusal(beam_args, preprocess_paths(config) if on_dataflow(beam_args) else [])


def validate_refusal(data: str, tfds_data_dir: str | None, beam_args: list[str]) -> str | None:
    """Why a validate run of DATA on ``beam_args`` cannot start, else None."""
    return (refusal(beam_args, validate_paths(data, tfds_data_dir) if on_dataflow(beam_args) else [])
            or no_results_location(beam_args))


def no_results_location(beam_args: list[str]) -> str | None:
    """Why validate's remote workers would have nowhere to write their results (no ``--temp_location``)."""
    if runner.runs_locally(beam_args) or PipelineOptions(beam_args).view_as(GoogleCloudOptions).temp_location:
        return None
    return (f"validate with --runner={runner.runner_name(beam_args)} needs --temp_location (a bucket path its "
            "workers can write their results to)")


def preprocess_paths(config) -> list[tuple[str, str]]:
    """What a preprocess run's workers read and write: SOURCE's inputs, as its kind names them, and OUTPUT."""
    kind = source_registry.kind_of(config.source)
    inputs = kind.apart_from(kind.location(config.source), config)
    return _unique([(found.what, found.path) for found in inputs if found.what not in _READ_WHEN_PLANNING]
                   + [("OUTPUT", config.output)])


def validate_paths(data: str, tfds_data_dir: str | None) -> list[tuple[str, str]]:
    """What a validate run's workers read: DATA, or the files a ``tfrecord:``/``tfds:`` DATA names."""
    kind = source_registry.kind_of(data)
    if kind is source_registry.FALLBACK or not kind.validated_as_records:
        return [("DATA", data)]
    try:
        inputs = kind.apart_from(kind.location(data), types.SimpleNamespace(tfds_data_dir=tfds_data_dir))
    except sources.SourceError:  # DATA points nowhere (``tfrecord:`` alone): validate's own listing says so
        return []
    return _unique([(found.what, found.path) for found in inputs])


def _unique(paths: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``paths`` without a second entry for a path already named."""
    unique: dict[str, str] = {}
    for what, path in paths:
        unique.setdefault(path, what)
    return [(what, path) for path, what in unique.items()]
