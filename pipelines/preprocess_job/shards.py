"""Shard writing: a shard that is one decode group's file is that file renamed (copied remotely), any other is
streamed from its groups' files in seeded order. Boundaries (of shards and decode groups) are exact ranks of the
seeded order, found from sort keys in buckets: part k of P holds the ranks r with r * P // N == k."""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.preprocess_job.common import METRICS_NAMESPACE, failing_as
from shardprep.pipelines.runtime.storage import atomic_write, is_local
from shardprep.pipelines.runtime.spill import SpillReader
from shardprep.preprocess.format import manifest, record_pointers, sharding


BUCKET_SIZES = "bucket_sizes"  # bucket_sort_keys' second output


def bucket_sort_keys(keys, sizes: dict):
    """((split, bucket), the rows of ``keys`` in that bucket) for every bucket its sort keys fall in; and, tagged
    ``BUCKET_SIZES``, ((split, bucket), how many rows) of each."""
    for bucket, part in keys.by_bucket(sharding.num_buckets(sizes[keys.split])).items():
        yield (keys.split, bucket), part
        yield beam.pvalue.TaggedOutput(BUCKET_SIZES, ((keys.split, bucket), len(part)))


class FindShardBoundaries(beam.DoFn):
    """((split, bucket), [rows]) -> (None, (split, (part, sort key))) for the sort keys that start a part (a shard,
    or a decode group) and fall in this bucket."""

    def __init__(self, metric_name: str):
        # Keys sorted per call: shows that this work stays about BUCKET_TARGET however large the dataset.
        self.bucket_keys = beam.metrics.Metrics.distribution(METRICS_NAMESPACE, metric_name)

    def process(self, element, sizes, parts, bucket_sizes):
        (split, bucket), chunks = element
        keys = record_pointers.sorted_sort_keys(chunks)
        self.bucket_keys.update(len(keys))
        first_rank = sum(n for (s, b), n in bucket_sizes.items() if s == split and b < bucket)
        for part, rank in enumerate(sharding.boundary_ranks(sizes[split], parts[split]), start=1):
            if first_rank <= rank < first_rank + len(keys):
                high, low = keys[rank - first_rank]
                yield None, (split, (part, (int(high), int(low))))  # one key: all collected together


@beam.ptransform_fn
def RankBoundaries(keys, sizes, parts, metric_name: str):
    """SortKeys or RecordPointers -> {split: sort keys starting parts 1..P-1} (a singleton; none without input).
    ``sizes``, ``parts``: side inputs {split: keys}, {split: parts}; ``metric_name``: keys sorted per bucket."""
    # Few ParDos (each costs start-up): bucket sizes come out of the bucketing, boundaries collected by one key.
    bucketed = keys | "BucketSortKeys" >> beam.FlatMap(bucket_sort_keys, sizes).with_outputs(BUCKET_SIZES, main="parts")
    bucket_sizes = bucketed[BUCKET_SIZES] | "CountBuckets" >> beam.CombinePerKey(sum)
    return (bucketed.parts
            | "GroupBuckets" >> beam.GroupByKey()
            | "FindShardBoundaries" >> beam.ParDo(FindShardBoundaries(metric_name), sizes, parts,
                                                  beam.pvalue.AsDict(bucket_sizes)).with_output_types(
                beam.typehints.Any)  # declared: Beam would infer it from the DoFn's bytecode, at start-up
            | "CollectBoundaries" >> beam.CombinePerKey(beam.combiners.ToListCombineFn())
            | "BoundariesBySplit" >> beam.MapTuple(lambda _, pairs: sharding.collect_boundaries(pairs)))


def shard_counts(total: sharding.RecordSummary, requested: int | None):
    """(split, shards) for every split with records: --num-shards, or as many as keep shards under 200 MB."""
    return [(split, sharding.num_shards_for(n, total.bytes[split], requested)) for split, n in total.examples.items()]


@beam.ptransform_fn
def ShardBoundaries(records, summary, requested_shards: int | None):
    """RecordPointers -> {split: sort keys starting shards 1..S-1} (a singleton), given the records' merged
    RecordSummary (a PCollection of at most one) for each split's record and shard counts."""
    examples = summary | "ExamplesPerSplit" >> beam.FlatMap(lambda total: total.examples.items())
    shards = summary | "ShardsPerSplit" >> beam.FlatMap(shard_counts, requested_shards)
    return records | "RankBoundaries" >> RankBoundaries(
        beam.pvalue.AsDict(examples), beam.pvalue.AsDict(shards), "boundary_bucket_keys")


# Declared: Beam would infer it from ShardWriter's bytecode at start-up (~30 ms of CPU)
SHARD_ENTRY = beam.typehints.Dict[str, beam.typehints.Any]


def assign_shards(pointers: record_pointers.RecordPointers, boundaries):
    for shard, part in pointers.by_shard(boundaries.get(pointers.split, ())).items():
        yield (pointers.split, shard), part


@beam.ptransform_fn
def WriteShards(records, output: str, requested_shards: int | None, boundaries, summary, layouts):
    """RecordPointers -> a manifest shard entry per shard written; ``boundaries``: a PCollection of one {split:
    shard-start keys}."""
    return (records
            | "AssignShards" >> beam.FlatMap(assign_shards, beam.pvalue.AsSingleton(boundaries, default_value={}))
            | "GroupShards" >> beam.GroupByKey()
            | "WriteShardFile" >> beam.ParDo(ShardWriter(output, requested_shards), summary, layouts)
            .with_output_types(SHARD_ENTRY))


class ShardWriter(beam.DoFn):
    """((split, shard), [RecordPointers]) -> the shard's entry; the records sorted by their seeded key."""

    def __init__(self, output: str, requested_shards: int | None):
        self.output, self.requested_shards = output, requested_shards
        self.adopted = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "shards_renamed_from_decode_groups")

    def setup(self):
        self.reader = SpillReader()

    def process(self, element, summary, layouts):
        (split, shard), parts = element
        parts = list(parts)
        shards = sharding.num_shards_for(summary.examples[split], summary.bytes[split], self.requested_shards)
        if len(parts) == 1 and parts[0].is_whole_sorted_file():
            self.adopted.inc()
            yield adopt_spill_file(self.output, split, shard, shards, parts[0])
            return
        records = self.reader.records(record_pointers.merge_sorted_pointers(parts))
        layout = layouts.get(split)
        if layout is not None:
            records = layout.shard_records(records)  # only the shard's last record ends with the longer padding
        yield write_shard_file(self.output, split, shard, shards, records)

    def teardown(self):
        self.reader.close()


def adopt_spill_file(output: str, split: str, shard: int, shards: int, part: record_pointers.RecordPointers) -> dict:
    """Moves a decode group's file into place as a shard; returns its manifest entry."""
    relative = manifest.SHARD_FILES.path(split, shard, shards)
    final = manifest.join(output, relative)
    with failing_as(f"writing shard {final} failed"):
        if is_local(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            FileSystems.rename([part.spill_path], [final])
        else:  # a copy: a retried writer finds the spill file still there
            FileSystems.copy([part.spill_path], [final])
    num_examples, num_bytes, sha256 = part.file_info
    return {"split": split, "index": shard, "file": relative, "num_examples": num_examples,
            "num_bytes": num_bytes, "sha256": sha256}


def write_shard_file(output: str, split: str, shard: int, shards: int, framed_records) -> dict:
    """Writes already framed records (any iterable) as a shard via a temporary file; returns its manifest entry."""
    relative = manifest.SHARD_FILES.path(split, shard, shards)
    final = manifest.join(output, relative)
    with failing_as(f"writing shard {final} failed"):
        written = atomic_write(final, framed_records)
    return {"split": split, "index": shard, "file": relative, "num_examples": written.num_chunks,
            "num_bytes": written.num_bytes, "sha256": written.sha256}
