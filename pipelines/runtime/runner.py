"""Choosing the Beam runner: without ``--runner``, Beam's FnApiRunner, multi-process, offline (Beam's default and
DirectRunner would first download the Prism runner); else whatever ``--runner`` says. Public Beam API only. Before
planning: a ``--runner`` Beam has, and on Dataflow no local path where the workers read or write (Beam would find out
late, on workers that cannot see this machine's files)."""

from __future__ import annotations

import contextlib
import difflib
import os
import shutil
import types

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from shardprep.pipelines.runtime import stopping
from shardprep.pipelines.runtime.storage import is_local
from shardprep.preprocess.checks import streams, text
from shardprep.preprocess.sources import common as sources

# Runners whose workers share this machine's file system, lower-case ("": no --runner).
LOCAL_RUNNER_NAMES = ("", "directrunner", "bundlebaseddirectrunner", "switchingdirectrunner", "testdirectrunner",
                      "fnapirunner", "prismrunner")
# make_pipeline builds the FnApiRunner itself; Beam's DirectRunner, named, would first fetch Prism from github.com.
_OWN_FNAPI_RUNNER_NAMES = ("", "fnapirunner", "directrunner")


def _own_fnapi_runner(beam_args: list[str]) -> bool:
    return normalized_name(runner_name(beam_args)) in _OWN_FNAPI_RUNNER_NAMES


def runner_name(beam_args: list[str]) -> str:
    """The ``--runner`` given in ``beam_args``, or '' when none was given."""
    return PipelineOptions(beam_args).view_as(StandardOptions).runner or ""


def normalized_name(name: str) -> str:
    """``--runner`` as Beam resolves it: without case or module path, with the ``Runner`` suffix Beam adds."""
    name = name.rsplit(".", 1)[-1].lower()
    return name if not name or name.endswith("runner") else name + "runner"


def runs_locally(beam_args: list[str]) -> bool:
    """True when the workers run on this machine and share its file system: the one test of a local runner."""
    return normalized_name(runner_name(beam_args)) in LOCAL_RUNNER_NAMES


def template_location(beam_args: list[str]) -> str | None:
    """``--template_location``: Dataflow then writes a job template instead of running the job."""
    return PipelineOptions(beam_args).view_as(GoogleCloudOptions).template_location


class ViewsMadeOnce(PipelineOptions):
    """``PipelineOptions`` that make each view once: Beam parses the flags again for every ``view_as``, ~500 times
    (~0.3 s of CPU) per graph. Views share their values; a copy or an unpickled one makes its own."""

    def view_as(self, cls):
        views = self.__dict__.setdefault("_views", {})  # PipelineOptions.__setattr__ takes option names only
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


def pipeline_options(beam_args: list[str]) -> PipelineOptions:
    """Options for ``beam_args``; local runs default to one worker process per core."""
    options = ViewsMadeOnce(beam_args)
    if not runner_name(beam_args):
        direct = options.view_as(DirectOptions)
        given = " ".join(beam_args)
        if "direct_running_mode" not in given:
            direct.direct_running_mode = "multi_processing"
        if "direct_num_workers" not in given or not direct.direct_num_workers:
            direct.direct_num_workers = os.cpu_count() or 1
    return options


# The work one local worker process must have before starting it pays (BENCHMARKS.md, "Local workers sized to the
# work": 128 MiB of photos took as long in-process as on two forked workers). Reading shards costs less than decoding.
PREPROCESS_BYTES_PER_WORKER = 128 * 2**20
VALIDATE_BYTES_PER_WORKER = 256 * 2**20


def sized_to_work(beam_args: list[str], work_bytes: int, bytes_per_worker: int) -> list[str]:
    """``beam_args`` with local workers fitted to the work where the user chose none: one per ``bytes_per_worker``, at
    most one per core; one worker's work or less runs in this process (``in_memory``)."""
    chosen = ("--runner", "--direct_num_workers", "--direct_running_mode")
    if any(arg.startswith(chosen) for arg in beam_args):
        return beam_args
    workers = min(os.cpu_count() or 1, max(1, -(-work_bytes // bytes_per_worker)))
    if workers == 1:
        return [*beam_args, "--direct_running_mode=in_memory", "--direct_num_workers=1"]
    return [*beam_args, f"--direct_num_workers={workers}"]


def local_workers(beam_args: list[str]) -> int:
    """How many SDK worker processes a local run of ``beam_args`` uses."""
    options = pipeline_options(beam_args).view_as(DirectOptions)
    return 1 if options.direct_running_mode == "in_memory" else options.direct_num_workers or os.cpu_count() or 1


LOCAL_MALLOC_ARENAS = 2


@contextlib.contextmanager
def malloc_arenas_limited():
    """Caps glibc's malloc arenas at two for the block's worker processes and (for good) this one, unless the user
    set MALLOC_ARENA_MAX: each thread's arena kept what a stage freed; two cut the peak's growth ~40 %."""
    if "MALLOC_ARENA_MAX" in os.environ:
        yield
        return
    from shardprep.pipelines.runtime import worker_zygote

    os.environ["MALLOC_ARENA_MAX"] = str(LOCAL_MALLOC_ARENAS)
    worker_zygote.libc_call("mallopt", worker_zygote.M_ARENA_MAX, LOCAL_MALLOC_ARENAS)  # this process runs already
    try:
        yield
    finally:
        os.environ.pop("MALLOC_ARENA_MAX", None)


def run_to_end(pipeline: beam.Pipeline, beam_args: list[str], submitted=lambda: None):
    """Runs ``pipeline`` (from ``make_pipeline``) to its end; ``submitted()`` once the runner has the job. Our local
    runner runs with the malloc cap, the workers' stderr held, and stoppable."""
    with streams.worker_stderr_held(uses_worker_processes(beam_args)):
        if _own_fnapi_runner(beam_args):
            with malloc_arenas_limited():
                try:
                    result = stopping.run_stoppable(pipeline.run)
                except BaseException:  # pipeline.run is left on its thread: its own clean-up never runs
                    shutil.rmtree(pipeline.local_tempdir, ignore_errors=True)
                    raise
        else:
            result = pipeline.run()
        submitted()
        result.wait_until_finish()
    return result


def worker_zygote_for(beam_args: list[str]):
    """A worker zygote for the block if a run of ``beam_args`` may use local worker processes (call it before
    anything starts a thread)."""
    from shardprep.pipelines.runtime import worker_zygote

    return worker_zygote.forked_for(_own_fnapi_runner(beam_args) and uses_worker_processes(beam_args))


def make_pipeline(beam_args: list[str]) -> beam.Pipeline:
    """A ``beam.Pipeline`` for ``beam_args`` (the options after ``--``); run it with ``run_to_end``."""
    options = pipeline_options(beam_args)
    if not _own_fnapi_runner(beam_args):
        stage_worker_requirements_only()
        return beam.Pipeline(options=options)
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    from shardprep.pipelines.runtime import worker_zygote

    zygote = worker_zygote.active()
    if zygote is None or not uses_worker_processes(beam_args):
        return beam.Pipeline(runner=FnApiRunner(), options=options)
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    zygote.prepare()  # the workers' own imports, while the graph is built
    # Workers started by the zygote's command, through FnApiRunner's public default_environment: in in_memory mode
    # FnApiRunner keeps it (multi_processing puts its own in place) and still starts direct_num_workers of them.
    options.view_as(DirectOptions).direct_running_mode = "in_memory"
    streams.drop_in_memory_warning()
    environment = SubprocessSDKEnvironment.from_command_string(zygote.worker_command())
    return beam.Pipeline(runner=FnApiRunner(default_environment=environment), options=options)


# "1" while Beam builds the sdist of --setup_file (in a child process, with this environment): setup.py then writes
# the WORKER_SDIST file into it, so that the Dataflow workers install only what they import (setup.py's docstring).
WORKER_SDIST_ENV = "SHARDPREP_WORKER_SDIST"


def stage_worker_requirements_only() -> None:
    """Marks the sdist Beam builds in ``Pipeline.run`` as the workers' (harmless where none is built)."""
    os.environ[WORKER_SDIST_ENV] = "1"


class BeamArgsError(ValueError):
    """The Beam options after ``--`` cannot be used (a stray argument, a worker count below one); for the user."""


def check_beam_args(beam_args: list[str], usage: str, own_options: tuple[str, ...] = ()) -> None:
    """Refuses, before anything runs, what Beam would ignore or fail on deep inside the run: a stray argument, an
    unknown option (one of the command's ``own_options``, or a misspelling), a bad value, or a bad worker count."""
    given = any(arg.startswith("--direct_num_workers") for arg in beam_args)
    asked = _parsed(lambda: PipelineOptions(beam_args).view_as(DirectOptions)).direct_num_workers
    if given and (asked is None or asked < 1):
        raise BeamArgsError(f"--direct_num_workers={asked}: the number of local worker processes must be at least "
                            "1 (default: one per core)")
    _check_known(beam_args, usage, own_options)
    # Refused: Beam 2.77's FnApiRunner with several worker threads mixes up the data they send when grouping.
    options = pipeline_options(beam_args).view_as(DirectOptions)
    if runs_locally(beam_args) and options.direct_running_mode == "multi_threading" and options.direct_num_workers > 1:
        workers = f"{options.direct_num_workers} workers" if given else (
            f"the default of {options.direct_num_workers} workers (one per core)")
        raise BeamArgsError(f"--direct_running_mode=multi_threading with {workers}: Beam's "
                            "local runner mixes up the data its worker threads send it when there is more than one; "
                            "use multi_processing (the default) or --direct_num_workers=1")


def _parsed(parse):
    """``parse()``, or BeamArgsError with argparse's reason (it prints its usage, then exits, on a bad option)."""
    import io

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return parse()
    except (SystemExit, Exception) as e:  # noqa: BLE001
        reason = [line.split(" error: ", 1)[-1] for line in said.getvalue().splitlines() if " error: " in line]
        raise BeamArgsError(f"invalid Beam option: {reason[-1] if reason else e}") from None


def _check_known(beam_args: list[str], usage: str, own_options: tuple[str, ...]) -> None:
    """Parses ``beam_args`` with Beam's parser of every options class (``get_all_options`` hands it over)."""
    parsers: list = []

    def parse():
        PipelineOptions(beam_args).get_all_options(add_extra_args_fn=parsers.append)
        return parsers[0].parse_known_args(beam_args)[1]

    for token in _parsed(parse):
        name = token.split("=", 1)[0]
        if name in own_options:
            raise BeamArgsError(f"{name} is an option of {usage.split()[0]}, not of Beam: put it before --")
        if not token.startswith("-"):
            raise BeamArgsError(f"unexpected argument {token}: {usage}; Beam options go after --")
        known = list(PipelineOptions([]).get_all_options())  # every option's name
        near = difflib.get_close_matches(name.replace("-", "_").lstrip("_"), known, 1)
        hint = f" (did you mean --{near[0]}?)" if near else ""
        raise BeamArgsError(f"unknown Beam option {token}{hint}: Beam would ignore it")


# The runners Beam knows by name, as ``normalized_name`` spells them; any other --runner is a module path.
_KNOWN = {path.rsplit(".", 1)[-1].lower() for path in StandardOptions.ALL_KNOWN_RUNNERS}
# Inputs planning reads on this machine, never a worker (their rows become the graph's first elements).
_READ_WHEN_PLANNING = ("labels file",)


def on_dataflow(beam_args: list[str]) -> bool:
    """True when ``--runner`` is Dataflow's (any spelling Beam takes)."""
    return normalized_name(runner_name(beam_args)) in ("dataflowrunner", "testdataflowrunner")


def refusal(beam_args: list[str], paths: list[tuple[str, str]]) -> str | None:
    """Why a run of ``beam_args`` on ``paths`` (``(what, path)``: what the workers read or write) cannot start, else
    None: a ``--runner`` naming no runner Beam has (neither one of its names nor a module path), or local paths
    where Dataflow's workers would read them."""
    name = runner_name(beam_args)
    if name and "." not in name and normalized_name(name) not in _KNOWN:
        near = difflib.get_close_matches(name, StandardOptions.KNOWN_RUNNER_NAMES, 1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        return (f"--runner {name}: Beam has no runner of that name{hint}; give one of "
                f"{', '.join(StandardOptions.KNOWN_RUNNER_NAMES)}, or a runner class's module path")
    local = [f"{what} {path}" for what, path in paths if is_local(path)] if on_dataflow(beam_args) else []
    if not local:
        return None
    return (f"--runner {name} runs the job on Dataflow, whose workers cannot read local paths: "
            f"{text.series(local)} {'are' if len(local) > 1 else 'is'} local; give gs:// paths (gs://BUCKET/...)")


def preprocess_refusal(config, beam_args: list[str]) -> str | None:
    """Why a preprocess run of ``config`` on ``beam_args`` cannot start, else None."""
    return refusal(beam_args, preprocess_paths(config) if on_dataflow(beam_args) else [])


def validate_refusal(data: str, tfds_data_dir: str | None, beam_args: list[str]) -> str | None:
    """Why a validate run of DATA on ``beam_args`` cannot start, else None."""
    return (refusal(beam_args, validate_paths(data, tfds_data_dir) if on_dataflow(beam_args) else [])
            or no_results_location(beam_args))


def no_results_location(beam_args: list[str]) -> str | None:
    """Why validate's remote workers would have nowhere to write their results (no ``--temp_location``)."""
    if runs_locally(beam_args) or PipelineOptions(beam_args).view_as(GoogleCloudOptions).temp_location:
        return None
    return (f"validate with --runner={runner_name(beam_args)} needs --temp_location (a bucket path its "
            "workers can write their results to)")


def preprocess_paths(config) -> list[tuple[str, str]]:
    """What a preprocess run's workers read and write: SOURCE's inputs, as its kind names them, and OUTPUT."""
    from shardprep.pipelines.sources import registry as source_registry

    kind = source_registry.kind_of(config.source)
    inputs = kind.apart_from(kind.location(config.source), config)
    return _unique([(found.what, found.path) for found in inputs if found.what not in _READ_WHEN_PLANNING]
                   + [("OUTPUT", config.output)])


def validate_paths(data: str, tfds_data_dir: str | None) -> list[tuple[str, str]]:
    """What a validate run's workers read: DATA, or the files a ``tfrecord:``/``tfds:`` DATA names."""
    from shardprep.pipelines.sources import registry as source_registry

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


def uses_worker_processes(beam_args: list[str]) -> bool:
    """True for a local run whose SDK workers are processes of their own (the default multi_processing mode)."""
    return (runs_locally(beam_args)
            and pipeline_options(beam_args).view_as(DirectOptions).direct_running_mode == "multi_processing")
