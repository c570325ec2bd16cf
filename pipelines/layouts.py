"""Fixed record layouts: raw centre crops are all S*S*3 bytes, so each split's records get one length.

A split's ``fixed_layout.FixedLayout`` must fit every key and label of the split, so it is found from the listed
inputs before decoding (``FixedLayouts``); it also makes the split's bytes, and thus its shard count, known up
front. A source whose images are decoded where they are read (``tfrecord:``) knows its key bounds from its plan
(``planned_layouts``).
"""

from __future__ import annotations

import apache_beam as beam

from shardprep.preprocess import encodings
from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.preprocess.elements import Input


def uses_fixed_layout(config) -> bool:
    """Raw centre crops are all S*S*3 bytes, so their records get one length (fixed_layout.FixedLayout): the
    encoding says (``Encoding.has_fixed_layout``)."""
    return encodings.get(config.encoding).has_fixed_layout(config.crop)


def record_key_bounds(item: Input) -> tuple[str, tuple[int, int, int]]:
    """(split, (filename bytes, filename bytes, label)) of a listed input, combined into a split's layout bounds."""
    length = len(item.key.encode("utf-8"))
    return item.split, (length, length, item.label)


def merge_key_bounds(bounds) -> tuple[int, int, int]:
    """(shortest filename, longest filename, largest label), in bytes."""
    bounds = list(bounds)
    return min(b[0] for b in bounds), max(b[1] for b in bounds), max(b[2] for b in bounds)


def fixed_layout(split_bounds, side: int) -> tuple[str, FixedLayout]:
    split, (shortest, longest, max_label) = split_bounds
    return split, FixedLayout.for_records(side, side, (shortest, longest), max_label)


class LayoutOfKeyBounds(beam.CombineFn):
    """A split's key bounds (``record_key_bounds``) merged (``merge_key_bounds``) into its FixedLayout for records
    of ``side`` x ``side`` raw pixels: the layout made where the bounds are merged, not by one more ParDo."""

    def __init__(self, side: int):
        self.side = side

    def create_accumulator(self):
        return None

    def add_input(self, bounds, element):
        return element if bounds is None else merge_key_bounds([bounds, element])

    def merge_accumulators(self, accumulators):
        present = [bounds for bounds in accumulators if bounds is not None]
        return merge_key_bounds(present) if present else None

    def extract_output(self, bounds):
        return fixed_layout((None, bounds), self.side)[1]


class FixedLayouts(beam.PTransform):
    """Inputs -> (split, FixedLayout) per split, for records of ``side`` x ``side`` raw pixels."""

    def __init__(self, side: int):
        super().__init__()
        self.side = side

    def expand(self, inputs):
        return (inputs
                | "RecordKeyBounds" >> beam.Map(record_key_bounds)
                | "MergeKeyBounds" >> beam.CombinePerKey(LayoutOfKeyBounds(self.side)))


def planned_layouts(config, key_bounds: dict) -> dict:
    """Fixed layouts from bounds known before reading ({split: (shortest key, longest key, largest label)}, a
    source kind's ``planned_key_bounds``); empty unless the records are raw centre crops."""
    if not uses_fixed_layout(config):
        return {}
    return dict(fixed_layout(split_bounds, config.shorter_side) for split_bounds in key_bounds.items())
