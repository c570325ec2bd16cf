"""Fixed record layouts: raw centre crops are all S*S*3 bytes, so each split's records get one length fitting
every key and label of the split, from the listed inputs or from the plan's key bounds."""

from __future__ import annotations

import apache_beam as beam

from shardprep.preprocess.format import encodings
from shardprep.preprocess.format.elements import Input
from shardprep.preprocess.format.fixed_layout import FixedLayout


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
