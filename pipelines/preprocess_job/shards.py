"""Shard writing: each split's records, cut at the shard boundaries, written as uniform TFRecord shards. A shard
that is exactly one decode group's file is that file renamed into place (copied on remote storage); any other is
streamed from its groups' files in seeded order under a temporary name and renamed."""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.preprocess_job.common import METRICS_NAMESPACE, PreprocessError
from shardprep.pipelines.runtime.storage import atomic_write, is_local
from shardprep.pipelines.runtime.spill import SpillReader
from shardprep.preprocess.format import manifest, record_pointers, sharding


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
    try:
        if is_local(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            FileSystems.rename([part.spill_path], [final])
        else:  # a copy: a retried writer finds the spill file still there
            FileSystems.copy([part.spill_path], [final])
    except Exception as e:
        raise PreprocessError(f"writing shard {final} failed: {type(e).__name__}: {e}") from e
    num_examples, num_bytes, sha256 = part.file_info
    return {"split": split, "index": shard, "file": relative, "num_examples": num_examples,
            "num_bytes": num_bytes, "sha256": sha256}


def write_shard_file(output: str, split: str, shard: int, shards: int, framed_records) -> dict:
    """Writes already framed records (any iterable) as a shard via a temporary file; returns its manifest entry."""
    relative = manifest.SHARD_FILES.path(split, shard, shards)
    final = manifest.join(output, relative)
    try:
        written = atomic_write(final, framed_records)
    except Exception as e:
        raise PreprocessError(f"writing shard {final} failed: {type(e).__name__}: {e}") from e
    return {"split": split, "index": shard, "file": relative, "num_examples": written.num_chunks,
            "num_bytes": written.num_bytes, "sha256": written.sha256}
