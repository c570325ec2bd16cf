"""Fixed record layouts: raw centre crops are all S*S*3 bytes, so each split's records get one length.

A split's ``fixed_layout.FixedLayout`` must fit every key and label of the split, so it is found from the listed
inputs before decoding (``FixedLayouts``); it also makes the split's bytes, and thus its shard count, known up
front. TFRecord sources have keys ``FILE:INDEX`` whose bounds are known from the file names alone.
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


class FixedLayouts(beam.PTransform):
    """Inputs -> (split, FixedLayout) per split, for records of ``side`` x ``side`` raw pixels."""

    def __init__(self, side: int):
        super().__init__()
        self.side = side

    def expand(self, inputs):
        return (inputs
                | "RecordKeyBounds" >> beam.Map(record_key_bounds)
                | "MergeKeyBounds" >> beam.CombinePerKey(merge_key_bounds)
                | "FixedLayout" >> beam.Map(fixed_layout, self.side))


def tfrecord_layouts(config, plan) -> dict:
    """Fixed layouts of a TFRecord source's splits, from bounds known before reading: keys are ``FILE:INDEX``."""
    if not uses_fixed_layout(config):
        return {}
    max_label = len(plan.classes) - 1 if plan.classes else (1 << 63) - 1
    names: dict[str, list[int]] = {}
    for split, path in plan.tfrecord_files:
        names.setdefault(split, []).append(len(path.rsplit("/", 1)[-1].encode("utf-8")))
    index_digits = len(str((1 << 63) - 1))
    return {split: FixedLayout.for_records(
                config.shorter_side, config.shorter_side, (min(lengths) + 2, max(lengths) + 1 + index_digits), max_label)
            for split, lengths in names.items()}
