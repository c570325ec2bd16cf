"""Validate a prepared dataset (or foreign ``tfrecord:GLOB`` input) with an Apache Beam pipeline.

Prepared dataset (``DATA`` holds ``manifest.json`` and shards)::

    ListShards (driver)       manifest keys and totals, shard_missing / shard_unlisted against the files on disk
    ReadShards                one DoFn call per shard: sha256 and size while reading sequentially, CRC of every
                              record, parse, format/size/label against the manifest, decode pixels, exact channel sums
    MergeSplitStats           CombinePerKey(split): exact integer class counts, channel sums, image sizes
    CheckSplits               split/class counts and shard uniformity against the manifest, mean/std of stats_split
    FindDuplicateFilenames    GroupByKey(image/filename)
    FindLeakage               GroupByKey(pixel hash): an identical image in two splits
    SampleForContactSheet     deterministic lowest-rank k records per class (only with --pictures)
    KeepFirstProblems         at most --max-problems-per-check problems per check (all are counted)
    WriteResults              one JSON line per result; the driver reads them back and writes the report

Foreign input (``tfrecord:GLOB``, TFDS-style records with an encoded image and an int64 label)::

    ReadForeignFiles          per file: CRC, parse, image header (Pillow, no pixel decode), label
    MergeForeignStats         CombinePerKey(split from the TFDS file name, else "all")

No stage holds the dataset: shards are read one record at a time, and everything that crosses records goes through
a combiner or a GroupByKey. Run ``python -m pipelines.validate DATA [--json REPORT] [-- beam options]`` or
``shardprep validate``.

The JSON report (``--json``)::

    ok                      true only when problem_counts is empty (the exit status is 0 exactly then)
    data, kind              DATA as given; "dataset" or "tfrecord"
    problem_counts          {check: number of problems}, every problem counted
    problems                [{check, message, split, file, index, ...}] (file relative to the dataset, index the
                            0-based record in it; null where not applicable), at most --max-problems-per-check per
                            check, lowest file/record first; problems_truncated says whether some were left out
    elapsed_seconds, tool, tool_version
    pictures                {contact_sheet, class_counts}: paths written (with --pictures)
  prepared dataset, once a manifest was read:
    classes, encoding, crop, shorter_side, image_height, image_width    from the manifest
    stats_split, mean_rgb, std_rgb, manifest_mean_rgb, manifest_std_rgb, mean_std_tolerance
    num_examples, expected_num_examples, other_files (non-shard files found, e.g. rejects.jsonl)
    splits: {split: {num_examples, expected_num_examples, num_shards, expected_num_shards, class_counts,
             expected_class_counts, out_of_range_labels, mean_rgb, std_rgb, image_sizes, shard_records
             ({file: records}), duplicate_images (identical images within the split: not a failure)}}
  tfrecord:GLOB:
    image_key, label_key, num_files, num_examples
    splits: {split from the TFDS file name, else "all": {num_examples, num_files, num_readable_images,
             label_counts, num_labels, image_sizes, image_formats, image_modes, file_records ({file: records})}}

``image_sizes`` is {num_distinct, min/max/mean height and width, most_common {"HxW": n}}. The checks are listed
with their meaning in ``shardprep.preprocess.validation_checks.CHECKS``.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import io
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from typing import Callable, Iterator

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

from shardprep.pipelines import progress as progress_lib
from shardprep.preprocess import manifest as manifest_lib
from shardprep.preprocess import record_format, tfrecord_io
from shardprep.preprocess import manifest_schema
from shardprep.preprocess.validation_checks import (RecordExpectations, classify_files, layout_problems, manifest_problems,
                                          record_layout_length_problems, record_layout_offset_problem,
                                          mean_std_problems, problem, problem_sort_key, record_problems,
                                          shard_problems, split_problems)
from shardprep.preprocess.validation_stats import (MEAN_STD_TOLERANCE, ForeignStats, SplitStats, channel_sums,
                                         foreign_split, pixel_hash, sample_fraction, sample_rank, size_summary)

TFRECORD_PREFIX = "tfrecord:"
DEFAULT_SAMPLES_PER_CLASS = 6
DEFAULT_MAX_PROBLEMS_PER_CHECK = 100
DEFAULT_IMAGE_KEY = "image"
DEFAULT_LABEL_KEY = "label"
RESULTS_NAME = "validate-results.jsonl"
_FOUND_FILES_LISTED = 50  # how many leftover files a manifest_missing problem names
_OCCURRENCES_LISTED = 10  # how many records a duplicate/leakage problem names
_HEADER_BYTES = 12  # uint64 length + uint32 CRC of the length

_LOGGER = logging.getLogger(__name__)


class ValidateError(Exception):
    """Validation cannot run at all (not: the dataset has problems); the message is meant for the user."""


class ReportWriteError(ValidateError):
    """Validation ran, but writing ``--json`` or ``--pictures`` failed; ``report`` holds the result to show."""

    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


def check_output_paths(json_path: str | None, pictures: str | None) -> None:
    """Refuses, before anything runs, a local ``--json`` or ``--pictures`` that could not be written.

    ``--json`` must name a file in an existing, writable folder (not a folder); ``--pictures`` must be a folder, or
    a new one in an existing, writable folder (not a file). ``gs://`` paths are not checked ahead."""
    import os

    if json_path and "://" not in json_path:
        path = os.path.abspath(json_path)
        parent = os.path.dirname(path)
        if os.path.isdir(path):
            raise ValidateError(f"--json {json_path} is a folder; give a file name for the report, "
                                f"e.g. {manifest_lib.join(json_path, 'report.json')}")
        if not os.path.isdir(parent):
            raise ValidateError(f"--json {json_path}: the folder {parent} does not exist; create it or choose "
                                "another path")
        if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
            raise ValidateError(f"--json {json_path}: cannot write there (permission denied); choose a writable path")
    if pictures and "://" not in pictures:
        path = os.path.abspath(pictures)
        if os.path.exists(path) and not os.path.isdir(path):
            raise ValidateError(f"--pictures {pictures} is a file, not a folder; give a folder for the pictures")
        existing = path if os.path.isdir(path) else os.path.dirname(path)
        if not os.path.isdir(existing):
            raise ValidateError(f"--pictures {pictures}: the folder {existing} does not exist; create it or choose "
                                "another path")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValidateError(f"--pictures {pictures}: cannot write into {existing} (permission denied); "
                                "choose a writable folder")

# progress(stage, files_done, files_total, records_done): files_done is None while a stage has no count.
Progress = Callable[[str, "int | None", "int | None", "int | None"], None]


# --- reading TFRecord files ---------------------------------------------------------------------------------------

class _MeasuredReader:
    """Wraps a binary stream and counts (and optionally hashes) every byte read through it."""

    def __init__(self, stream, hash_bytes: bool):
        self._stream = stream
        self.sha256 = hashlib.sha256() if hash_bytes else None
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> int:
        """Reads to the end (so the hash covers the whole file); returns how many bytes that was."""
        start = self.num_bytes
        while self.read(1 << 20):
            pass
        return self.num_bytes - start


def iter_framed_records(reader: _MeasuredReader) -> Iterator[tuple[int, bytes | None, str | None]]:
    """Yields ``(index, record, None)`` per good record and ``(index, None, message)`` per corrupt one.

    A data-checksum error leaves the framing intact (the length had its own valid CRC and the reader stands at the
    next record), so reading resumes there; after a bad length or a truncation the rest cannot be framed and is
    drained unread.
    """
    base_index = 0
    while True:
        start = reader.num_bytes
        index = base_index
        try:
            for data in tfrecord_io.read_records(reader):
                yield index, data, None
                index += 1
            return
        except tfrecord_io.CorruptRecordError as e:
            record_index, record_offset = base_index + e.index, start + e.offset
            framing_intact = reader.num_bytes > record_offset + _HEADER_BYTES
            unread = 0 if framing_intact else reader.drain()
            message = f"byte offset {record_offset}: {str(e).split(': ', 1)[-1]}"
            if unread:
                message += f"; the {unread} bytes after it cannot be framed and were not read"
            yield record_index, None, message
            if not framing_intact:
                return
            base_index = record_index + 1


# --- prepared dataset ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One listed shard to read: its split, path relative to the dataset, full path and manifest entry."""

    split: str
    file: str
    path: str
    expected: dict


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """Which records become contact-sheet candidates, and how big their thumbnails may be."""

    split: str
    fraction: float
    cell_cap: int


class ReadShardFn(beam.DoFn):
    """Reads one shard sequentially: sha256, size and record count for the shard; CRC, parse, option checks,
    pixel statistics, filename and pixel hash for every record.

    Main output: ``(split, SplitStats)`` for the shard. Tagged outputs: ``problem`` (dicts), ``filename`` and
    ``pixel_hash`` (``(key, location)`` for the duplicate searches), ``sample`` (contact-sheet candidates).
    """

    def __init__(self, expectations: RecordExpectations, samples: SampleOptions | None,
                 progress_dir: str | None = None):
        self.expectations = expectations
        self.samples = samples
        self.progress_dir = progress_dir
        self.records_read = Metrics.counter("validate", "records_read")
        self.bytes_read = Metrics.counter("validate", "bytes_read")
        self.shards_read = Metrics.counter("validate", "shards_read")

    def process(self, task: ShardTask):
        stats = SplitStats()
        num_records = 0
        layout = self.expectations.record_layouts.get(task.split)
        data_lengths = []  # of a fixed-layout split's records, checked once the shard's last one is known
        try:
            with FileSystems.open(task.path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                reader = _MeasuredReader(stream, hash_bytes=True)
                for index, data, corruption in iter_framed_records(reader):
                    num_records += 1
                    if corruption is not None:
                        yield beam.pvalue.TaggedOutput("problem", problem(
                            "record_corrupt", corruption, split=task.split, file=task.file, index=index))
                        continue
                    if layout is not None:
                        data_lengths.append(len(data))
                    yield from self._check_record(task, index, data, stats, layout)
                reader.drain()
        except (OSError, beam.io.filesystem.BeamIOError) as e:
            yield beam.pvalue.TaggedOutput("problem", problem(
                "shard_unreadable", f"{type(e).__name__}: {e}", split=task.split, file=task.file))
            yield task.split, stats
            return
        if layout is not None and len(data_lengths) == num_records:  # (a corrupt record already failed the shard)
            for index, message in record_layout_length_problems(data_lengths, layout):
                yield beam.pvalue.TaggedOutput("problem", problem(
                    "record_layout", message, split=task.split, file=task.file, index=index))
        self.records_read.inc(num_records)
        self.bytes_read.inc(reader.num_bytes)
        self.shards_read.inc()
        progress_lib.mark(self.progress_dir, files=1, records=num_records)
        for found in shard_problems(task.split, task.file, task.expected, num_records, reader.num_bytes,
                                    reader.sha256.hexdigest()):
            yield beam.pvalue.TaggedOutput("problem", found)
        stats.shard_records[task.file] = num_records
        yield task.split, stats

    def _check_record(self, task: ShardTask, index: int, data: bytes, stats: SplitStats, layout: dict | None):
        def report(check: str, message: str):
            return beam.pvalue.TaggedOutput("problem", problem(check, message, split=task.split, file=task.file,
                                                               index=index))

        try:
            record = record_format.decode_example(data)
        except record_format.RecordFormatError as e:
            yield report("record_parse", str(e))
            return
        for check, message in record_problems(record, self.expectations):
            yield report(check, message)
        if layout is not None and record.format == "raw":
            misplaced = record_layout_offset_problem(data, record, layout)
            if misplaced:
                yield report("record_layout", misplaced)
        try:
            pixels = record_format.decode_pixels(record)
        except Exception as e:  # noqa: BLE001 - any codec failure on stored bytes is this record's problem
            yield report("image_decode", f"{type(e).__name__}: {e}")
            return
        height, width = pixels.shape[:2]
        if (height, width) != (record.height, record.width):
            yield report("record_size", f"stored pixels are {height}x{width}, record says "
                                        f"{record.height}x{record.width}")
        sums, square_sums = channel_sums(pixels)
        stats.add_image(record.label, height, width, sums, square_sums)
        pixel_bytes = record.encoded if record.format == "raw" else pixels.tobytes()
        location = (task.split, task.file, index, record.filename)
        yield beam.pvalue.TaggedOutput("filename", (record.filename, location))
        yield beam.pvalue.TaggedOutput("pixel_hash", (pixel_hash(height, width, pixel_bytes), location))
        samples = self.samples
        if (samples is not None and task.split == samples.split and 0 <= record.label < self.expectations.num_classes
                and sample_rank(record.filename) < samples.fraction):
            from shardprep.preprocess.validation_pictures import thumbnail

            small = thumbnail(pixels, samples.cell_cap)
            yield beam.pvalue.TaggedOutput("sample", (record.label, (
                sample_rank(record.filename), record.filename, small.shape[0], small.shape[1], small.tobytes())))


class MergeStatsFn(beam.CombineFn):
    """Adds up partial statistics (``SplitStats`` or ``ForeignStats``) exactly."""

    def __init__(self, stats_type):
        self.stats_type = stats_type

    def create_accumulator(self):
        return self.stats_type()

    def add_input(self, accumulator, partial):
        return accumulator.merge(partial)

    def merge_accumulators(self, accumulators):
        accumulators = iter(accumulators)
        merged = next(accumulators)
        for accumulator in accumulators:
            merged.merge(accumulator)
        return merged

    def extract_output(self, accumulator):
        return accumulator


class CheckSplitFn(beam.DoFn):
    """Compares one split's merged statistics with the manifest; emits the split's summary and its problems."""

    def __init__(self, manifest: dict, tolerance: float):
        self.manifest = manifest
        self.tolerance = tolerance

    def process(self, element):
        split, stats = element
        for found in split_problems(split, stats, self.manifest):
            yield beam.pvalue.TaggedOutput("problem", found)
        if split == self.manifest.get("stats_split"):
            for found in mean_std_problems(split, stats, self.manifest, self.tolerance):
                yield beam.pvalue.TaggedOutput("problem", found)
        yield split_summary(split, stats, self.manifest)


def split_summary(split: str, stats: SplitStats, manifest: dict) -> dict:
    """A split's entry in the report (JSON-ready)."""
    classes = manifest["classes"]
    info = manifest["splits"].get(split, {})
    statistics = stats.mean_std()
    return {
        "kind": "split",
        "split": split,
        "num_examples": stats.num_examples,
        "expected_num_examples": info.get("num_examples"),
        "num_shards": len(stats.shard_records),
        "expected_num_shards": len(info.get("shards", [])),
        "class_counts": {name: stats.label_counts.get(label, 0) for label, name in enumerate(classes)},
        "expected_class_counts": dict(info.get("class_counts", {})),
        "out_of_range_labels": {str(label): n for label, n in sorted(stats.label_counts.items())
                                if not 0 <= label < len(classes)},
        "mean_rgb": statistics[0] if statistics else None,
        "std_rgb": statistics[1] if statistics else None,
        "image_sizes": size_summary(stats.image_sizes),
        "shard_records": dict(sorted(stats.shard_records.items())),
    }


def _location_dict(location) -> dict:
    split, file, index, filename = location
    return {"split": split, "file": file, "index": index, "filename": filename}


class FindDuplicateFilenamesFn(beam.DoFn):
    """One ``filename_duplicate`` problem per image/filename held by more than one record."""

    def process(self, element):
        filename, locations = element
        count, first = 0, []
        for location in locations:
            count += 1
            first = sorted(first + [location])[:_OCCURRENCES_LISTED]
        if count < 2:
            return
        original, duplicate = first[0], first[1]
        yield problem("filename_duplicate",
                      f"image/filename {filename!r} is held by {count} records (first at {original[1]} record "
                      f"{original[2]})", split=duplicate[0], file=duplicate[1], index=duplicate[2],
                      filename=filename, num_occurrences=count, occurrences=[_location_dict(x) for x in first])


class FindLeakageFn(beam.DoFn):
    """One ``leakage`` problem per identical image found in more than one split, naming both keys.

    Within-split duplicates are not a failure; their number per split goes to the ``duplicates`` output.
    """

    def __init__(self, split_order: list[str]):
        self.split_order = split_order

    def process(self, element):
        _, locations = element
        first_by_split: dict[str, tuple] = {}
        count_by_split: dict[str, int] = {}
        for location in locations:
            split = location[0]
            count_by_split[split] = count_by_split.get(split, 0) + 1
            if split not in first_by_split or location < first_by_split[split]:
                first_by_split[split] = location
        for split, count in count_by_split.items():
            if count > 1:
                yield beam.pvalue.TaggedOutput("duplicates", (split, count - 1))
        if len(first_by_split) < 2:
            return
        order = {split: i for i, split in enumerate(self.split_order)}
        firsts = sorted(first_by_split.values(), key=lambda loc: (order.get(loc[0], len(order)), loc))
        original, leaked = firsts[0], firsts[1]
        yield problem("leakage",
                      f"identical image in {original[0]} ({original[3]!r}, {original[1]} record {original[2]}) and "
                      f"{leaked[0]} ({leaked[3]!r}, {leaked[1]} record {leaked[2]})",
                      split=leaked[0], file=leaked[1], index=leaked[2], keys=[loc[3] for loc in firsts],
                      occurrences=[_location_dict(loc) for loc in firsts[:_OCCURRENCES_LISTED]],
                      num_occurrences=sum(count_by_split.values()))


def _problem_with_sort_key(found: dict):
    return found["check"], (problem_sort_key(found), json.dumps(found, sort_keys=True))


def keep_first_problems(problems, max_per_check: int):
    """JSON lines: at most ``max_per_check`` problems per check (lowest shard/record first), and every count."""
    keyed = problems | "KeyProblemsByCheck" >> beam.Map(_problem_with_sort_key)
    kept = (keyed
            | "KeepFirstProblems" >> beam.combiners.Top.SmallestPerKey(max_per_check)
            | "ProblemLines" >> beam.FlatMap(lambda kv: [
                json.dumps({"kind": "problem", **json.loads(text)}) for _, text in kv[1]]))
    counts = (keyed
              | "CountProblems" >> beam.combiners.Count.PerKey()
              | "ProblemCountLines" >> beam.MapTuple(
                  lambda check, n: json.dumps({"kind": "problem_count", "check": check, "count": n})))
    return kept, counts


def _sample_line(element) -> str:
    label, candidates = element
    return json.dumps({"kind": "sample", "label": label, "images": [
        {"filename": filename, "height": height, "width": width, "pixels": base64.b64encode(pixels).decode()}
        for _, filename, height, width, pixels in candidates]})


def build_dataset_pipeline(pipeline: beam.Pipeline, manifest: dict, tasks: list[ShardTask], results_prefix: str,
                           samples: SampleOptions | None, samples_per_class: int, max_problems_per_check: int,
                           progress_dir: str | None = None):
    """The validate graph for a prepared dataset; writes JSON result lines to ``results_prefix``."""
    expectations = RecordExpectations.from_manifest(manifest)
    tolerance = MEAN_STD_TOLERANCE.get(manifest["encoding"], max(MEAN_STD_TOLERANCE.values()))
    splits = list(manifest["splits"])

    read = (pipeline
            | "ListShards" >> beam.Create(tasks)
            | "ReadShards" >> beam.ParDo(ReadShardFn(expectations, samples, progress_dir)).with_outputs(
                "problem", "filename", "pixel_hash", "sample", main="stats"))
    # Every manifest split gets a summary, even one whose shards are all missing.
    empty_splits = pipeline | "EverySplit" >> beam.Create([(split, SplitStats()) for split in splits])
    checked = ((read.stats, empty_splits)
               | "FlattenSplitStats" >> beam.Flatten()
               | "MergeSplitStats" >> beam.CombinePerKey(MergeStatsFn(SplitStats))
               | "CheckSplits" >> beam.ParDo(CheckSplitFn(manifest, tolerance)).with_outputs("problem", main="split"))
    duplicate_filenames = (read.filename
                           | "GroupByFilename" >> beam.GroupByKey()
                           | "FindDuplicateFilenames" >> beam.ParDo(FindDuplicateFilenamesFn()))
    leakage = (read.pixel_hash
               | "GroupByPixelHash" >> beam.GroupByKey()
               | "FindLeakage" >> beam.ParDo(FindLeakageFn(splits)).with_outputs("duplicates", main="problem"))
    duplicate_lines = (leakage.duplicates
                       | "CountDuplicateImages" >> beam.CombinePerKey(sum)
                       | "DuplicateLines" >> beam.MapTuple(
                           lambda split, n: json.dumps({"kind": "duplicate_images", "split": split, "count": n})))
    problems = ((read.problem, checked.problem, duplicate_filenames, leakage.problem)
                | "FlattenProblems" >> beam.Flatten())
    problem_lines, count_lines = keep_first_problems(problems, max_problems_per_check)
    split_lines = checked.split | "SplitLines" >> beam.Map(json.dumps)
    lines = [split_lines, problem_lines, count_lines, duplicate_lines]
    if samples is not None:
        lines.append(read.sample
                     | "SampleForContactSheet" >> beam.combiners.Top.SmallestPerKey(samples_per_class)
                     | "SampleLines" >> beam.Map(_sample_line))
    _ = (lines
         | "FlattenResults" >> beam.Flatten()
         | "WriteResults" >> beam.io.WriteToText(results_prefix, num_shards=1, shard_name_template=""))


# --- foreign tfrecord: input --------------------------------------------------------------------------------------

class ReadForeignFileFn(beam.DoFn):
    """Reads one foreign TFRecord file: CRC and parse of every record, image header (size, format, mode) and label.

    Main output: ``(split, ForeignStats)`` for the file; tagged output ``problem``.
    """

    def __init__(self, image_key: str, label_key: str, progress_dir: str | None = None):
        self.image_key = image_key
        self.label_key = label_key
        self.progress_dir = progress_dir
        self.records_read = Metrics.counter("validate", "records_read")

    def process(self, element):
        file, split = element
        stats = ForeignStats()
        num_records = 0
        try:
            with FileSystems.open(file, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                for index, data, corruption in iter_framed_records(_MeasuredReader(stream, hash_bytes=False)):
                    num_records += 1
                    if corruption is not None:
                        yield beam.pvalue.TaggedOutput("problem", problem(
                            "record_corrupt", corruption, split=split, file=file, index=index))
                        continue
                    for check, message in self._check_record(data, stats):
                        yield beam.pvalue.TaggedOutput("problem", problem(
                            check, message, split=split, file=file, index=index))
        except (OSError, beam.io.filesystem.BeamIOError) as e:
            yield beam.pvalue.TaggedOutput("problem", problem(
                "shard_unreadable", f"{type(e).__name__}: {e}", split=split, file=file))
        self.records_read.inc(num_records)
        progress_lib.mark(self.progress_dir, files=1, records=num_records)
        stats.num_records = num_records
        stats.file_records[file] = num_records
        yield split, stats

    def _check_record(self, data: bytes, stats: ForeignStats) -> list[tuple[str, str]]:
        from PIL import Image

        try:
            features = record_format.parse_features(data)
        except record_format.RecordFormatError as e:
            return [("record_parse", str(e))]
        found = []
        labels = features.get(self.label_key)
        if not labels or len(labels) != 1 or not isinstance(labels[0], int):
            found.append(("label_missing", f"feature {self.label_key!r} is {labels!r:.80}, not one int64"))
        else:
            stats.label_counts[labels[0]] = stats.label_counts.get(labels[0], 0) + 1
        images = features.get(self.image_key)
        if not images or len(images) != 1 or not isinstance(images[0], bytes):
            found.append(("image_missing", f"feature {self.image_key!r} is not one bytes value "
                                           f"(record has {sorted(features)})"))
            return found
        try:
            # Image.open reads the header only; no pixels are decoded.
            with Image.open(io.BytesIO(images[0])) as image:
                size, image_format, mode = image.size, image.format, image.mode
        except Exception as e:  # noqa: BLE001 - whatever a codec raises, the image is undecodable
            found.append(("image_decode", f"{type(e).__name__}: {e}"))
            return found
        stats.num_readable_images += 1
        for histogram, key in ((stats.image_sizes, f"{size[1]}x{size[0]}"), (stats.image_formats, str(image_format)),
                               (stats.image_modes, mode)):
            histogram[key] = histogram.get(key, 0) + 1
        return found


def foreign_summary(element) -> str:
    split, stats = element
    return json.dumps({
        "kind": "split",
        "split": split,
        "num_examples": stats.num_records,
        "num_files": len(stats.file_records),
        "num_readable_images": stats.num_readable_images,
        "label_counts": {str(label): n for label, n in sorted(stats.label_counts.items())},
        "num_labels": len(stats.label_counts),
        "image_sizes": size_summary(stats.image_sizes),
        "image_formats": dict(sorted(stats.image_formats.items())),
        "image_modes": dict(sorted(stats.image_modes.items())),
        "file_records": dict(sorted(stats.file_records.items())),
    })


def build_foreign_pipeline(pipeline: beam.Pipeline, files: list[str], image_key: str, label_key: str,
                           results_prefix: str, max_problems_per_check: int, progress_dir: str | None = None):
    """The validate graph for foreign TFRecord files; writes JSON result lines to ``results_prefix``."""
    read = (pipeline
            | "ListFiles" >> beam.Create([(file, foreign_split(file)) for file in files])
            | "ReadForeignFiles" >> beam.ParDo(ReadForeignFileFn(image_key, label_key, progress_dir)).with_outputs(
                "problem", main="stats"))
    split_lines = (read.stats
                   | "MergeForeignStats" >> beam.CombinePerKey(MergeStatsFn(ForeignStats))
                   | "SplitLines" >> beam.Map(foreign_summary))
    problem_lines, count_lines = keep_first_problems(read.problem, max_problems_per_check)
    _ = ((split_lines, problem_lines, count_lines)
         | "FlattenResults" >> beam.Flatten()
         | "WriteResults" >> beam.io.WriteToText(results_prefix, num_shards=1, shard_name_template=""))


# --- driver -------------------------------------------------------------------------------------------------------

def _absolute(path: str) -> str:
    """Local paths made absolute (so listed files can be made relative again); URLs unchanged."""
    import os

    return path if "://" in path else os.path.abspath(path)


def list_files(directory: str) -> list[str]:
    """Every file under ``directory`` (recursively), relative to it; local and ``gs://`` alike."""
    directory = directory.rstrip("/")
    try:
        matched = FileSystems.match([manifest_lib.join(directory, "**")])[0].metadata_list
    except beam.io.filesystem.BeamIOError:
        return []
    prefix = directory + "/"
    return sorted(meta.path[len(prefix):] for meta in matched if meta.path.startswith(prefix))


def _workers_share_this_machine(beam_args: list[str]) -> bool:
    from shardprep.pipelines import runner

    return runner.runner_name(beam_args).lower() in runner.LOCAL_RUNNER_NAMES


def _results_location(beam_args: list[str]) -> tuple[str, Callable[[], None]]:
    """Where the pipeline writes its result lines, and how to remove them afterwards.

    Local runs use a local temporary folder; a remote runner's workers cannot write there, so they use the
    pipeline's ``--temp_location``.
    """
    from shardprep.pipelines import runner

    temp_location = PipelineOptions(beam_args).view_as(GoogleCloudOptions).temp_location
    if _workers_share_this_machine(beam_args) and not temp_location:
        folder = tempfile.mkdtemp(prefix="shardprep-validate-")
        return manifest_lib.join(folder, RESULTS_NAME), lambda: shutil.rmtree(folder, ignore_errors=True)
    if not temp_location:
        raise ValidateError(f"validate with --runner={runner.runner_name(beam_args)} needs --temp_location "
                            "(a bucket path its workers can write their results to)")
    folder = manifest_lib.join(temp_location, f"shardprep-validate-{uuid.uuid4().hex}")
    path = manifest_lib.join(folder, RESULTS_NAME)
    return path, lambda: FileSystems.delete([path]) if FileSystems.exists(path) else None


def _run_pipeline(build: Callable[[beam.Pipeline, str, str | None], None], beam_args: list[str],
                  progress: Progress, stage: str, total_files: int) -> list[dict]:
    """Builds and runs a pipeline that writes JSON lines to the path it is given; returns the parsed lines.

    Local runs report files read as the workers finish them (marker files in a temporary folder); a remote
    runner shows its progress in its own UI.
    """
    from shardprep.pipelines import runner

    results_path, cleanup = _results_location(beam_args)

    def report(counts: dict[str, int]) -> None:
        progress(stage, min(counts.get("files", 0), total_files), total_files, counts.get("records", 0))

    local = _workers_share_this_machine(beam_args)
    progress(stage, 0 if local else None, total_files, 0)
    try:
        with progress_lib.watching(local, report, "shardprep-validate-progress-", interval_s=0.25) as progress_dir:
            pipeline = runner.make_pipeline(beam_args)
            build(pipeline, results_path, progress_dir)
            pipeline.run().wait_until_finish()
        with FileSystems.open(results_path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return [json.loads(line) for line in io.TextIOWrapper(f, encoding="utf-8") if line.strip()]
    finally:
        cleanup()


def merge_problems(driver_problems: list[dict], lines: list[dict], max_per_check: int) -> tuple[list, dict, bool]:
    """Problems found by the driver and by the pipeline, capped per check; returns (problems, counts, truncated)."""
    counts: dict[str, int] = {}
    for found in driver_problems:
        counts[found["check"]] = counts.get(found["check"], 0) + 1
    for line in lines:
        if line["kind"] == "problem_count":
            counts[line["check"]] = counts.get(line["check"], 0) + line["count"]
    kept = driver_problems + [{k: v for k, v in line.items() if k != "kind"} for line in lines
                              if line["kind"] == "problem"]
    by_check: dict[str, list] = {}
    for found in sorted(kept, key=problem_sort_key):
        by_check.setdefault(found["check"], []).append(found)
    problems = [found for check in sorted(by_check) for found in by_check[check][:max_per_check]]
    return problems, dict(sorted(counts.items())), len(problems) < sum(counts.values())


def _finish(report: dict, driver_problems: list[dict], lines: list[dict], max_per_check: int) -> dict:
    problems, counts, truncated = merge_problems(driver_problems, lines, max_per_check)
    report.update(ok=not counts, problem_counts=counts, problems=problems, problems_truncated=truncated)
    return report


def _report_base(data: str, kind: str) -> dict:
    from shardprep import __version__

    return {"ok": False, "data": data, "kind": kind, "tool": "shardprep validate", "tool_version": __version__}


def _manifest_missing_report(data_dir: str, found: list[str]) -> dict:
    kinds = classify_files(found)
    lock = manifest_lib.LOCK_NAME in found
    if not found:
        message = f"{data_dir} is empty or does not exist: nothing to validate"
    else:
        message = (f"no {manifest_lib.MANIFEST_NAME}: the dataset is incomplete (preprocess writes the manifest "
                   f"last, so a run that was killed or is still running leaves none). Found {len(found)} files: "
                   f"{len(kinds['shards'])} shards, {len(kinds['temporary'])} temporary files, "
                   f"{len(kinds['other'])} others" + (f" (including the lock file {manifest_lib.LOCK_NAME})" if lock
                                                      else "") + "; rerun preprocess with --overwrite")
    return problem("manifest_missing", message, found_files=found[:_FOUND_FILES_LISTED], num_found_files=len(found),
                   num_found_shards=len(kinds["shards"]), num_found_temporary=len(kinds["temporary"]),
                   lock_present=lock)


def validate_dataset(args, beam_args: list[str], progress: Progress) -> dict:
    data_dir = _absolute(args.data).rstrip("/")
    report = _report_base(args.data, "dataset")
    progress(f"listing {data_dir}", None, None, None)
    found = list_files(data_dir)
    if manifest_lib.MANIFEST_NAME not in found:
        return _finish(report, [_manifest_missing_report(data_dir, found)], [], args.max_problems_per_check)
    try:
        manifest = manifest_lib.load(data_dir)
    except manifest_lib.ManifestError as e:
        return _finish(report, [problem("manifest_invalid", str(e))], [], args.max_problems_per_check)
    shape = manifest_schema.shape_problems(manifest)
    if shape:
        found_problems = [problem("manifest_shape", message) for message in shape]
        report["skipped_checks"] = ("manifest.json has the wrong shape, so the shards were not read and no other "
                                    "check ran: fix manifest.json or rerun preprocess with --overwrite")
        return _finish(report, found_problems, [], args.max_problems_per_check)
    driver_problems = manifest_problems(manifest)
    if any(found_problem["check"] == "manifest_invalid" for found_problem in driver_problems):
        return _finish(report, driver_problems, [], args.max_problems_per_check)
    driver_problems += layout_problems(manifest, found)

    present = set(found)
    tasks = [ShardTask(split, shard["file"], manifest_lib.join(data_dir, shard["file"]), shard)
             for split, info in manifest["splits"].items() for shard in info["shards"] if shard["file"] in present]
    stats_split = manifest.get("stats_split") or next(iter(manifest["splits"]), None)
    samples = None
    if args.pictures and stats_split in manifest["splits"]:
        from shardprep.preprocess.validation_pictures import sheet_cell_cap

        samples = SampleOptions(
            split=stats_split,
            fraction=sample_fraction(manifest["splits"][stats_split].get("class_counts", {}), args.samples_per_class),
            cell_cap=sheet_cell_cap(len(manifest["classes"])))
    tolerance = MEAN_STD_TOLERANCE.get(manifest["encoding"], max(MEAN_STD_TOLERANCE.values()))
    total_bytes = sum(int(task.expected.get("num_bytes") or 0) for task in tasks)
    lines = _run_pipeline(
        lambda pipeline, results, progress_dir: build_dataset_pipeline(
            pipeline, manifest, tasks, results, samples, args.samples_per_class, args.max_problems_per_check,
            progress_dir),
        beam_args, progress, f"reading {len(tasks)} shards ({total_bytes / 2**20:,.1f} MiB)", len(tasks))

    splits = {line["split"]: {k: v for k, v in line.items() if k not in ("kind", "split")}
              for line in lines if line["kind"] == "split"}
    for line in lines:
        if line["kind"] == "duplicate_images":
            splits.get(line["split"], {})["duplicate_images"] = line["count"]
    for summary in splits.values():
        summary.setdefault("duplicate_images", 0)
    stats_summary = splits.get(stats_split, {})
    report.update(
        classes=manifest["classes"],
        encoding=manifest["encoding"], crop=manifest["crop"], shorter_side=manifest["shorter_side"],
        image_height=manifest.get("image_height"), image_width=manifest.get("image_width"),
        stats_split=stats_split,
        mean_rgb=stats_summary.get("mean_rgb"), std_rgb=stats_summary.get("std_rgb"),
        manifest_mean_rgb=manifest.get("mean_rgb"), manifest_std_rgb=manifest.get("std_rgb"),
        mean_std_tolerance=tolerance,
        num_examples=sum(s["num_examples"] for s in splits.values()),
        expected_num_examples=sum(int(info["num_examples"]) for info in manifest["splits"].values()),
        splits={split: splits[split] for split in manifest["splits"] if split in splits},
        other_files=[f for f in found if f != manifest_lib.MANIFEST_NAME
                     and not f.endswith(manifest_lib.SHARD_SUFFIX)][:_FOUND_FILES_LISTED],
    )
    report = _finish(report, driver_problems, lines, args.max_problems_per_check)
    if args.pictures:
        progress(f"writing pictures to {args.pictures}", None, None, None)
        samples_by_label = {line["label"]: line["images"] for line in lines if line["kind"] == "sample"}
        _write_pictures_or_fail(args, report, samples_by_label)
    return report


def validate_foreign(args, beam_args: list[str], progress: Progress) -> dict:
    pattern = args.data[len(TFRECORD_PREFIX):]
    pattern = pattern if "://" in pattern else _absolute(pattern)
    report = _report_base(args.data, "tfrecord")
    progress(f"matching {pattern}", None, None, None)
    try:
        matched = FileSystems.match([pattern])[0].metadata_list
    except beam.io.filesystem.BeamIOError:
        matched = []
    files = sorted(meta.path for meta in matched)
    if not files:
        return _finish(report, [problem("no_files", f"{pattern} matched no files")], [],
                       args.max_problems_per_check)
    lines = _run_pipeline(
        lambda pipeline, results, progress_dir: build_foreign_pipeline(
            pipeline, files, args.image_key, args.label_key, results, args.max_problems_per_check, progress_dir),
        beam_args, progress, f"reading {len(files)} files ({sum(m.size_in_bytes for m in matched) / 2**20:,.1f} MiB)",
        len(files))
    splits = {line["split"]: {k: v for k, v in line.items() if k not in ("kind", "split")}
              for line in lines if line["kind"] == "split"}
    report.update(image_key=args.image_key, label_key=args.label_key, num_files=len(files),
                  num_examples=sum(s["num_examples"] for s in splits.values()), splits=dict(sorted(splits.items())))
    report = _finish(report, [], lines, args.max_problems_per_check)
    if args.pictures:
        progress(f"writing pictures to {args.pictures}", None, None, None)
        _write_pictures_or_fail(args, report, None)
    return report


def _write_pictures_or_fail(args, report: dict, samples_by_label: dict | None) -> None:
    try:
        report["pictures"] = write_pictures(args.pictures, report, samples_by_label, args.samples_per_class)
    except (OSError, beam.io.filesystem.BeamIOError) as e:
        raise ReportWriteError(f"writing pictures to {args.pictures} failed: {e}; the report above is complete",
                               report) from e


def write_pictures(directory: str, report: dict, samples_by_label: dict | None, samples_per_class: int) -> dict:
    """Writes the contact sheet (prepared datasets only) and the class-count chart; returns their paths."""
    import numpy as np

    from shardprep.preprocess import validation_pictures as pictures

    written = {}
    splits = report.get("splits", {})
    if report["kind"] == "dataset":
        class_names = report["classes"]
        counts = {split: [summary["class_counts"].get(name, 0) for name in class_names]
                  for split, summary in splits.items()}
    else:
        labels = sorted({int(label) for summary in splits.values() for label in summary["label_counts"]})
        class_names = [f"label {label}" for label in labels]
        counts = {split: [summary["label_counts"].get(str(label), 0) for label in labels]
                  for split, summary in splits.items()}
    if samples_by_label is not None:
        rows = []
        for label, name in enumerate(class_names):
            images = [np.frombuffer(base64.b64decode(image["pixels"]), dtype=np.uint8).reshape(
                image["height"], image["width"], 3) for image in samples_by_label.get(label, [])]
            rows.append((name, images))
        written["contact_sheet"] = _write_png(directory, pictures.CONTACT_SHEET_NAME,
                                              pictures.contact_sheet(rows, samples_per_class))
    chart = pictures.class_count_chart(class_names, counts, f"records per class: {report['data']}")
    written["class_counts"] = _write_png(directory, pictures.CLASS_COUNTS_NAME, chart)
    return written


def _write_png(directory: str, name: str, image) -> str:
    from shardprep.preprocess.validation_pictures import png_bytes

    path = manifest_lib.join(_absolute(directory), name)
    with FileSystems.create(path, mime_type="image/png", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(png_bytes(image))
    return path


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m pipelines.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("data", help="a prepared dataset folder (local or gs://), or tfrecord:GLOB")
    parser.add_argument("--json", dest="json_path", help="write the JSON report here")
    parser.add_argument("--pictures", help="write contact_sheet.png and class_counts.png into this folder")
    parser.add_argument("--samples-per-class", type=int, default=DEFAULT_SAMPLES_PER_CLASS)
    parser.add_argument("--image-key", default=DEFAULT_IMAGE_KEY, help="tfrecord: input's image feature")
    parser.add_argument("--label-key", default=DEFAULT_LABEL_KEY, help="tfrecord: input's int64 label feature")
    parser.add_argument("--max-problems-per-check", type=int, default=DEFAULT_MAX_PROBLEMS_PER_CHECK)
    args, beam_args = parser.parse_known_args(argv)
    if args.samples_per_class < 1 or args.max_problems_per_check < 1:
        parser.error("--samples-per-class and --max-problems-per-check must be positive")
    return args, beam_args


def _log_progress(stage: str, done: int | None, total: int | None, records: int | None) -> None:
    _LOGGER.info("%s%s", stage, f": {done}/{total} read, {records} records" if done is not None else "")


def run(argv: list[str] | None = None, progress: Progress | None = None) -> dict:
    """Validates, writes ``--json`` and ``--pictures`` if asked, and returns the report (``report["ok"]``).

    ``progress(stage, files_done, files_total, records_done)`` is called as the run goes (see :data:`Progress`).
    """
    args, beam_args = parse_args(argv)
    check_output_paths(args.json_path, args.pictures)
    progress = progress or _log_progress
    started = time.monotonic()
    if args.data.startswith(TFRECORD_PREFIX):
        report = validate_foreign(args, beam_args, progress)
    else:
        report = validate_dataset(args, beam_args, progress)
    report["elapsed_seconds"] = round(time.monotonic() - started, 3)
    if args.json_path:
        path = args.json_path if "://" in args.json_path else _absolute(args.json_path)
        try:
            with FileSystems.create(path, mime_type="application/json",
                                    compression_type=CompressionTypes.UNCOMPRESSED) as f:
                f.write((json.dumps(report, indent=2) + "\n").encode("utf-8"))
        except (OSError, beam.io.filesystem.BeamIOError) as e:
            raise ReportWriteError(f"writing the report to {args.json_path} failed: {e}; the report above is "
                                   "complete", report) from e
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    result = run()
    print(json.dumps({k: result[k] for k in ("ok", "problem_counts")}, indent=2))
    sys.exit(0 if result["ok"] else 1)
