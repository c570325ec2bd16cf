"""Decode groups: ranges of consecutive ranks of the seeded order (found from sort keys, gathered in one shuffle of
packed batches), each decoded by one worker into one file; the shards when their count is known before decoding.
Raw centre crops are all S*S*3 bytes: each split's records get one fixed layout fitting its keys and labels."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows

from shardprep.pipelines.preprocess_job.shards import RankBoundaries
from shardprep.preprocess.format import encodings, sharding
from shardprep.preprocess.sources import common as sources
from shardprep.preprocess.format.elements import Input
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.record_pointers import SortKeys


def add_sort_keys(keys: dict, items, seed: int) -> dict:
    """Appends every input's sort key, with its index in ``items``, to ``keys[split]``."""
    for index, item in enumerate(items):
        if item.split not in keys:
            keys[item.split] = SortKeys(item.split)
        keys[item.split].append(sharding.sort_key(seed, item.split, item.key), index)
    return keys


def decode_group_counts(counted, layouts: dict, requested: int | None, min_groups: int):
    """(split, decode groups) from (split, inputs); a split with a fixed layout knows its bytes up front."""
    split, num_inputs = counted
    layout = layouts.get(split)
    predicted_bytes = num_inputs * layout.record_bytes if layout is not None else None
    return split, sharding.decode_groups(num_inputs, predicted_bytes, requested, min_groups)


class InputSortKeys(beam.DoFn):
    """InputBatch -> at the bundle's end, one SortKeys per split of the bundle's inputs (indices unused)."""

    def __init__(self, seed: int):
        self.seed = seed

    def start_bundle(self):
        self.keys: dict[str, SortKeys] = {}

    def process(self, batch: sources.InputBatch):
        add_sort_keys(self.keys, batch, self.seed)

    def finish_bundle(self):
        for split in sorted(self.keys):
            yield GlobalWindows.windowed_value(self.keys[split])


class AssignDecodeGroups(beam.DoFn):
    """InputBatch -> ((split, decode group), InputBatch): one element per group and bundle."""

    def __init__(self, seed: int):
        self.seed = seed

    def start_bundle(self):
        # NUL-separated text: on the local runner a bundle is a worker's whole share; tuples would grow its memory.
        self.groups: dict[tuple[str, int], bytearray] = {}

    def process(self, batch: sources.InputBatch, boundaries):
        items = list(batch)
        for split, split_keys in add_sort_keys({}, items, self.seed).items():
            for group, part in split_keys.by_shard(boundaries.get(split, ())).items():
                packed = self.groups.setdefault((split, group), bytearray())
                for index in part.indices():
                    item = items[index]
                    packed += f"{item.key}\0{item.label}\0{item.path or ''}\0".encode("utf-8")

    def finish_bundle(self):
        for split, group in sorted(self.groups):
            fields = self.groups.pop((split, group)).decode("utf-8").split("\0")[:-1]
            items = [Input(split, fields[i], int(fields[i + 1]), fields[i + 2] or None, None)
                     for i in range(0, len(fields), 3)]
            yield GlobalWindows.windowed_value(((split, group), sources.InputBatch(items)))


@beam.ptransform_fn
def DecodeGroups(batches, seed: int, input_counts, layouts, requested_shards: int | None, min_groups: int):
    """Batches of Inputs -> ((split, decode group), [InputBatch]); ``input_counts``: (split, inputs)."""
    inputs = batches | "PackInputs" >> beam.Map(sources.InputBatch)
    group_counts = input_counts | "DecodeGroupCounts" >> beam.Map(
        decode_group_counts, layouts, requested_shards, min_groups)
    group_starts = (inputs
                    | "InputSortKeys" >> beam.ParDo(InputSortKeys(seed))
                    | "DecodeGroupBoundaries" >> RankBoundaries(beam.pvalue.AsDict(input_counts),
                                                                beam.pvalue.AsDict(group_counts),
                                                                "decode_group_bucket_keys"))
    return (inputs
            | "AssignDecodeGroups" >> beam.ParDo(AssignDecodeGroups(seed),
                                                 beam.pvalue.AsSingleton(group_starts, default_value={}))
            | "GroupInputs" >> beam.GroupByKey())


def uses_fixed_layout(config) -> bool:
    return encodings.get(config.encoding).has_fixed_layout(config.crop)


def _key_bounds(item: Input) -> tuple[str, tuple[int, int, int]]:
    length = len(item.key.encode("utf-8"))
    return item.split, (length, length, item.label)


def _layout(bounds: tuple[int, int, int], side: int) -> FixedLayout:
    shortest, longest, max_label = bounds
    return FixedLayout.for_records(side, side, (shortest, longest), max_label)


class LayoutOfKeyBounds(beam.combiners.TupleCombineFn):
    """A split's (shortest key, longest key, largest label), in bytes, merged into its FixedLayout."""

    def __init__(self, side: int):
        super().__init__(min, max, max)
        self.side = side

    def extract_output(self, accumulator):
        return _layout(super().extract_output(accumulator), self.side)


@beam.ptransform_fn
def FixedLayouts(inputs, side: int):
    """Inputs -> (split, FixedLayout) per split."""
    return (inputs
            | "RecordKeyBounds" >> beam.Map(_key_bounds)
            | "MergeKeyBounds" >> beam.CombinePerKey(LayoutOfKeyBounds(side)))


def planned_layouts(config, key_bounds: dict) -> dict:
    """{split: FixedLayout} from a kind's ``planned_key_bounds``; empty unless the records are raw centre crops."""
    if not uses_fixed_layout(config):
        return {}
    return {split: _layout(bounds, config.shorter_side) for split, bounds in key_bounds.items()}
