"""Validate's two Beam graphs and the composite stages across records; each graph writes result lines to
``results_path``, which the driver reads back. The stages, top to bottom: docs/validate.md ("The graph")."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from functools import partial

import apache_beam as beam
from apache_beam import coders

from shardprep.pipelines.validate_job.options import ValidateOptions
from shardprep.pipelines.validate_job.read import MergeFn, ReadForeignFiles, ReadShards, open_for_reading, record_at
from shardprep.pipelines.validate_job.checks import (ForeignStats, RecordLocation, SampleOptions, ShardTask, SplitStats,
                                                   foreign_split, mean_std_problems, problem, problem_sort_key,
                                                   split_problems)
from shardprep.pipelines.validate_job.near_pairs import (BUCKET_CAP, MIN_SCORE, Records, SearchKeys, distinct,
                                                       findings, plan, score_rows, search_tables, split_ranks,
                                                       thumbnail, to_score)
from shardprep.pipelines.validate_job.report import foreign_summary, result_line, sample_line, split_summary
from shardprep.preprocess.format import encodings, record_format
from shardprep.preprocess.format.dataset import Manifest

OCCURRENCES_LISTED = 10  # how many records a duplicate/leakage problem names

# A local run holds a shuffle's values in memory until the last shard is read (a pickled RecordLocation ~160 bytes, its
# fields encoded ~75): the duplicate and leakage shuffles carry them encoded (the filename's without its key).
_LOCATION_CODER = coders.TupleCoder([coders.StrUtf8Coder(), coders.StrUtf8Coder(), coders.VarIntCoder(),
                                     coders.StrUtf8Coder()])  # split, file, index, filename
_PLACE_CODER = coders.TupleCoder(_LOCATION_CODER.coders()[:3])  # split, file, index


def mean_std_tolerance(manifest: dict) -> float:
    """Its encoding's ``mean_std_tolerance``; the loosest for an encoding this version does not know."""
    if manifest["encoding"] in encodings.NAMES:
        return encodings.get(manifest["encoding"]).mean_std_tolerance
    return max(encoding.mean_std_tolerance for encoding in encodings.REGISTERED)


def _check_split(element, manifest: dict, tolerance: float):
    """``(split, merged SplitStats)`` -> the split's result line, and its problems (tagged ``problem``)."""
    split, stats = element
    found = split_problems(split, stats, manifest)
    if split == manifest.get("stats_split"):
        found += mean_std_problems(split, stats, manifest, tolerance)
    yield from (beam.pvalue.TaggedOutput("problem", each) for each in found)
    yield result_line("split", split, split_summary(split, stats, manifest))


@beam.ptransform_fn
def CheckSplits(shard_stats, manifest: dict, tolerance: float):
    """``(split, SplitStats)`` per shard -> a result line per manifest split (``split``) and tagged ``problem``."""
    every_split = shard_stats.pipeline | "EverySplit" >> beam.Create([(s, SplitStats()) for s in manifest["splits"]])
    return ((shard_stats, every_split)
            | "FlattenSplitStats" >> beam.Flatten()
            | "MergeSplitStats" >> beam.CombinePerKey(MergeFn(SplitStats))
            | "CheckSplit" >> beam.FlatMap(_check_split, manifest, tolerance).with_outputs("problem", main="split"))


def _duplicate_filename(element):
    """``(filename, [encoded places])`` -> a ``filename_duplicate`` problem when more than one record holds it."""
    filename, packed = element
    count, first = 0, []
    for data in packed:
        count += 1
        first = sorted(first + [RecordLocation(*_PLACE_CODER.decode(data), filename)])[:OCCURRENCES_LISTED]
    if count > 1:
        original, duplicate = first[0], first[1]
        yield problem("filename_duplicate",
                      f"image/filename {filename!r} is held by {count} records (first at {original.file} record "
                      f"{original.index})", split=duplicate.split, file=duplicate.file, index=duplicate.index,
                      filename=filename, num_occurrences=count, occurrences=[x.to_json() for x in first])


@beam.ptransform_fn
def FindDuplicateFilenames(filenames):
    """``(image/filename, RecordLocation)`` per record -> a ``filename_duplicate`` problem per shared filename."""
    return (filenames
            | "PackLocations" >> beam.MapTuple(lambda name, where: (name, _PLACE_CODER.encode(where[:3])))
            | "GroupByFilename" >> beam.GroupByKey()
            | "FindDuplicates" >> beam.FlatMap(_duplicate_filename))


def _leakage(element, split_order: list[str]):
    """``(pixel hash, [locations])`` -> a ``leakage`` problem if in two splits; tagged ``duplicates`` (split, n - 1)."""
    first_by_split: dict[str, RecordLocation] = {}
    count_by_split: collections.Counter[str] = collections.Counter()
    for location in (RecordLocation._make(_LOCATION_CODER.decode(data)) for data in element[1]):
        count_by_split[location.split] += 1
        first_by_split[location.split] = min(location, first_by_split.get(location.split, location))
    yield from (beam.pvalue.TaggedOutput("duplicates", (split, count - 1)) for split, count in count_by_split.items()
                if count > 1)
    if len(first_by_split) < 2:
        return
    order = {split: i for i, split in enumerate(split_order)}
    firsts = sorted(first_by_split.values(), key=lambda loc: (order.get(loc.split, len(order)), loc))
    original, leaked = firsts[0], firsts[1]
    yield problem("leakage",
                  f"identical image in {original.split} ({original.filename!r}, {original.file} record "
                  f"{original.index}) and {leaked.split} ({leaked.filename!r}, {leaked.file} record {leaked.index})",
                  split=leaked.split, file=leaked.file, index=leaked.index, keys=[loc.filename for loc in firsts],
                  occurrences=[loc.to_json() for loc in firsts[:OCCURRENCES_LISTED]],
                  num_occurrences=sum(count_by_split.values()))


@beam.ptransform_fn
def FindLeakage(pixel_hashes, split_order: list[str]):
    """``(pixel hash, RecordLocation)`` per record -> {problem: leakage problems, duplicates: (split, n) within it}."""
    found = (pixel_hashes
             | "PackLocations" >> beam.MapTuple(lambda key, where: (key, _LOCATION_CODER.encode(where)))
             | "GroupByPixelHash" >> beam.GroupByKey()
             | "FindLeaks" >> beam.FlatMap(_leakage, split_order).with_outputs("duplicates", main="problem"))
    return {"problem": found.problem,
            "duplicates": found.duplicates | "CountDuplicateImages" >> beam.CombinePerKey(sum)}


@beam.ptransform_fn
def KeepFirstProblems(problems, max_per_check: int):
    """Problem dicts -> per check a ``problem`` line of the first ``max_per_check`` and a ``problem_count`` line."""
    keyed = problems | "KeyProblemsByCheck" >> beam.Map(
        lambda found: (found["check"], (problem_sort_key(found), json.dumps(found, sort_keys=True))))
    kept = (keyed
            | "KeepFirst" >> beam.combiners.Top.SmallestPerKey(max_per_check)
            | "ProblemLines" >> beam.MapTuple(lambda check, first: result_line(
                "problem", check, [json.loads(text) for _, text in first])))
    counts = (keyed
              | "CountProblems" >> beam.combiners.Count.PerKey()
              | "ProblemCountLines" >> beam.MapTuple(lambda check, n: result_line("problem_count", check, n)))
    return (kept, counts) | "FlattenProblemLines" >> beam.Flatten()


@beam.ptransform_fn
def SampleForContactSheet(samples, samples_per_class: int):
    """``(label, Sample)`` candidates -> one ``sample`` result line per class: its lowest-rank ``samples_per_class``."""
    return (samples
            | "LowestRanks" >> beam.combiners.Top.SmallestPerKey(samples_per_class)
            | "SampleLines" >> beam.MapTuple(sample_line))


@beam.ptransform_fn
def MergeForeignStats(file_stats):
    """``(split, ForeignStats)`` per file -> one ``split`` result line per split."""
    return (file_stats
            | "MergeStats" >> beam.CombinePerKey(MergeFn(ForeignStats))
            | "SplitLines" >> beam.MapTuple(lambda split, stats: result_line("split", split, foreign_summary(stats))))


@beam.ptransform_fn
def WriteResults(lines, path: str):
    """Result lines (JSON strings) -> one text file at ``path``, which the driver reads back."""
    return lines | "WriteText" >> beam.io.WriteToText(path, num_shards=1, shard_name_template="")


def _read_thumbnails(element, paths: dict[str, str]):
    """``(file, [(row, index)])`` -> ``(row, thumbnail)`` of each record, the file read once, front to back."""
    file, wanted = element
    try:
        stream, _ = open_for_reading(paths[file])
        with stream:
            previous = -1
            for row, index in sorted(wanted, key=lambda entry: entry[1]):
                data = record_at(stream, index - previous - 1)  # the records between are skipped
                stream.seek(4, 1)  # past the data's checksum, to the next record
                previous = index
                yield row, thumbnail(record_format.decode_pixels(record_format.decode_example(data)))
    except Exception:  # noqa: BLE001 - unreadable, broken framing or a codec's error: validate named it already
        return  # the records not read score as flat: they pair with nothing


_OUTPUTS = ("counts", "pairs", "borderline", "leaked")
SEARCH_PARTS = 16  # elements the search's tables, and its scoring, are spread over (the workers share them)


@beam.ptransform_fn
def FindNearDuplicates(records, split_order: list[str], max_distance: int, pairs_listed: int,
                       search: SearchKeys = SearchKeys(), cap: int = BUCKET_CAP, min_score: float = MIN_SCORE,
                       paths: dict[str, str] | None = None):
    """``NearRecord`` per record (or ``Records``: a shard's) -> {counts: ((reference, split), n records of split with
    a near-duplicate in reference); pairs, borderline: ((reference, split), [NearPair]): every verified pair, most
    alike first, and the ``pairs_listed`` best that fell just short; leaked: each held-out RecordLocation with a
    near-duplicate in a training split; search: (buckets over the cap, members unchecked, the distance scored
    within)}. Gathered on one worker; the tables and the scoring in parts over the workers; thumbnails read from
    the shards (``paths``: file -> path) for candidates only."""
    ranks, spread = split_ranks(split_order), min(search.tables, SEARCH_PARTS)
    gathered = records | "GatherRecords" >> beam.CombineGlobally(MergeFn(Records, add="add"))
    hashes = gathered | "DistinctHashes" >> beam.Map(lambda gathered: distinct(gathered.hashes, gathered.mirrors))
    parts = (records.pipeline
             | "Tables" >> beam.Create([list(range(search.tables))[part::spread] for part in range(spread)])
             | "SearchTables" >> beam.Map(search_tables, beam.pvalue.AsSingleton(hashes), search, max_distance, cap))
    planned = gathered | "PlanSearch" >> beam.Map(plan, beam.pvalue.AsList(parts))
    read = (planned | "ShardsToRead" >> beam.FlatMap(lambda planned: planned.reads.items())
            | "SpreadReads" >> beam.Reshuffle() | "ReadThumbnails" >> beam.FlatMap(_read_thumbnails, paths or {}))
    scores = (planned | "PairsToScore" >> beam.FlatMap(to_score, ranks, SEARCH_PARTS)
              | "SpreadScoring" >> beam.Reshuffle() | "Score" >> beam.FlatMap(score_rows, beam.pvalue.AsDict(read)))
    found = (planned
             | "Findings" >> beam.Map(findings, beam.pvalue.AsDict(scores), ranks, min_score, pairs_listed)
             | "Outputs" >> beam.FlatMap(lambda found: [found.search, *(beam.pvalue.TaggedOutput(name, value) for name in
                                                             _OUTPUTS for value in getattr(found, name))])
             .with_outputs(*_OUTPUTS, main="search"))
    return {name: found[name] for name in (*_OUTPUTS, "search")}


def near_duplicate_lines(found: dict, search: SearchKeys, max_distance: int) -> list:
    """FindNearDuplicates' outputs as ``near_duplicate_*`` result lines (the search's keying in ``..._search``)."""
    keyed = {"tables": search.tables, "key_bits": search.bits, "bucket_cap": BUCKET_CAP,
             "expected_recall": {str(d): round(search.recall(d), 4)
                                 for d in sorted({max_distance // 2, max_distance})}}

    def listed(kind: str):
        return beam.MapTuple(lambda key, pairs: result_line(kind, key, [pair.to_json() for pair in pairs]))

    return [found["counts"] | "NearCountLines" >> beam.MapTuple(partial(result_line, "near_duplicate_count")),
            found["pairs"] | "NearPairLines" >> listed("near_duplicate_pairs"),
            found["borderline"] | "BorderlineLines" >> listed("near_duplicate_borderline"),
            found["leaked"] | "LeakedKeyLines" >> beam.Map(lambda at: result_line("near_duplicate_key", at.filename)),
            found["search"] | "SearchLine" >> beam.MapTuple(lambda buckets, unchecked, within: result_line(
                "near_duplicate_search", None, {"buckets_over_cap": buckets, "members_unchecked": unchecked,
                                                "scored_within": within, **keyed}))]


def build_dataset_pipeline(pipeline: beam.Pipeline, manifest: Manifest, tasks: list[ShardTask], results_path: str,
                           samples: SampleOptions | None, options: ValidateOptions, progress_dir: str | None = None,
                           search_near_duplicates: bool = True) -> None:
    """The validate graph for a prepared dataset; ``search_near_duplicates`` False leaves the search out."""
    max_distance, max_problems_per_check = options.near_duplicate_distance, options.max_problems_per_check
    document = manifest.to_json()  # the split checks compare with the manifest's own values
    read = pipeline | "ListShards" >> beam.Create(tasks) | "ReadShards" >> ReadShards(manifest, samples, progress_dir)
    checked = read.stats | "CheckSplits" >> CheckSplits(document, mean_std_tolerance(document))
    duplicate_filenames = read.filename | "FindDuplicateFilenames" >> FindDuplicateFilenames()
    leakage = read.pixel_hash | "FindLeakage" >> FindLeakage(list(manifest.splits))
    problems = ((read.problem, checked.problem, duplicate_filenames, leakage["problem"])
                | "FlattenProblems" >> beam.Flatten())
    lines = [checked.split,
             problems | "KeepFirstProblems" >> KeepFirstProblems(max_problems_per_check),
             leakage["duplicates"] | "DuplicateLines" >> beam.MapTuple(partial(result_line, "duplicate_images"))]
    search = SearchKeys.for_records(sum(info.num_examples for info in manifest.splits.values()), max_distance)
    if search_near_duplicates:
        lines += near_duplicate_lines(read.perceptual_hash | "FindNearDuplicates" >> FindNearDuplicates(
            list(manifest.splits), max_distance, max_problems_per_check, search,
            paths={task.file: task.path for task in tasks}), search, max_distance)
    if samples is not None:
        lines.append(read.sample | "SampleForContactSheet" >> SampleForContactSheet(options.samples_per_class))
    _ = lines | "FlattenResults" >> beam.Flatten() | "WriteResults" >> WriteResults(results_path)


def build_foreign_pipeline(pipeline: beam.Pipeline, files: Iterable[str], options: ValidateOptions,
                           results_path: str, progress_dir: str | None = None) -> None:
    read = (pipeline
            | "ListFiles" >> beam.Create([(file, foreign_split(file)) for file in files])
            | "ReadForeignFiles" >> ReadForeignFiles(options.image_key, options.label_key, progress_dir))
    lines = [read.stats | "MergeForeignStats" >> MergeForeignStats(),
             read.problem | "KeepFirstProblems" >> KeepFirstProblems(options.max_problems_per_check)]
    _ = lines | "FlattenResults" >> beam.Flatten() | "WriteResults" >> WriteResults(results_path)
