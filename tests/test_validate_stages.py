"""Each composite stage of validate alone, on a handful of elements, the way Beam's examples test theirs:
``TestPipeline`` on the in-process FnApiRunner (no network, no Prism) and ``assert_that`` on its output.

Validate end to end, on datasets the real preprocess job wrote and then damaged, is tests/test_validate.py.
"""

from __future__ import annotations

import hashlib
import json
import sys

import apache_beam as beam
import numpy as np
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from shardprep.pipelines.validate_job.read import ReadForeignFiles, ReadShards
from shardprep.pipelines.validate_job.graph import (CheckSplits, FindDuplicateFilenames, FindLeakage, KeepFirstProblems,
                                                 MergeForeignStats, SampleForContactSheet, WriteResults)
from shardprep.pipelines.validate_job.checks import problem
from shardprep.pipelines.validate_job.checks import RecordLocation, Sample, ShardTask
from shardprep.pipelines.validate_job.report import result_line, sample_line, split_summary
from shardprep.pipelines.validate_job.checks import SplitStats, channel_sums
from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.dataset import Manifest, ShardEntry

SHARD = "train/train-00000-of-00001.tfrecord"
VALUES = (10, 200, 90)  # one grey level per record


def pipeline() -> test_pipeline.TestPipeline:
    return test_pipeline.TestPipeline(runner=FnApiRunner())


def records() -> list[record_format.ImageRecord]:
    return [record_format.ImageRecord(encoded=bytes([value]) * 48, format="raw", height=4, width=4, label=i % 2,
                                      filename=f"train/{i}.png") for i, value in enumerate(VALUES)]


def layout() -> FixedLayout:
    return FixedLayout.for_records(4, 4, (len("train/0.png"), len("train/0.png")), 1)


def manifest(shard_entry: dict) -> dict:
    return {"format_version": 1, "classes": ["cat", "dog"], "encoding": "raw", "crop": "center", "shorter_side": 4, "image_height": 4,
            "image_width": 4, "stats_split": "train", "mean_rgb": None, "std_rgb": None,
            "splits": {"train": {"num_examples": 3, "class_counts": {"cat": 2, "dog": 1}, "shards": [shard_entry],
                                 "record_layout": layout().to_json()}}}


def write_shard(tmp_path, data: bytes) -> tuple[ShardTask, dict]:
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(data)
    entry = {"file": SHARD, "num_examples": 3, "num_bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return ShardTask("train", SHARD, str(path), ShardEntry.from_json(entry)), manifest(entry)


def expected_stats() -> SplitStats:
    stats = SplitStats()
    for record in records():
        stats.add_image(record.label, 4, 4, *channel_sums(np.frombuffer(record.encoded, np.uint8).reshape(4, 4, 3)))
    stats.shard_records[SHARD] = 3
    return stats


def test_read_shards_emits_the_shards_statistics_and_every_records_location(tmp_path):
    fixed = layout()
    task, dataset = write_shard(tmp_path, b"".join(fixed.shard_records(fixed.encode(r) for r in records())))
    with pipeline() as p:
        read = p | beam.Create([task]) | ReadShards(Manifest.from_json(dataset), None)
        assert_that(read.stats, equal_to([("train", expected_stats())]), label="Stats")
        assert_that(read.problem, equal_to([]), label="NoProblems")
        assert_that(read.filename, equal_to([(r.filename, RecordLocation("train", SHARD, i, r.filename))
                                             for i, r in enumerate(records())]), label="Filenames")
        # The leakage shuffle's key, which a local run holds for every record: the raw 16-byte digest.
        assert_that(read.pixel_hash | beam.MapTuple(lambda key, location: (type(key).__name__, len(key))),
                    equal_to([("bytes", 16)] * 3), label="PixelHashKeys")


def test_read_shards_names_a_corrupt_record_and_the_shards_changed_hash(tmp_path):
    fixed = layout()
    data = bytearray(b"".join(fixed.shard_records(fixed.encode(r) for r in records())))
    task, dataset = write_shard(tmp_path, bytes(data))
    data[fixed.record_bytes + fixed.image_offset + 1] ^= 0xFF  # inside record 1's pixels: its data CRC fails
    (tmp_path / "shard.tfrecord").write_bytes(bytes(data))
    with pipeline() as p:
        read = p | beam.Create([task]) | ReadShards(Manifest.from_json(dataset), None)
        checks = read.problem | beam.Map(lambda found: (found["check"], found["file"], found["index"]))
        assert_that(checks, equal_to([("record_corrupt", SHARD, 1), ("shard_sha256", SHARD, None)]))


def test_check_splits_merges_shards_and_compares_counts_with_the_manifest():
    dataset = manifest({"file": SHARD, "num_examples": 3})
    stats = expected_stats()
    dataset["mean_rgb"], dataset["std_rgb"] = stats.mean_std()  # as the job wrote them: no mean/std problem
    first, second = SplitStats(), SplitStats()
    for part, indices in ((first, (0, 1)), (second, (2,))):
        for i in indices:
            record = records()[i]
            part.add_image(record.label, 4, 4, *channel_sums(
                np.frombuffer(record.encoded, np.uint8).reshape(4, 4, 3)))
    first.shard_records[SHARD] = 3
    dataset["splits"]["validation"] = {"num_examples": 1, "class_counts": {"cat": 1}, "shards": []}
    with pipeline() as p:
        checked = p | beam.Create([("train", first), ("train", second)]) | CheckSplits(dataset, 0.05)
        assert_that(checked.split, equal_to([
            result_line("split", "train", split_summary("train", stats, dataset)),
            result_line("split", "validation", split_summary("validation", SplitStats(), dataset))]), label="Summaries")
        assert_that(checked.problem | beam.Map(lambda found: (found["check"], found["split"])),
                    equal_to([("split_count", "validation"), ("class_count", "validation")]), label="Problems")


def test_find_duplicate_filenames_names_the_first_two_records():
    a0, a5, b1 = (RecordLocation("train", "train/a", 0, "x.png"), RecordLocation("train", "train/a", 5, "x.png"),
                  RecordLocation("train", "train/b", 1, "y.png"))
    with pipeline() as p:
        found = (p | beam.Create([("x.png", a5), ("y.png", b1), ("x.png", a0)]) | FindDuplicateFilenames()
                 | beam.Map(lambda found: (found["check"], found["file"], found["index"], found["num_occurrences"],
                                           [(o["file"], o["index"]) for o in found["occurrences"]])))
        assert_that(found, equal_to([("filename_duplicate", "train/a", 5, 2, [("train/a", 0), ("train/a", 5)])]))


def test_find_leakage_reports_an_image_in_two_splits_and_counts_duplicates_within_one():
    train, train_again, test = (RecordLocation("train", "train/a", 3, "t.png"),
                                RecordLocation("train", "train/b", 0, "t2.png"),
                                RecordLocation("test", "test/a", 1, "copy.png"))
    other = RecordLocation("test", "test/a", 2, "alone.png")
    with pipeline() as p:
        leakage = (p | beam.Create([("h1", test), ("h1", train_again), ("h1", train), ("h2", other)])
                   | FindLeakage(["train", "test"]))
        assert_that(leakage["problem"] | beam.Map(lambda found: (found["file"], found["index"], found["keys"])),
                    equal_to([("test/a", 1, ["t.png", "copy.png"])]), label="Leakage")
        assert_that(leakage["duplicates"], equal_to([("train", 1)]), label="Duplicates")


def deep_size(value) -> int:
    """Bytes of memory a decoded value takes: the object and, for a tuple, its items."""
    return sys.getsizeof(value) + (sum(deep_size(item) for item in value) if isinstance(value, tuple) else 0)


class GroupedInputs(beam.pipeline.PipelineVisitor):
    """The PCollections grouped by a pipeline's GroupByKey transforms named ``names``."""

    def __init__(self, names: tuple[str, ...]):
        self.names, self.found = names, []

    def visit_transform(self, applied) -> None:
        if isinstance(applied.transform, beam.GroupByKey) and applied.full_label.endswith(self.names):
            self.found.extend(applied.inputs)

    enter_composite_transform = visit_transform


def at_most_144_bytes(sizes: list[int]) -> None:
    assert sizes and max(sizes) <= 144, sizes


def test_the_duplicate_and_leakage_shuffles_hold_each_location_in_one_small_object():
    # The local runner keeps every grouped value in the launcher's memory until the last shard is read: per record,
    # one value in the filename shuffle and one in the pixel-hash shuffle, as the coder of the grouped PCollection
    # decodes it.
    location = RecordLocation("train", "train/train-00042-of-01024.tfrecord", 1249, "n01440764/n01440764_10026.JPEG")
    assert deep_size(location) > 300  # what the location takes decoded
    with pipeline() as p:
        _ = p | "Filenames" >> beam.Create([(location.filename, location)]) | FindDuplicateFilenames()
        _ = p | "PixelHashes" >> beam.Create([("0" * 32, location)]) | FindLeakage(["train"])
        grouped = GroupedInputs(("/GroupByFilename", "/GroupByPixelHash"))
        p.visit(grouped)
        assert len(grouped.found) == 2
        for i, pairs in enumerate(grouped.found):
            coder = beam.coders.registry.get_coder(pairs.element_type)
            held = pairs | f"Held{i}" >> beam.Map(lambda pair, c=coder: deep_size(c.decode(c.encode(pair))[1]))
            assert_that(held, at_most_144_bytes, label=f"Small{i}")


def test_locations_cross_the_shuffles_unchanged():
    odd = [("", "", 0), ("train", "train/a", 5), ("tr\u00e4in", "a/\u65e5\u672c.tfrecord", 2**40)]
    named = [RecordLocation(*place, "x\x00y\U0001f600") for place in odd]  # one image/filename
    leaked = [RecordLocation(*place, filename) for place, filename in zip(odd, ["", "t.png", "\u00e9\ud7ff.png"])]
    with pipeline() as p:
        found = (p | "Named" >> beam.Create([(location.filename, location) for location in named])
                 | FindDuplicateFilenames() | "Occurrences" >> beam.Map(lambda found: found["occurrences"]))
        assert_that(found, equal_to([[location.to_json() for location in sorted(named)]]), label="Duplicates")
        leakage = (p | "Leaked" >> beam.Create([(b"h", location) for location in leaked])
                   | FindLeakage(["", "train", "tr\u00e4in"]))
        assert_that(leakage["problem"] | beam.Map(lambda found: found["occurrences"]),
                    equal_to([[location.to_json() for location in leaked]]), label="Leakage")


def test_keep_first_problems_caps_each_check_and_counts_all():
    problems = [problem("record_corrupt", "bad", split="train", file="train/a", index=i) for i in (4, 1, 3)]
    problems.append(problem("shard_sha256", "differs", split="train", file="train/a"))
    with pipeline() as p:
        lines = p | beam.Create(problems) | KeepFirstProblems(2)
        parsed = lines | beam.Map(json.loads) | beam.FlatMapTuple(lambda kind, check, value: (
            [(kind, check, found.get("index")) for found in value] if kind == "problem" else [(kind, check, value)]))
        assert_that(parsed, equal_to([("problem", "record_corrupt", 1), ("problem", "record_corrupt", 3),
                                      ("problem", "shard_sha256", None), ("problem_count", "record_corrupt", 3),
                                      ("problem_count", "shard_sha256", 1)]))


def test_sample_for_contact_sheet_keeps_the_lowest_ranks_per_class():
    samples = [(label, Sample(rank, f"{label}-{rank}", 1, 1, bytes(3))) for label in (0, 1)
               for rank in (0.5, 0.1, 0.3)]
    with pipeline() as p:
        lines = p | beam.Create(samples) | SampleForContactSheet(2)
        assert_that(lines, equal_to([
            sample_line(label, [Sample(0.1, f"{label}-0.1", 1, 1, bytes(3)), Sample(0.3, f"{label}-0.3", 1, 1,
                                                                                   bytes(3))])
            for label in (0, 1)]))


def foreign_record(features: dict) -> bytes:
    """A tf.train.Example of bytes/int64 features, hand-encoded (the same wire format TensorFlow writes)."""
    entries = b""
    for key, value in sorted(features.items()):
        if isinstance(value, bytes):
            feature = record_format._field(1, record_format._field(1, value))
        else:
            feature = record_format._field(3, record_format._field(1, record_format.varint(value)))
        entries += record_format._field(1, record_format._field(1, key.encode()) + record_format._field(2, feature))
    return record_format._field(1, entries)


def test_read_foreign_files_and_merge_foreign_stats(tmp_path):
    from PIL import Image
    import io

    png = io.BytesIO()
    Image.new("RGB", (3, 2)).save(png, format="PNG")
    path = tmp_path / "x-train.tfrecord-00000-of-00001"
    path.write_bytes(b"".join(tfrecord_io.frame(foreign_record(features)) for features in (
        {"image": png.getvalue(), "label": 1}, {"image": b"not an image", "label": 0}, {"image": png.getvalue()})))
    with pipeline() as p:
        read = p | beam.Create([(str(path), "train")]) | ReadForeignFiles("image", "label")
        summary = read.stats | MergeForeignStats() | beam.Map(json.loads) | beam.MapTuple(
            lambda _, split, line: (split, line["num_examples"], line["num_readable_images"], line["label_counts"],
                                    line["image_sizes"]["most_common"]))
        assert_that(summary, equal_to([("train", 3, 2, {"0": 1, "1": 1}, {"2x3": 2})]), label="Summary")
        assert_that(read.problem | beam.Map(lambda found: (found["check"], found["index"])),
                    equal_to([("image_decode", 1), ("label_missing", 2)]), label="Problems")


def test_write_results_writes_every_line_to_one_file(tmp_path):
    path = tmp_path / "results.jsonl"
    with pipeline() as p:
        first = p | "First" >> beam.Create(['{"kind": "a"}'])
        second = p | "Second" >> beam.Create(['{"kind": "b"}', '{"kind": "c"}'])
        _ = (first, second) | beam.Flatten() | WriteResults(str(path))
    assert sorted(path.read_text().splitlines()) == ['{"kind": "a"}', '{"kind": "b"}', '{"kind": "c"}']
