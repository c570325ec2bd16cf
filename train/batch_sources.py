"""How the framework-free reader reads one batch: global record ids (and crop draws) in, NumPy arrays out.

Two sources, chosen by the split's layout (:func:`batch_source`):

* :class:`FixedLayoutSource`: raw centre crops with a fixed record layout, gathered by ``preadv`` straight into a
  reused, aligned batch buffer (:class:`shardprep.train.record_gather.FixedLayoutGather`; with ``verify``, every
  record's CRCs checked: :class:`shardprep.train.verified_gather.VerifiedGather`);
* :class:`ExampleSource`: every other layout (JPEG, ``crop: none``, datasets without a layout): the
  serialized Examples are read by random access (:mod:`shardprep.train.record_index`), parsed by the package's own
  protobuf reader (:mod:`shardprep.preprocess.record_format`) and decoded by the manifest's encoding
  (:meth:`~shardprep.preprocess.encodings.Encoding.decode`: NumPy, or Pillow, whose JPEG decoder is libjpeg-turbo as
  TensorFlow's is; the tf.data reader decodes whole images the same way, then crops).

Crops for ``crop: none``: a ``side`` x ``side`` square at ``(draw % (spare + 1))`` in training, central otherwise,
as :mod:`shardprep.train.read_examples` cuts them. Both sources check every shard a batch reads against the
:class:`~shardprep.train.record_identity.DatasetSnapshot` taken when they were made, and every label against the
manifest's classes (:func:`~shardprep.train.record_identity.check_labels`). No TensorFlow.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np

from shardprep.preprocess import encodings, record_format
from shardprep.preprocess.dataset import Manifest
from shardprep.train import record_gather
from shardprep.train.record_gather import RECORD_INDEX_BITS, ReusedBuffers
from shardprep.train.record_identity import DatasetSnapshot, check_labels
from shardprep.train.record_index import ExampleGather

CHANNELS = record_format.CHANNELS


class ParsedRecord(NamedTuple):
    """What a reader needs of one of our Examples."""

    encoded: bytes
    label: int
    height: int
    width: int


def parse_record(serialized: bytes) -> ParsedRecord:
    """The image bytes, label and stored size of a serialized shardprep Example (``RecordFormatError`` if not)."""
    features = record_format.parse_features(serialized)
    try:
        return ParsedRecord(features[record_format.ENCODED][0], int(features[record_format.LABEL][0]),
                            int(features[record_format.HEIGHT][0]), int(features[record_format.WIDTH][0]))
    except (KeyError, IndexError, TypeError) as e:
        raise record_format.RecordFormatError(f"record lacks {e}: not a shardprep record") from e


def crop_window(height: int, width: int, side: int, draws, training: bool) -> tuple[int, int]:
    """(top, left) of the ``side`` square cut from a ``height`` x ``width`` image."""
    spare_h, spare_w = height - side, width - side
    if spare_h < 0 or spare_w < 0:
        raise record_format.RecordFormatError(f"a {height}x{width} image is smaller than the {side} square crop")
    if training:
        return int(draws[0]) % (spare_h + 1), int(draws[1]) % (spare_w + 1)
    return spare_h // 2, spare_w // 2


class FixedLayoutSource:
    """Batches of fixed-layout shards: ``(global ids, draws) -> (images, labels)``; draws are unused.

    ``snapshot``: the split's :class:`DatasetSnapshot` (every shard read is checked against it); ``num_classes``:
    labels outside ``0..num_classes-1`` are a ``DatasetChangedError``."""

    def __init__(self, paths, counts, layout, buffers: ReusedBuffers | None = None, verify: bool = False,
                 snapshot: DatasetSnapshot | None = None, num_classes: int | None = None):
        record_gather.check_shard_sizes(paths, counts, layout)
        if verify:
            from shardprep.train.verified_gather import VerifiedGather

            self.gather = VerifiedGather(paths, counts, layout, buffers, snapshot)
        else:
            self.gather = record_gather.FixedLayoutGather(paths, layout, buffers, snapshot)
        self.snapshot, self.num_classes = snapshot, num_classes
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
        self.image_shape = self.gather.image_shape

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        images, labels = self.gather(gather_ids(self.starts, ids))
        if self.num_classes is not None:
            check_labels(labels, self.num_classes, ids, self.starts, self.gather.paths, _where(self.snapshot,
                                                                                               self.gather.paths))
        return images, labels


def _where(snapshot: DatasetSnapshot | None, paths) -> str:
    """The dataset folder an error names."""
    return snapshot.data_dir if snapshot is not None else os.path.dirname(os.path.dirname(paths[0]))


def gather_ids(starts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Global indices as :class:`FixedLayoutGather`'s ids (shard in the high bits, record in shard in the low)."""
    ids = np.asarray(ids, np.int64)
    shards = np.searchsorted(starts, ids, side="right") - 1
    return (shards << RECORD_INDEX_BITS) | (ids - starts[shards])


class ExampleSource:
    """Batches of Examples decoded one by one into a reused batch buffer; ``snapshot`` as
    :class:`FixedLayoutSource`'s, labels checked against the manifest's classes."""

    def __init__(self, paths, counts, manifest: Manifest, training: bool, verify: bool = False,
                 buffers: ReusedBuffers | None = None, snapshot: DatasetSnapshot | None = None):
        self.records = ExampleGather(paths, counts, verify=verify, snapshot=snapshot)
        self.snapshot, self.num_classes = snapshot, manifest.num_classes
        self.starts = np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))])
        self.encoding = encodings.get(manifest.encoding)  # UnknownEncodingError for a name this version lacks
        self.crop, self.side = manifest.crop, manifest.shorter_side
        height, width = manifest.stored_shape
        self.image_shape = (height, width, CHANNELS)
        self.training = training
        self.buffers = buffers if buffers is not None else ReusedBuffers()

    def __call__(self, ids: np.ndarray, draws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        serialized = self.records(ids)
        count = len(serialized)
        images = self.buffers.take(count * int(np.prod(self.image_shape))).reshape((count,) + self.image_shape)
        labels = np.empty(count, np.int32)
        for j, data in enumerate(serialized):
            images[j], labels[j] = self.decode(data, draws[j] if draws is not None else (0, 0))
        check_labels(labels, self.num_classes, ids, self.starts, self.records.paths,
                     _where(self.snapshot, self.records.paths))
        return images, labels

    def decode(self, serialized: bytes, draws) -> tuple[np.ndarray, int]:
        record = parse_record(serialized)
        image = self.encoding.decode(record.encoded, record.height, record.width)
        if self.crop == "none":
            top, left = crop_window(record.height, record.width, self.side, draws, self.training)
            image = image[top:top + self.side, left:left + self.side]
        if image.shape != self.image_shape:
            raise record_format.RecordFormatError(f"an image of {image.shape} in a dataset of {self.image_shape}")
        return image, record.label


def batch_source(data_dir: str, manifest: Manifest, split: str, training: bool, verify: bool = False,
                 buffers: ReusedBuffers | None = None):
    """The source of ``split``'s batches: fixed-layout gathers where the split has a layout, else decoded Examples;
    ``verify`` checks every record's CRCs. Its ``snapshot`` is taken now: shards of another size than the manifest
    says are a ``ValueError``."""
    shards = manifest.split(split).shards
    paths = [os.path.join(data_dir, shard.file) for shard in shards]
    counts = [shard.num_examples for shard in shards]
    snapshot = DatasetSnapshot(data_dir, paths, [shard.num_bytes for shard in shards])
    layout = manifest.split(split).record_layout
    if layout is not None and record_gather.AVAILABLE:
        return FixedLayoutSource(paths, counts, layout, buffers, verify, snapshot, manifest.num_classes)
    return ExampleSource(paths, counts, manifest, training, verify, buffers, snapshot)
