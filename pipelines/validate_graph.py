"""Validate's two Beam graphs, top to bottom; each writes JSON result lines to ``results_path``.

Prepared dataset (``DATA`` holds ``manifest.json`` and shards)::

    ListShards                the shards on disk the manifest lists (the driver listed them)
    ReadShards                one DoFn call per shard: sha256 and size while reading sequentially, CRC of every
                              record, parse, format/size/label/layout against the manifest, exact channel sums
    CheckSplits               CombinePerKey(split), then split/class counts, shard uniformity, mean/std
    FindDuplicateFilenames    GroupByKey(image/filename)
    FindLeakage               GroupByKey(pixel hash): an identical image in two splits
    FindNearDuplicates        perceptual hashes grouped, bucketed by search keys, pairs within the distance
                              scored on thumbnails (pipelines/near_duplicates.py): counts per split pair,
                              every verified pair, borderline candidates, leaked (held-out) keys
    SampleForContactSheet     deterministic lowest-rank k records per class (only with --pictures)
    KeepFirstProblems         at most --max-problems-per-check problems per check (all are counted)
    WriteResults              one JSON line per result

Foreign input (``tfrecord:GLOB``): ListFiles, ReadForeignFiles (CRC, parse, image header, label per record),
MergeForeignStats (per split from the TFDS file name, else "all"), KeepFirstProblems, WriteResults.
"""

from __future__ import annotations

import json

import apache_beam as beam

from shardprep.pipelines.near_duplicates import FindNearDuplicates
from shardprep.pipelines.validation.near_pairs import BUCKET_CAP, SearchKeys
from shardprep.pipelines.validate_options import default
from shardprep.pipelines.validate_read import ReadForeignFiles, ReadShards
from shardprep.pipelines.validate_stages import (CheckSplits, FindDuplicateFilenames, FindLeakage, KeepFirstProblems,
                                                 MergeForeignStats, SampleForContactSheet, WriteResults)
from shardprep.pipelines.validation.checks import RecordExpectations
from shardprep.pipelines.validation.elements import NearDuplicateOptions, SampleOptions, ShardTask
from shardprep.pipelines.validation.stats import foreign_split
from shardprep.preprocess import encodings
from shardprep.preprocess.dataset import Manifest


def mean_std_tolerance(manifest: dict) -> float:
    """How far the recomputed mean/std may be from the manifest's: its encoding's ``mean_std_tolerance``; the
    loosest for an encoding this version does not know (the manifest check names it)."""
    if manifest["encoding"] in encodings.NAMES:
        return encodings.get(manifest["encoding"]).mean_std_tolerance
    return max(encoding.mean_std_tolerance for encoding in encodings.REGISTERED)


def _duplicate_line(split: str, count: int) -> str:
    return json.dumps({"kind": "duplicate_images", "split": split, "count": count})


def near_duplicate_lines(found: dict, search: SearchKeys, max_distance: int) -> list:
    """FindNearDuplicates' outputs as result lines (``near_duplicate_count``, ``near_duplicate_pairs``,
    ``near_duplicate_borderline``, ``near_duplicate_key``, ``near_duplicate_search``: how the search went and how
    it was keyed)."""
    keyed = {"tables": search.tables, "key_bits": search.bits, "bucket_cap": BUCKET_CAP,
             "expected_recall": {str(d): round(search.recall(d), 4)
                                 for d in sorted({max_distance // 2, max_distance})}}
    return [
        found["counts"] | "NearCountLines" >> beam.MapTuple(lambda pair, count: json.dumps(
            {"kind": "near_duplicate_count", "reference": pair[0], "split": pair[1], "count": count})),
        found["pairs"] | "NearPairLines" >> beam.MapTuple(lambda pair, pairs: json.dumps(
            {"kind": "near_duplicate_pairs", "reference": pair[0], "split": pair[1],
             "pairs": [near.to_json() for near in pairs]})),
        found["borderline"] | "BorderlineLines" >> beam.MapTuple(lambda pair, pairs: json.dumps(
            {"kind": "near_duplicate_borderline", "reference": pair[0], "split": pair[1],
             "pairs": [near.to_json() for near in pairs]})),
        found["leaked"] | "LeakedKeyLines" >> beam.Map(lambda location: json.dumps(
            {"kind": "near_duplicate_key", "split": location.split, "key": location.filename})),
        found["search"] | "SearchLine" >> beam.MapTuple(lambda buckets, unchecked: json.dumps(
            {"kind": "near_duplicate_search", "buckets_over_cap": buckets, "members_unchecked": unchecked,
             **keyed})),
    ]


def build_dataset_pipeline(pipeline: beam.Pipeline, manifest: Manifest, tasks: list[ShardTask], results_path: str,
                           samples: SampleOptions | None, samples_per_class: int, max_problems_per_check: int,
                           progress_dir: str | None = None, near: NearDuplicateOptions | None = None,
                           search_near_duplicates: bool = True) -> None:
    """The validate graph for a prepared dataset (``manifest``: as the driver loaded and checked it); ``near``:
    the near-duplicate search's options (default: ValidateOptions' distance, ``max_problems_per_check`` pairs);
    ``search_near_duplicates``: False leaves the search out (see validate_options.near_duplicate_skip_reason)."""
    near = near or NearDuplicateOptions(default("near_duplicate_distance"), max_problems_per_check)
    document = manifest.to_json()  # the split checks compare with the manifest's own values
    read = (pipeline
            | "ListShards" >> beam.Create(tasks)  # ShardTask
            | "ReadShards" >> ReadShards(RecordExpectations.from_manifest(manifest), samples, progress_dir))
    # read.stats: (split, SplitStats) per shard; read.filename, read.pixel_hash: (key, RecordLocation);
    # read.perceptual_hash: NearRecord (hash, location, thumbnail)
    checked = read.stats | "CheckSplits" >> CheckSplits(document, mean_std_tolerance(document))
    # checked.split: the split's summary dict; checked.problem: problem dicts
    duplicate_filenames = read.filename | "FindDuplicateFilenames" >> FindDuplicateFilenames()
    leakage = read.pixel_hash | "FindLeakage" >> FindLeakage(list(manifest.splits))
    # leakage["problem"]: problem dicts; leakage["duplicates"]: (split, identical images within it)
    problems = ((read.problem, checked.problem, duplicate_filenames, leakage["problem"])
                | "FlattenProblems" >> beam.Flatten())
    lines = [checked.split | "SplitLines" >> beam.Map(json.dumps),
             problems | "KeepFirstProblems" >> KeepFirstProblems(max_problems_per_check),
             leakage["duplicates"] | "DuplicateLines" >> beam.MapTuple(_duplicate_line)]
    search = SearchKeys.for_records(sum(info.num_examples for info in manifest.splits.values()), near.max_distance)
    if search_near_duplicates:
        lines += near_duplicate_lines(read.perceptual_hash | "FindNearDuplicates" >> FindNearDuplicates(
            list(manifest.splits), near.max_distance, near.pairs_listed, search), search, near.max_distance)
    if samples is not None:  # read.sample: (label, Sample)
        lines.append(read.sample | "SampleForContactSheet" >> SampleForContactSheet(samples_per_class))
    _ = lines | "FlattenResults" >> beam.Flatten() | "WriteResults" >> WriteResults(results_path)


def build_foreign_pipeline(pipeline: beam.Pipeline, files: list[str], image_key: str, label_key: str,
                           results_path: str, max_problems_per_check: int, progress_dir: str | None = None) -> None:
    """The validate graph for foreign TFRecord files."""
    read = (pipeline
            | "ListFiles" >> beam.Create([(file, foreign_split(file)) for file in files])  # (file, split)
            | "ReadForeignFiles" >> ReadForeignFiles(image_key, label_key, progress_dir))
    # read.stats: (split, ForeignStats) per file; read.problem: problem dicts
    lines = [read.stats | "MergeForeignStats" >> MergeForeignStats(),
             read.problem | "KeepFirstProblems" >> KeepFirstProblems(max_problems_per_check)]
    _ = lines | "FlattenResults" >> beam.Flatten() | "WriteResults" >> WriteResults(results_path)
