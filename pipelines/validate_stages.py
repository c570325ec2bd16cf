"""Validate's stages across records: merged split statistics, duplicate filenames, leakage, capped problems,
contact-sheet samples, and the result lines the driver reads back. Element types are in each docstring."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam import coders

from shardprep.pipelines.validation.checks import mean_std_problems, problem, problem_sort_key, split_problems
from shardprep.pipelines.validation.elements import RecordLocation
from shardprep.pipelines.validation.report import foreign_summary, sample_line, split_summary
from shardprep.pipelines.validation.stats import ForeignStats, SplitStats

OCCURRENCES_LISTED = 10  # how many records a duplicate/leakage problem names

# A local run (Beam's in-process runner) holds every value of a shuffle in the launcher's memory, as its encoding,
# until the last shard is read: a RecordLocation pickled with its class (~160 bytes) where its fields alone take ~75.
# So the duplicate and leakage shuffles carry each location as its fields encoded, and decode it after the grouping;
# the filename shuffle leaves out the filename, which is its key.
_LOCATION_CODER = coders.TupleCoder([coders.StrUtf8Coder(), coders.StrUtf8Coder(), coders.VarIntCoder(),
                                     coders.StrUtf8Coder()])  # split, file, index, filename
_PLACE_CODER = coders.TupleCoder(_LOCATION_CODER.coders()[:3])  # split, file, index


def packed_location(key, location: RecordLocation) -> tuple:
    """``(key, RecordLocation)`` -> ``(key, bytes)``: the location encoded, as it crosses the leakage shuffle."""
    return key, _LOCATION_CODER.encode(location)


def unpacked_locations(packed: Iterable[bytes]) -> Iterator[RecordLocation]:
    """The ``RecordLocation`` of each value ``packed_location`` encoded."""
    return (RecordLocation._make(_LOCATION_CODER.decode(data)) for data in packed)


def packed_place(filename: str, location: RecordLocation) -> tuple:
    """``(image/filename, RecordLocation)`` -> ``(image/filename, bytes)``: the location without its filename (the
    key) encoded, as it crosses the filename shuffle."""
    return filename, _PLACE_CODER.encode(location[:3])


def unpacked_places(filename: str, packed: Iterable[bytes]) -> Iterator[RecordLocation]:
    """The ``RecordLocation`` of each value ``packed_place`` encoded for ``filename``."""
    for data in packed:
        split, file, index = _PLACE_CODER.decode(data)
        yield RecordLocation(split, file, index, filename)


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


class CheckSplits(beam.PTransform):
    """``(split, SplitStats)`` per shard -> one summary dict per manifest split (main output ``split``; a split
    whose shards are all missing gets one too) and tagged output ``problem``."""

    def __init__(self, manifest: dict, tolerance: float):
        super().__init__()
        self.manifest, self.tolerance = manifest, tolerance

    def expand(self, shard_stats):
        every_split = shard_stats.pipeline | "EverySplit" >> beam.Create(
            [(split, SplitStats()) for split in self.manifest["splits"]])
        return ((shard_stats, every_split)
                | "FlattenSplitStats" >> beam.Flatten()
                | "MergeSplitStats" >> beam.CombinePerKey(MergeStatsFn(SplitStats))  # (split, SplitStats)
                | "CheckSplit" >> beam.ParDo(CheckSplitFn(self.manifest, self.tolerance)).with_outputs(
                    "problem", main="split"))


class FindDuplicateFilenamesFn(beam.DoFn):
    """One ``filename_duplicate`` problem per image/filename held by more than one record."""

    def process(self, element):
        filename, locations = element
        count, first = 0, []
        for location in unpacked_places(filename, locations):
            count += 1
            first = sorted(first + [location])[:OCCURRENCES_LISTED]
        if count < 2:
            return
        original, duplicate = first[0], first[1]
        yield problem("filename_duplicate",
                      f"image/filename {filename!r} is held by {count} records (first at {original.file} record "
                      f"{original.index})", split=duplicate.split, file=duplicate.file, index=duplicate.index,
                      filename=filename, num_occurrences=count, occurrences=[x.to_json() for x in first])


class FindDuplicateFilenames(beam.PTransform):
    """``(image/filename, RecordLocation)`` per record -> a ``filename_duplicate`` problem per shared filename."""

    def expand(self, filenames):
        return (filenames
                | "PackLocations" >> beam.MapTuple(packed_place)  # (filename, bytes)
                | "GroupByFilename" >> beam.GroupByKey()  # (filename, [RecordLocation encoded])
                | "FindDuplicates" >> beam.ParDo(FindDuplicateFilenamesFn()))


class FindLeakageFn(beam.DoFn):
    """One ``leakage`` problem per identical image found in more than one split, naming both keys.

    Within-split duplicates are not a failure; their number per split goes to the ``duplicates`` output.
    """

    def __init__(self, split_order: list[str]):
        self.split_order = split_order

    def process(self, element):
        _, locations = element
        first_by_split: dict[str, RecordLocation] = {}
        count_by_split: dict[str, int] = {}
        for location in unpacked_locations(locations):
            count_by_split[location.split] = count_by_split.get(location.split, 0) + 1
            if location.split not in first_by_split or location < first_by_split[location.split]:
                first_by_split[location.split] = location
        for split, count in count_by_split.items():
            if count > 1:
                yield beam.pvalue.TaggedOutput("duplicates", (split, count - 1))
        if len(first_by_split) < 2:
            return
        order = {split: i for i, split in enumerate(self.split_order)}
        firsts = sorted(first_by_split.values(), key=lambda loc: (order.get(loc.split, len(order)), loc))
        original, leaked = firsts[0], firsts[1]
        yield problem("leakage",
                      f"identical image in {original.split} ({original.filename!r}, {original.file} record "
                      f"{original.index}) and {leaked.split} ({leaked.filename!r}, {leaked.file} record "
                      f"{leaked.index})",
                      split=leaked.split, file=leaked.file, index=leaked.index, keys=[loc.filename for loc in firsts],
                      occurrences=[loc.to_json() for loc in firsts[:OCCURRENCES_LISTED]],
                      num_occurrences=sum(count_by_split.values()))


class FindLeakage(beam.PTransform):
    """``(pixel hash, RecordLocation)`` per record -> a ``leakage`` problem per image in two splits (main output
    ``problem``) and ``(split, identical images within it)`` (output ``duplicates``)."""

    def __init__(self, split_order: list[str]):
        super().__init__()
        self.split_order = split_order

    def expand(self, pixel_hashes):
        found = (pixel_hashes
                 | "PackLocations" >> beam.MapTuple(packed_location)  # (pixel hash, bytes)
                 | "GroupByPixelHash" >> beam.GroupByKey()  # (pixel hash, [RecordLocation encoded])
                 | "FindLeaks" >> beam.ParDo(FindLeakageFn(self.split_order)).with_outputs(
                     "duplicates", main="problem"))
        duplicates = found.duplicates | "CountDuplicateImages" >> beam.CombinePerKey(sum)
        return {"problem": found.problem, "duplicates": duplicates}


def _problem_with_sort_key(found: dict):
    return found["check"], (problem_sort_key(found), json.dumps(found, sort_keys=True))


class KeepFirstProblems(beam.PTransform):
    """Problem dicts -> result lines: at most ``max_per_check`` problems per check (lowest shard/record first) and
    one ``problem_count`` line per check counting all of them."""

    def __init__(self, max_per_check: int):
        super().__init__()
        self.max_per_check = max_per_check

    def expand(self, problems):
        keyed = problems | "KeyProblemsByCheck" >> beam.Map(_problem_with_sort_key)  # (check, (sort key, json))
        kept = (keyed
                | "KeepFirst" >> beam.combiners.Top.SmallestPerKey(self.max_per_check)
                | "ProblemLines" >> beam.FlatMap(lambda kv: [
                    json.dumps({"kind": "problem", **json.loads(text)}) for _, text in kv[1]]))
        counts = (keyed
                  | "CountProblems" >> beam.combiners.Count.PerKey()
                  | "ProblemCountLines" >> beam.MapTuple(
                      lambda check, n: json.dumps({"kind": "problem_count", "check": check, "count": n})))
        return (kept, counts) | "FlattenProblemLines" >> beam.Flatten()


class SampleForContactSheet(beam.PTransform):
    """``(label, Sample)`` candidates -> one ``sample`` result line per class: its lowest-rank ``samples_per_class``."""

    def __init__(self, samples_per_class: int):
        super().__init__()
        self.samples_per_class = samples_per_class

    def expand(self, samples):
        return (samples
                | "LowestRanks" >> beam.combiners.Top.SmallestPerKey(self.samples_per_class)  # (label, [Sample])
                | "SampleLines" >> beam.MapTuple(sample_line))


class MergeForeignStats(beam.PTransform):
    """``(split, ForeignStats)`` per file -> one ``split`` result line per split."""

    def expand(self, file_stats):
        return (file_stats
                | "MergeStats" >> beam.CombinePerKey(MergeStatsFn(ForeignStats))
                | "SplitLines" >> beam.MapTuple(lambda split, stats: json.dumps(foreign_summary(split, stats))))


class WriteResults(beam.PTransform):
    """Result lines (JSON strings) -> one text file at ``path``, which the driver reads back."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, lines):
        return lines | "WriteText" >> beam.io.WriteToText(self.path, num_shards=1, shard_name_template="")
