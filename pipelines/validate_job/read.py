"""Validate's reading stages: each shard (or foreign TFRecord file) read once, front to back, by one DoFn call,
every byte counted and hashed, resuming after a record whose data checksum fails; no record is held."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import struct
from typing import Any, Generator, Iterator

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from shardprep.pipelines.runtime import progress as progress_lib
from shardprep.pipelines.sources.kind import open_file
from shardprep.pipelines.validate_job.checks import (ForeignStats, RecordLocation, Sample, SampleOptions, ShardTask,
                                                   SplitStats, channel_sums, pixel_hash, problem,
                                                   record_layout_length_problems, record_layout_offset_problem,
                                                   record_problems, sample_rank, shard_problems)
from shardprep.pipelines.validate_job.near_pairs import NearRecord, Records
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.preprocess.checks import untrusted
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.image.perceptual_hash import fingerprint

METRICS_NAMESPACE = "validate"
SHARD_OUTPUTS = ("problem", "filename", "pixel_hash", "perceptual_hash", "sample")


class MeasuredReader:
    """A binary stream with every byte read counted (and hashed), read no further than ``limit`` (a file's size)."""

    def __init__(self, stream, hash_bytes: bool, limit: int | None = None):
        self._stream, self.num_bytes, self.limit = stream, 0, limit
        self.sha256 = hashlib.sha256() if hash_bytes else None

    def read(self, size: int = -1) -> bytes:
        if self.limit is not None:
            left = self.limit - self.num_bytes
            size = left if size is None or size < 0 else min(size, left)
            if size <= 0:
                return b""
        data = self._stream.read(size)
        if self.sha256 is not None:
            self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def beyond_limit(self) -> bool:
        """Whether the stream holds bytes past ``limit`` (reads one of them, uncounted)."""
        return self.limit is not None and self.num_bytes >= self.limit and bool(self._stream.read(1))

    def drain(self) -> int:
        """Reads to the end (so the hash covers the whole file); returns how many bytes that was."""
        start = self.num_bytes
        while self.read(1 << 20):
            pass
        return self.num_bytes - start


def iter_framed_records(reader: MeasuredReader) -> Iterator[tuple[int, bytes | None, str | None]]:
    """``(index, record, None)`` per good record, ``(index, None, message)`` per corrupt one; after a bad data
    checksum reading resumes at the next record, after a bad length or a truncation the rest is drained unread."""
    base_index = 0
    while True:
        start = reader.num_bytes
        try:
            for index, data in enumerate(tfrecord_io.read_records(reader), base_index):
                yield index, data, None
            return
        except tfrecord_io.CorruptRecordError as e:
            record_index, record_offset = base_index + e.index, start + e.offset
            framing_intact = reader.num_bytes > record_offset + tfrecord_io.HEADER_BYTES
            unread = 0 if framing_intact else reader.drain()
            message = f"byte offset {record_offset}: {str(e).split(': ', 1)[-1]}"
            if unread:
                message += f"; the {unread} bytes after it cannot be framed and were not read"
            yield record_index, None, message
            if not framing_intact:
                return
            base_index = record_index + 1


RECORD_AT_MAX_BYTES = 1 << 30  # a longer record length is a broken header, not read


def record_at(stream, index: int) -> bytes:
    """Record ``index`` of a seekable TFRecord stream, those before it skipped; ``CorruptRecordError`` if broken."""
    for number in range(index + 1):
        header = stream.read(tfrecord_io.HEADER_BYTES)
        if len(header) < tfrecord_io.HEADER_BYTES:
            raise tfrecord_io.CorruptRecordError(f"the file ends before record {index}", number, 0)
        (length,) = struct.unpack("<Q", header[:8])
        if length > RECORD_AT_MAX_BYTES:
            raise tfrecord_io.CorruptRecordError(f"a record length of {length} bytes", number, 0)
        if number == index:
            data = stream.read(length)
            if len(data) < length:
                raise tfrecord_io.CorruptRecordError(f"record {index} is truncated", number, 0)
            return data
        stream.seek(length + 4, 1)
    raise AssertionError("unreachable")


def open_for_reading(path: str):
    """``(binary stream, size)`` of a shard or input file; a local one not a regular file: ``NotRegularFileError``."""
    if "://" not in path or path.startswith("file://"):
        descriptor = untrusted.open_regular_file(path.removeprefix("file://"))
        return os.fdopen(descriptor, "rb"), os.fstat(descriptor).st_size
    [matched] = FileSystems.match([path])[0].metadata_list[:1] or [None]
    if matched is None:
        raise FileNotFoundError(f"{path} does not exist")
    return open_file(path), matched.size_in_bytes


def read_record_pixels(path: str, index: int):
    """The pixels of record ``index`` of the shard at ``path``, or None when unreadable (already reported)."""
    try:
        stream, _ = open_for_reading(path)
        with stream:
            return record_format.decode_pixels(record_format.decode_example(record_at(stream, index)))
    except Exception:  # noqa: BLE001 - unreadable, broken framing, or whatever a codec raises: validate named it
        return None


def _problem(check: str, message: str, **where) -> beam.pvalue.TaggedOutput:
    return beam.pvalue.TaggedOutput("problem", problem(check, message, **where))


def _read_file(path: str, split: str, file: str, limit: int | None, check) -> Generator[Any, None, tuple]:
    """Every record of the file at ``path`` read once, no further than ``limit`` (else its size): ``check(index,
    data)``'s outputs per good record, a problem per corrupt one or an unreadable file. Returns (records met, the
    reader, the file's size, whether nothing lies past ``limit``), the last three None when unreadable."""
    num_records = 0
    try:
        stream, size = open_for_reading(path)
        with stream:
            reader = MeasuredReader(stream, hash_bytes=limit is not None, limit=size if limit is None else limit)
            for index, data, corruption in iter_framed_records(reader):
                num_records += 1
                if corruption is not None:
                    yield _problem("record_corrupt", corruption, split=split, file=file, index=index)
                else:
                    yield from check(index, data)
            reader.drain()
            return num_records, reader, size, not reader.beyond_limit()
    except (OSError, BeamIOError) as e:
        yield _problem("shard_unreadable", f"{type(e).__name__}: {e}", split=split, file=file)
        return num_records, None, None, None


class ReadShardFn(beam.DoFn):
    """One shard read sequentially: its sha256, size and count; every record's CRC, parse, checks, stats and keys."""

    def __init__(self, manifest: Manifest, samples: SampleOptions | None, progress_dir: str | None = None):
        self.manifest = manifest  # as the driver loaded and checked it
        self.layouts = manifest.fixed_layout_splits
        self.samples, self.progress_dir = samples, progress_dir
        self.records_read, self.bytes_read, self.shards_read = (
            Metrics.counter(METRICS_NAMESPACE, name) for name in ("records_read", "bytes_read", "shards_read"))

    def process(self, task: ShardTask):
        stats = SplitStats()
        layout = self.layouts.get(task.split)
        data_lengths: list[int] = []  # of a fixed-layout split's records, checked once the shard's last one is known
        near = Records()  # the shard's hashes as one element: no Beam element per record
        # No further than the manifest's size: a file far larger (a sparse terabyte) is not read to its end.
        num_records, reader, size, whole = yield from _read_file(
            task.path, task.split, task.file, task.expected.num_bytes,
            lambda index, data: self._check_record(task, index, data, stats, layout, data_lengths, near))
        yield beam.pvalue.TaggedOutput("perceptual_hash", near)
        if reader is None:
            yield task.split, stats
            return
        if layout is not None and len(data_lengths) == num_records:  # (a corrupt record already failed the shard)
            for index, message in record_layout_length_problems(data_lengths, layout):
                yield _problem("record_layout", message, split=task.split, file=task.file, index=index)
        self.records_read.inc(num_records)
        self.bytes_read.inc(reader.num_bytes)
        self.shards_read.inc()
        progress_lib.mark(self.progress_dir, files=1, records=num_records)
        for found in shard_problems(task.split, task.file, task.expected, num_records,
                                    reader.num_bytes if whole else max(size, reader.num_bytes + 1),
                                    reader.sha256.hexdigest() if whole else None):
            yield beam.pvalue.TaggedOutput("problem", found)
        stats.shard_records[task.file] = num_records
        yield task.split, stats

    def _check_record(self, task: ShardTask, index: int, data: bytes, stats: SplitStats, layout, data_lengths,
                      near: Records):
        def report(check: str, message: str):
            return _problem(check, message, split=task.split, file=task.file, index=index)

        if layout is not None:
            data_lengths.append(len(data))
        try:
            record = record_format.decode_example(data)
        except record_format.RecordFormatError as e:
            yield report("record_parse", str(e))
            return
        for check, message in record_problems(record, self.manifest):
            yield report(check, message)
        if layout is not None and record.format == self.manifest.encoding:  # a layout is the encoding's
            if misplaced := record_layout_offset_problem(data, record, layout):
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
        stats.add_image(record.label, height, width, *channel_sums(pixels))
        location = RecordLocation(task.split, task.file, index, record.filename)
        yield beam.pvalue.TaggedOutput("filename", (record.filename, location))
        yield beam.pvalue.TaggedOutput("pixel_hash", (pixel_hash(height, width, pixels), location))
        if height and width:
            near.add(NearRecord(fingerprint(pixels), location))
        yield from self._sample(task, record, pixels)

    def _sample(self, task: ShardTask, record: record_format.ImageRecord, pixels):
        samples = self.samples
        if (samples is None or task.split != samples.split or not 0 <= record.label < len(self.manifest.classes)
                or sample_rank(record.filename) >= samples.fraction):
            return
        from shardprep.pipelines.validate_job.pictures import thumbnail

        small = thumbnail(pixels, samples.cell_cap)
        yield beam.pvalue.TaggedOutput("sample", (record.label, Sample(
            sample_rank(record.filename), record.filename, small.shape[0], small.shape[1], small.tobytes())))


def ReadShards(manifest: Manifest, samples: SampleOptions | None, progress_dir: str | None = None):
    """``ShardTask`` -> ``(split, SplitStats)`` per shard (main output ``stats``), with the ``SHARD_OUTPUTS``."""
    return beam.ParDo(ReadShardFn(manifest, samples, progress_dir)).with_outputs(*SHARD_OUTPUTS, main="stats")


class MergeFn(beam.CombineFn):
    """Adds values into a ``factory()`` accumulator with its ``add`` method; accumulators merge with ``merge``."""

    def __init__(self, factory, add: str = "merge"):
        self.factory, self.add = factory, add

    def create_accumulator(self):
        return self.factory()

    def add_input(self, accumulator, value):
        return getattr(accumulator, self.add)(value)

    def merge_accumulators(self, accumulators):
        return functools.reduce(lambda merged, accumulator: merged.merge(accumulator), accumulators, self.factory())

    def extract_output(self, accumulator):
        return accumulator


class ReadForeignFileFn(beam.DoFn):
    """One foreign TFRecord file: every record's CRC, parse, image header (size, format, mode) and label."""

    def __init__(self, image_key: str, label_key: str, progress_dir: str | None = None):
        self.image_key, self.label_key, self.progress_dir = image_key, label_key, progress_dir
        self.records_read = Metrics.counter(METRICS_NAMESPACE, "records_read")

    def process(self, element):
        file, split = element
        stats = ForeignStats()
        num_records, *_ = yield from _read_file(file, split, file, None, lambda index, data: (
            _problem(check, message, split=split, file=file, index=index)
            for check, message in self._check_record(data, stats)))
        self.records_read.inc(num_records)
        progress_lib.mark(self.progress_dir, files=1, records=num_records)
        stats.num_records = num_records
        stats.file_records[file] = num_records
        yield split, stats

    def _check_record(self, data: bytes, stats: ForeignStats) -> list[tuple[str, str]]:
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
        from PIL import Image

        try:  # the size, format and mode from the image's header, no pixels decoded
            with Image.open(io.BytesIO(images[0])) as opened:
                size, image_format, mode = opened.size, opened.format, opened.mode
        except Exception as e:  # noqa: BLE001 - whatever a codec raises, the image is undecodable
            return found + [("image_decode", f"{type(e).__name__}: {e}")]
        stats.num_readable_images += 1
        for histogram, key in ((stats.image_sizes, f"{size[1]}x{size[0]}"), (stats.image_formats, str(image_format)),
                               (stats.image_modes, mode)):
            histogram[key] = histogram.get(key, 0) + 1
        return found


def ReadForeignFiles(image_key: str, label_key: str, progress_dir: str | None = None):
    """``(file, split)`` -> ``(split, ForeignStats)`` per file (main output ``stats``), tagged output ``problem``."""
    return beam.ParDo(ReadForeignFileFn(image_key, label_key, progress_dir)).with_outputs("problem", main="stats")
