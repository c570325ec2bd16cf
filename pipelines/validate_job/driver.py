"""The driver of ``shardprep validate``: lists DATA, checks the manifest, runs the Beam graph (graph.py), reads its
result lines back, assembles the report (report.py; its keys: docs/validate.md) and writes ``--json``/``--pictures``.
No stage holds the dataset: shards are read one record at a time; what crosses records goes through a shuffle."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from typing import Callable, Sequence

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from shardprep.pipelines.runtime import progress as progress_lib
from shardprep.pipelines.runtime import runner, stopping, storage
from shardprep.pipelines.sources import registry as source_registry
from shardprep.pipelines.sources.kind import RecordFiles, open_file
from shardprep.pipelines.sources.tfrecord import class_names_beside
from shardprep.pipelines.validate_job.graph import build_dataset_pipeline, build_foreign_pipeline, mean_std_tolerance
from shardprep.pipelines.validate_job.options import ValidateOptions, near_duplicate_skip_reason
from shardprep.pipelines.validate_job.paths import (ValidateError, WrittenOutputs, absolute, check_not_read,
                                                check_output_paths, data_kind)
from shardprep.pipelines.validate_job import report as report_lib
from shardprep.pipelines.validate_job.checks import (SampleOptions, ShardTask, layout_problems, manifest_problems,
                                                   problem, rejects_problems, sample_fraction,
                                                   unfit_layout_problems)
from shardprep.preprocess.checks.events import StageProgress
from shardprep.preprocess.checks.untrusted import NotRegularFileError
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format.dataset import Manifest, ManifestShapeError, load_manifest

RESULTS_NAME = "validate-results.jsonl"

_LOGGER = logging.getLogger(__name__)

Progress = Callable[[StageProgress], None]


class ReportWriteError(ValidateError):
    """Validation ran, but writing ``--json`` or ``--pictures`` failed; ``report`` holds the result to show."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def _results_location(beam_args: list[str]) -> tuple[str, Callable[[], None]]:
    """Where the graph writes its result lines (a local temporary folder, else --temp_location), and their cleanup."""
    temp_location = PipelineOptions(beam_args).view_as(GoogleCloudOptions).temp_location
    if runner.runs_locally(beam_args) and not temp_location:
        folder = tempfile.mkdtemp(prefix="shardprep-validate-")
        return manifest_lib.join(folder, RESULTS_NAME), lambda: shutil.rmtree(folder, ignore_errors=True)
    refused = runner.no_results_location(beam_args)
    if refused:  # checked before DATA is listed too (``validate_refusal``); here for a caller of the graph alone
        raise ValidateError(refused)
    path = manifest_lib.join(temp_location, f"shardprep-validate-{uuid.uuid4().hex}", RESULTS_NAME)
    return path, lambda: FileSystems.delete([path]) if FileSystems.exists(path) else None


def _run_pipeline(build: Callable, beam_args: list[str], progress: Progress, stage: str,
                  total_files: int, work_bytes: int) -> report_lib.Results:
    """Builds (``build(pipeline, results_path, progress_dir)``), sizes and runs a graph; returns its Results."""
    beam_args = runner.sized_to_work(beam_args, work_bytes, runner.VALIDATE_BYTES_PER_WORKER)
    results_path, cleanup = _results_location(beam_args)

    def report(counts: dict[str, int]) -> None:
        progress(StageProgress(stage, min(counts.get("files", 0), total_files), total_files, counts.get("records", 0)))

    local = runner.runs_locally(beam_args)
    progress(StageProgress(stage, 0 if local else None, total_files, 0))
    try:
        with progress_lib.watching(local, report, "shardprep-validate-progress-", interval_s=0.25) as progress_dir:
            pipeline = runner.make_pipeline(beam_args)
            build(pipeline, results_path, progress_dir)
            runner.run_to_end(pipeline, beam_args)
        with open_file(results_path) as f:
            return report_lib.read_results(io.TextIOWrapper(f, encoding="utf-8"))
    except stopping.WorkerStopped as e:  # the workers were ended: the run has no result
        raise ValidateError(str(e)) from None
    finally:
        cleanup()


def _checked_manifest(data_dir: str, found: list[str], report: dict) -> tuple[Manifest | None, list[dict]]:
    """(manifest or None when the shards cannot be read, problems); listed local non-files join ``found``."""
    try:
        manifest = load_manifest(data_dir, layouts_required=True, lenient_layouts=True)
    except ManifestShapeError as e:
        report["skipped_checks"] = ("manifest.json has the wrong shape, so the shards were not read and no other "
                                    "check ran: fix manifest.json or rerun preprocess with --overwrite")
        return None, [problem("manifest_shape", message) for message in e.problems]
    except manifest_lib.ManifestError as e:
        return None, [problem("manifest_invalid", str(e))]
    document = manifest.to_json()
    if storage.is_local(data_dir):
        listed = {shard.file for info in manifest.splits.values() for shard in info.shards}
        found.extend(sorted(file for file in listed - set(found)
                            if os.path.lexists(os.path.join(data_dir, *file.split("/")))))
    return manifest, (manifest_problems(document) + _rejects_problems(data_dir, document)
                      + unfit_layout_problems(manifest) + layout_problems(document, found))


REJECTS_MAX_BYTES = 512 << 20  # ~2.5 million rejects: more than ImageNet's inputs, every one rejected


def _rejects_problems(data_dir: str, document: dict) -> list[dict]:
    """rejects.jsonl against the manifest's counts, where the manifest names it (every run's does)."""
    if document.get("rejects_file") is None:  # a manifest that names no rejects file
        return []
    try:
        data = manifest_lib.read_file(manifest_lib.join(data_dir, manifest_lib.REJECTS_NAME), REJECTS_MAX_BYTES)
    except OSError as error:
        why = f"it {error.reason}" if isinstance(error, NotRegularFileError) else error.strerror or str(error)
        return [problem("rejects_file", f"cannot read {manifest_lib.REJECTS_NAME}: {why}")]
    return rejects_problems(document, data)


def validate_dataset(options: ValidateOptions, beam_args: list[str], progress: Progress,
                     outputs: WrittenOutputs) -> dict:
    data_dir = absolute(options.data).rstrip("/")
    report = report_lib.report_base(options.data, "dataset")
    progress(StageProgress(f"listing {data_dir}"))
    found = storage.list_files(data_dir)
    if storage.is_local(data_dir) and os.path.lexists(os.path.join(data_dir, manifest_lib.MANIFEST_NAME)):
        found = sorted(set(found) | {manifest_lib.MANIFEST_NAME})  # not a file (a folder, a FIFO): read and refused
    if manifest_lib.MANIFEST_NAME not in found:
        # Not a dataset at all (an image folder, a file, nothing): one error. A run that stopped early: a report.
        error = manifest_lib.missing_manifest_error(options.data[len("file://"):] if options.data.startswith("file://")
                                                    else options.data.rstrip("/") or "/")
        if error.kind != manifest_lib.PATH_INCOMPLETE:
            raise ValidateError(str(error))
        missing = report_lib.manifest_missing_problem(found)
        return report_lib.finish(report, [missing], report_lib.read_results(()), options.max_problems_per_check)
    manifest, driver_problems = _checked_manifest(data_dir, found, report)
    if manifest is None:
        return report_lib.finish(report, driver_problems, report_lib.read_results(()), options.max_problems_per_check)
    present = set(found)
    tasks = [ShardTask(split, shard.file, manifest_lib.join(data_dir, shard.file), shard)
             for split, info in manifest.splits.items() for shard in info.shards if shard.file in present]
    stats_split = manifest.stats_split or next(iter(manifest.splits), None)
    samples = None  # the contact sheet's candidates (--pictures), from the stats split
    if options.pictures and stats_split in manifest.splits:
        from shardprep.pipelines.validate_job.pictures import sheet_cell_cap

        fraction = sample_fraction(manifest.splits[stats_split].class_counts, options.samples_per_class)
        samples = SampleOptions(stats_split, fraction, sheet_cell_cap(len(manifest.classes)))
    document = manifest.to_json()  # for the report, which shows the manifest's own values
    total_bytes = sum(task.expected.num_bytes for task in tasks)
    skipped = near_duplicate_skip_reason(options)
    results = _run_pipeline(
        lambda pipeline, path, progress_dir: build_dataset_pipeline(
            pipeline, manifest, tasks, path, samples, options, progress_dir, search_near_duplicates=skipped is None),
        beam_args, progress, f"reading {len(tasks)} shards ({total_bytes / 2**20:,.1f} MiB)", len(tasks), total_bytes)
    report.update(report_lib.dataset_fields(document, found, results, stats_split, mean_std_tolerance(document)))
    if skipped:
        report["near_duplicates"] = {"skipped": skipped}  # why, which the CLI shows as a warning
    else:
        driver_problems += _near_duplicates(report, results, list(manifest.splits), options, outputs)
    report = report_lib.finish(report, driver_problems, results, options.max_problems_per_check)
    _write_pictures_or_fail(options, report, results, outputs, progress)
    return report


def _near_duplicates(report: dict, results: report_lib.Results, split_order: list[str], options: ValidateOptions,
                     outputs: WrittenOutputs) -> list:
    """Fills ``near_duplicates`` (and ``warnings``), writes ``--leaked-keys``; returns the problems failing the run."""
    split_records = {split: summary["num_examples"] for split, summary in report.get("splits", {}).items()}
    report["near_duplicates"] = near = report_lib.near_section(results, split_order, split_records, options)
    failing, warnings = report_lib.near_findings(near)
    if options.leaked_keys:
        text = report_lib.keys_file_text(sorted(results["near_duplicate_key"]), options.data, near)
        with _writing(f"the keys to {options.leaked_keys}", report, ""):
            near["leaked_keys_file"] = outputs.write("--leaked-keys", absolute(options.leaked_keys),
                                                     text.encode("utf-8"), "text/plain")
    if warnings or not failing:
        report["warnings"] = warnings
    return failing


def _foreign_files(options: ValidateOptions, progress: Progress) -> tuple[str, RecordFiles, list]:
    """(DATA's kind, its globs and class names, the matched files' metadata) of a ``tfrecord:`` or ``tfds:`` DATA."""
    progress(StageProgress(f"finding the files of {options.data}"))
    try:
        parsed = source_registry.parse(options.data)
        found = parsed.kind.record_files(parsed.location, options.tfds_data_dir, options.label_key)
    except sources.SourceError as e:
        raise ValidateError(str(e)) from None
    matched = []
    for pattern in found.patterns:
        with contextlib.suppress(BeamIOError):
            matched += FileSystems.match([absolute(pattern)])[0].metadata_list
    return parsed.kind.name, found, matched


def _no_files_problem(pattern: str, matched: list) -> dict:
    """The ``no_files`` problem of a glob that matched nothing, or only folders (which hold the files)."""
    folders = [meta.path for meta in matched]
    if len(folders) == 1:
        return problem("no_files", f"{folders[0]} is a folder: give a glob of its files, e.g. "
                                   f"tfrecord:{manifest_lib.join(folders[0], '*.tfrecord*')}")
    if folders:
        return problem("no_files", f"{pattern} matched only folders ({', '.join(folders[:3])}"
                                   f"{', …' if len(folders) > 3 else ''}): give a glob of their files")
    return problem("no_files", f"{pattern} matched no files")


def validate_foreign(options: ValidateOptions, beam_args: list[str], progress: Progress,
                     outputs: WrittenOutputs) -> dict:
    kind, found, matched = _foreign_files(options, progress)
    report = report_lib.report_base(options.data, kind)
    folders = [meta for meta in matched if storage.is_local(meta.path) and os.path.isdir(absolute(meta.path))]
    matched = [meta for meta in matched if meta not in folders]
    files = sorted(meta.path for meta in matched)
    check_not_read(options, files)
    if not files:
        pattern = absolute(found.patterns[0]) if len(found.patterns) == 1 else options.data
        return report_lib.finish(report, [_no_files_problem(pattern, folders)],
                                 report_lib.read_results(()), options.max_problems_per_check)
    total_bytes = sum(meta.size_in_bytes for meta in matched)
    results = _run_pipeline(
        lambda pipeline, path, progress_dir: build_foreign_pipeline(pipeline, files, options, path, progress_dir),
        beam_args, progress, f"reading {len(files)} files ({total_bytes / 2**20:,.1f} MiB)", len(files), total_bytes)
    splits = results["split"]
    report.update(image_key=options.image_key, label_key=options.label_key, num_files=len(files),
                  num_examples=sum(s["num_examples"] for s in splits.values()), splits=dict(sorted(splits.items())))
    driver_problems = []
    try:  # the class names preprocess would read for these files (TFDS's label.labels.txt beside them)
        classes = found.classes or class_names_beside(files[0])
    except sources.SourceError as e:
        classes, driver_problems = None, [problem("class_names", str(e))]
    if classes:
        report["classes"] = classes
    report = report_lib.finish(report, driver_problems, results, options.max_problems_per_check)
    _write_pictures_or_fail(options, report, None, outputs, progress)
    return report


@contextlib.contextmanager
def _writing(what: str, report: dict, after: str = "; the report above is complete"):
    """A failed write of ``what`` as a ReportWriteError that holds ``report`` (the checks' result, still shown)."""
    try:
        yield
    except (OSError, BeamIOError) as e:
        raise ReportWriteError(f"writing {what} failed: {e}{after}", report) from e


def _write_pictures_or_fail(options: ValidateOptions, report: dict, results: report_lib.Results | None,
                            outputs: WrittenOutputs, progress: Progress) -> None:
    if not options.pictures:
        return
    progress(StageProgress(f"writing pictures to {options.pictures}"))
    with _writing(f"pictures to {options.pictures}", report):
        report["pictures"] = write_pictures(options.pictures, report, results, options.samples_per_class, outputs)


def write_pictures(directory: str, report: dict, results: report_lib.Results | None, samples_per_class: int,
                   outputs: WrittenOutputs) -> dict:
    """Writes the contact sheet, the near-duplicate pages and, last, the class-count chart; returns their paths."""
    from shardprep.pipelines.validate_job.read import read_record_pixels
    from shardprep.pipelines.validate_job import pictures
    from shardprep.preprocess.sources import wordnet_names

    def write(name: str, data: bytes, mime_type: str = "image/png", whole: bool = False) -> str:
        return outputs.write("--pictures", manifest_lib.join(absolute(directory), name), data, mime_type, whole)

    written = {}
    class_names, counts = report_lib.chart_counts(report)
    class_names = [wordnet_names.display_name(name) for name in class_names]  # tench (n01440764), as predict says
    if results is not None:
        sheet = pictures.contact_sheet(report_lib.sheet_rows(class_names, results), samples_per_class)
        written["contact_sheet"] = write(pictures.CONTACT_SHEET_NAME, pictures.png_bytes(sheet))
    if (near := report.get("near_duplicates")) and "skipped" not in near:  # a search ran
        data_dir = absolute(report["data"]).rstrip("/")
        near["pages"] = pages = [write(name, png) for name, png in pictures.pages_of(report, lambda file, index: (
            read_record_pixels(manifest_lib.join(data_dir, file), index)))]
        near["pairs_drawn"] = len(pictures.shown_pairs(near))
        page = pictures.html_of(report, [os.path.basename(path) for path in pages])
        written.update(near_duplicates=pages[0],
                       near_duplicates_html=write(pictures.NEAR_DUPLICATES_HTML, page, "text/html"))
    chart = pictures.class_count_chart(class_names, counts, f"records per class: {report['data']}")
    written["class_counts"] = write(pictures.CLASS_COUNTS_NAME, pictures.png_bytes(chart), whole=True)
    return written


def run(options: ValidateOptions, beam_args: Sequence[str] = (), progress: Progress | None = None,
        outputs: WrittenOutputs | None = None) -> dict:
    """Validates, writes --json and --pictures if asked; returns the report. ``outputs`` records each file written."""
    beam_args = list(beam_args)
    refused = runner.validate_refusal(options.data, options.tfds_data_dir, beam_args)
    if refused:  # before DATA is listed: a runner Beam has, and on Dataflow a DATA its workers can read
        raise ValidateError(refused)
    check_output_paths(options)
    progress = progress or (lambda event: _LOGGER.info("%s%s", event.stage, "" if event.done is None else
                                                       f": {event.done}/{event.total} read, {event.records} records"))
    outputs = WrittenOutputs() if outputs is None else outputs
    started = time.monotonic()
    kind = data_kind(options.data)
    if kind is not source_registry.FALLBACK and not kind.validated_as_records:
        raise ValidateError(f"{options.data} is a source of kind {kind.name}, which validate does not read: give a folder "
                            f"shardprep preprocess wrote (run shardprep preprocess on it first), tfrecord:GLOB or "
                            f"tfds:NAME")
    if refused := options.refusal(kind.name, kind.options, prepared=not kind.validated_as_records):
        raise ValidateError(refused)
    try:
        with runner.worker_zygote_for(beam_args):  # before the first pipeline, while no thread runs here
            report = (validate_foreign if kind.validated_as_records else validate_dataset)(
                options, beam_args, progress, outputs)
    except ReportWriteError as failed:  # the pictures or keys after the checks: the report is still written
        _finish(failed.report, options, started, outputs)
        raise
    return _finish(report, options, started, outputs)


def _finish(report: dict, options: ValidateOptions, started: float, outputs: WrittenOutputs) -> dict:
    """``report`` with the run's time, written to ``--json`` if asked."""
    report["elapsed_seconds"] = round(time.monotonic() - started, 3)
    if options.json_path:
        with _writing(f"the report to {options.json_path}", report):
            outputs.write("--json", absolute(options.json_path), (json.dumps(report, indent=2) + "\n").encode(),
                          "application/json")
    return report

