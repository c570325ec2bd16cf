"""The preprocess job: the graph (``build_pipeline``, read top to bottom) and ``execute_job``, which plans the
source on the launcher first. Order and sharding depend only on the inputs, the options and ``--seed``, so shards
are byte-identical whatever the number or speed of workers."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, NamedTuple

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter

from shardprep.pipelines.preprocess_job import input_sizes
from shardprep.pipelines.runtime import journal, progress, storage, worker_zygote
from shardprep.pipelines.runtime import runner as runners
from shardprep.pipelines.preprocess_job.common import DECODE_COUNTERS, METRICS_NAMESPACE, PreprocessError
from shardprep.pipelines.preprocess_job.decode import BundleDecoder, DecodeResizeEncode, GroupDecoder
from shardprep.pipelines.preprocess_job.decode_groups import (DecodeGroups, FixedLayouts, planned_layouts,
                                                               uses_fixed_layout)
from shardprep.pipelines.preprocess_job.exclude import ExcludeInputs, exclude_note, keys_file, read_keys, unknown_keys
from shardprep.pipelines.preprocess_job.listing import GivenValues, ListInputs
from shardprep.pipelines.preprocess_job.manifest_writer import CountInputs, WriteManifest, WriteRejects, build_manifest
from shardprep.pipelines.preprocess_job.shards import ShardBoundaries, WriteShards
from shardprep.pipelines.sources.kind import SourcePlan
from shardprep.pipelines.sources.registry import kind_of, parse, plan_source
from shardprep.pipelines.runtime.storage import prepare_output
from shardprep.preprocess.checks.events import Message, RunCounts
from shardprep.preprocess.checks.text import count
from shardprep.preprocess.image import image_ops
from shardprep.preprocess.format import manifest, sharding
from shardprep.preprocess.checks import owned_folder
from shardprep.preprocess.format.config import DEFAULT_RESIZE_METHOD, PreprocessConfig

INPUT_BATCH = 16  # inputs per element to decode: still spread evenly, yet a few elements per 100 images
DEFAULT_MIN_DECODE_GROUPS = 64  # remote runners: workers come and go, keep enough groups to share out


def build_pipeline(p: beam.Pipeline, config: PreprocessConfig, plan: SourcePlan, runner: str = "",
                   progress_dir: str | None = None, min_decode_groups: int = DEFAULT_MIN_DECODE_GROUPS,
                   unit_journal: journal.UnitJournal | None = None):
    """Adds the preprocess stages to ``p``; returns the PCollection holding the manifest document.
    ``unit_journal``: where finished decode groups are recorded (and found on --resume)."""
    listed = p | "ListInputs" >> ListInputs(config, plan, progress_dir)
    inputs, listing_rejects = listed["inputs"], listed["rejects"]
    if config.exclude is not None:  # the inputs --exclude names become listing rejects, reason "excluded"
        # Local workers get the file's name (each reads it once), others the keys themselves.
        local = storage.is_local(config.exclude) and runners.runs_locally(["--runner", runner] if runner else [])
        keys = keys_file(config.exclude) if local else read_keys(config.exclude)
        kept = inputs | "ExcludeInputs" >> ExcludeInputs(keys, config.exclude)
        inputs = kept["inputs"]
        listing_rejects = (listing_rejects, kept["rejects"]) | "ListingAndExcluded" >> beam.Flatten()
    input_counts = (inputs, listing_rejects) | "CountInputs" >> CountInputs()
    batches = inputs | "BatchInputs" >> beam.BatchElements(min_batch_size=INPUT_BATCH, max_batch_size=INPUT_BATCH)
    layouts = _fixed_layouts(p, config, plan, inputs)
    decoder_args = (process_options(config), config.seed, plan.stats_split, config.output, progress_dir)
    if plan.kind.decoded_where_read:
        # Inputs carrying their bytes are decoded where read, not sent through the runner's shuffle.
        to_decode, decoder = batches, BundleDecoder(*decoder_args, read_path=plan.kind.path_reader(plan))
    else:
        to_decode = batches | "DecodeGroups" >> DecodeGroups(config.seed, input_counts, layouts, config.num_shards,
                                                             min_decode_groups)
        decoder = GroupDecoder(*decoder_args, journal=unit_journal, read_path=plan.kind.path_reader(plan))
    decoded = to_decode | "DecodeResizeEncode" >> DecodeResizeEncode(decoder, layouts)
    records = decoded["records"]
    # Defaults in the views, not in the combines: a combine's default costs the local runner two more stages.
    summary = beam.pvalue.AsSingleton(decoded["summary"], default_value=sharding.RecordSummary())
    boundaries = records | "ShardBoundaries" >> ShardBoundaries(decoded["summary"], config.num_shards)
    shard_entries = records | "WriteShards" >> WriteShards(config.output, config.num_shards, boundaries, summary,
                                                           layouts)
    reject_summary = (listing_rejects, decoded["rejects"]) | "WriteRejects" >> WriteRejects(config.output)
    return p | "WriteManifest" >> WriteManifest(
        config.output, functools.partial(build_manifest, config, plan, runner), beam.pvalue.AsList(shard_entries),
        beam.pvalue.AsDict(input_counts), summary, beam.pvalue.AsSingleton(reject_summary), layouts)


def _fixed_layouts(p, config: PreprocessConfig, plan: SourcePlan, inputs):
    """{split: FixedLayout} as a side input, from the plan's key bounds or the listed keys; empty unless raw."""
    key_bounds = plan.kind.planned_key_bounds(plan)
    if key_bounds is None and uses_fixed_layout(config):
        return beam.pvalue.AsDict(inputs | "FixedLayouts" >> FixedLayouts(config.shorter_side))
    return beam.pvalue.AsSingleton(p | "FixedLayouts" >> GivenValues([planned_layouts(config, key_bounds or {})]))


def process_options(config: PreprocessConfig) -> image_ops.ProcessOptions:
    return image_ops.ProcessOptions(config.shorter_side, config.crop, config.encoding, config.jpeg_quality,
                                    config.max_pixels, DEFAULT_RESIZE_METHOD)  # the manifest records this method


class JobOutcome(NamedTuple):
    """What a finished run returns: the manifest it wrote, and its decode stage's counts (kept groups on --resume)."""
    manifest: dict
    decode: journal.ResumeCounts
    notes: tuple[str, ...] = ()  # the plan's notes for the user (SourcePlan.notes)


@dataclasses.dataclass
class JobHooks:
    """What the caller hears of a run, as typed events: a local run's counts twice a second; messages (the groups a
    resume keeps, the lines a sample of the inputs says); ``submitted`` once ``p.run()`` returned (after a stop: a
    remote job may exist)."""
    on_progress: Callable[[RunCounts], None] | None = None
    on_message: Callable[[Message], None] = lambda message: None
    submitted: bool = False


def execute_job(config: PreprocessConfig, beam_args: list[str], resume: bool = False,
                hooks: JobHooks | None = None) -> JobOutcome:
    """Runs the preprocess job to completion; returns the manifest it wrote and the decode stage's counts."""
    if refused := runners.preprocess_refusal(config, beam_args):  # before planning: a runner Beam has, paths it reads
        raise PreprocessError(refused)
    with runners.worker_zygote_for(beam_args):
        return _execute_job(config, beam_args, resume, hooks or JobHooks())


def _execute_job(config: PreprocessConfig, beam_args: list[str], resume: bool, hooks: JobHooks) -> JobOutcome:
    # Before anything under OUTPUT is created or deleted: apart from every input, a folder, only shardprep's files.
    # First by SOURCE's text alone: telling a folder from a folder of archives lists it, a request for gs://.
    claimed = kind_of(config.source)
    storage.keep_apart(config.output, claimed.apart_from(claimed.location(config.source), config))
    parsed = parse(config.source)
    storage.keep_apart(config.output, parsed.kind.apart_from(parsed.location, config))
    plan = plan_source(config, parsed)
    if config.exclude is not None:
        read_keys(config.exclude)  # an unreadable keys file is refused before OUTPUT is touched
    storage.keep_apart(config.output, plan.kind.planned_inputs(plan))
    storage.check_output_path(config.output)
    local, runner = runners.runs_locally(beam_args), runners.runner_name(beam_args) or "FnApiRunner"
    if resume:
        journal.check_resumable(config, plan, local)
    else:
        storage.check_replaceable(config.output, config.overwrite)
    # Listed once here: it is fingerprinted, and its sizes fit the local workers to the work.
    listing = plan.kind.listed_entries(config, plan) if journal.journaled(config, plan, local) else None
    if listing is not None:
        work_bytes = sum(entry.size for entry in listing if entry.size > 0)
        beam_args = runners.sized_to_work(beam_args, work_bytes, runners.PREPROCESS_BYTES_PER_WORKER)
        if not runners.uses_worker_processes(beam_args):
            worker_zygote.end_unneeded()
    plan, plan_lines = input_sizes.sized_plan(config, plan, listing)  # small inputs stop here, before OUTPUT
    # Two groups per local worker process: each gets work, a group as a shard where there are enough.
    min_groups = 2 * runners.local_workers(beam_args) if local else DEFAULT_MIN_DECODE_GROUPS
    with owned_folder.holding(config.output, "OUTPUT") as lock:
        unit_journal = None
        if resume:  # the killed run's groups, options (its --overwrite too, for the manifest) and group count
            assert listing is not None  # check_resumable refused a run that keeps no journal
            reopened = journal.reopen(config, runner, lock.begin, listing)
            recorded = reopened.recorded
            if reopened.finished and not recorded:
                raise storage.OutputError(f"nothing to resume in {config.output}: it holds a finished dataset "
                                          "(manifest.json); run without --resume (with --overwrite to make it again)")
            hooks.on_message(Message(f"resuming: {count(recorded, 'decode group')} finished before the stop "
                                     "(.tmp/journal.jsonl)\n  each is kept if its file checks out (size, sha256); the "
                                     "rest are decoded"))
            if reopened.finished:  # killed after its manifest: every group kept, nothing left but removing .tmp/
                return JobOutcome(manifest.read_document(config.output), journal.ResumeCounts(recorded, recorded, 0, 0))
            unit_journal, header = reopened.journal, reopened.header
            config, min_groups = dataclasses.replace(config, overwrite=header.overwrite), header.min_decode_groups
        else:
            prepare_output(config.output, config.overwrite, lock.stale)
            lock.begin()
            if listing is not None:
                unit_journal = journal.start(config, plan, runner, min_groups, listing)
        for line in plan_lines:  # said once the run will go ahead (a refused resume says only why)
            hooks.on_message(Message(line))
        return _run_pipeline(config, plan, beam_args, hooks, runner, min_groups, unit_journal)


def _run_pipeline(config: PreprocessConfig, plan: SourcePlan, beam_args: list[str], hooks: JobHooks, runner: str,
                  min_groups: int, unit_journal) -> JobOutcome:
    watched = runners.runs_locally(beam_args) and hooks.on_progress is not None
    def on_counts(totals: dict[str, int]) -> None:  # the counters' files, as a typed event
        if hooks.on_progress is not None:
            hooks.on_progress(RunCounts(**totals))

    with progress.watching(watched, on_counts, "shardprep-progress-") as progress_dir:
        try:
            p = runners.make_pipeline(beam_args)
            build_pipeline(p, config, plan, runner=runner, progress_dir=progress_dir, min_decode_groups=min_groups,
                           unit_journal=unit_journal)
            # submitted: a remote runner has created the job, which runs on after a stop here
            result = runners.run_to_end(p, beam_args, submitted=lambda: setattr(hooks, "submitted", True))
        except PreprocessError:
            raise
        except Exception as e:  # noqa: BLE001 - Beam wraps worker errors; surface the root cause readably
            raise PreprocessError(_root_cause(e)) from e
    if template := runners.template_location(beam_args):  # Dataflow only wrote a template; nothing ran yet
        return JobOutcome({"template_location": template}, journal.ResumeCounts(0, 0, 0, 0))
    document = manifest.read_document(config.output)
    notes = plan.notes + plan.kind.notes_after_run(plan, document)
    if config.exclude is not None:  # the file's keys that match no input: told, never silently ignored
        keys = read_keys(config.exclude)
        notes += (exclude_note(config.exclude, keys, unknown_keys(keys, config.output)),)
    return JobOutcome(document, decode_counts(result), notes)


def decode_counts(result) -> journal.ResumeCounts:
    """The decode stage's counters from a finished run's metrics; zeros where a runner has none."""
    totals: dict[str, int] = {}
    with contextlib.suppress(Exception):  # a runner without metrics: the counts are only reported
        for counter in result.metrics().query(MetricsFilter().with_namespace(METRICS_NAMESPACE))["counters"]:
            value = counter.committed if counter.committed is not None else counter.attempted
            totals[counter.key.metric.name] = totals.get(counter.key.metric.name, 0) + (value or 0)
    return journal.ResumeCounts(*(totals.get(name, 0) for name in DECODE_COUNTERS))


def _root_cause(error: Exception) -> str:
    """Beam reports a worker failure as a long chain; the user needs its last line, e.g. a PreprocessError's."""
    text = str(error)
    if any(sign in text for sign in ("Channel closed prematurely", "Socket closed", "Worker subprocess exited")):
        return ("a Beam worker process stopped unexpectedly (killed, or out of memory); the output has no "
                "manifest and is not a dataset: rerun with --overwrite, or with --resume to keep its finished work")
    if "PreprocessError: " in text:
        return text.rsplit("PreprocessError: ", 1)[1].split("\n", 1)[0].split(" [while running")[0].strip()
    last = [line.strip() for line in text.splitlines() if line.strip()]
    return last[-1].split(" [while running")[0] if last else type(error).__name__
