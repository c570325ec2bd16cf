"""Exact rank boundaries of the seeded order from sort keys in bounded buckets: ``RankBoundaries`` cuts a split's
keys into P parts (part k holds the ranks r with r * P // N == k), no worker sorting more than a bucket of about
``sharding.BUCKET_TARGET`` keys; ``ShardBoundaries`` applies it to the written records."""

from __future__ import annotations

import apache_beam as beam

from shardprep.pipelines.preprocess_job.common import METRICS_NAMESPACE
from shardprep.preprocess.format import record_pointers, sharding


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
