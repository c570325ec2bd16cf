"""A split as a map-style dataset of records (:class:`RecordDataset`) and a seeded sampler in the readers' order
(:class:`EpochSampler`) for PyTorch's ``DataLoader`` and Grain: with ``drop_last=True`` they yield ``NumpyReader``'s
batches (``crop_size=`` with ``crops=True``: its windows). No TensorFlow.
"""

from __future__ import annotations

import os

import numpy as np

from shardprep.train.data.batch_sources import ExampleSource, FixedLayoutSource, batch_source
from shardprep.train.data.numpy_reader import open_local
from shardprep.train.data import host_crop
from shardprep.train.data.record_order import RecordOrder, bool_argument, integer_argument


class RecordDataset:
    """The records of one split (a name or a role) of a local dataset by global index: ``(uint8 [H, W, 3], label)``;
    ``crop_size``: each image cut to that square, the window a ``CropAt`` item names, else the central one."""

    def __init__(self, data_dir, split: str, *, manifest=None, crop_size: int | None = None):
        data_dir = os.fspath(data_dir)
        self.manifest, self.split = open_local(data_dir, split, manifest)
        self.data_dir = data_dir
        self.counts = [shard.num_examples for shard in self.manifest.split(self.split).shards]
        self.num_records = sum(self.counts)
        self.crop_size = integer_argument("crop_size", crop_size, minimum=1, optional=True)
        if self.crop_size is not None:
            info = self.manifest
            host_crop.check_fits(self.crop_size, (info.shorter_side, info.shorter_side, 3))
        self._source: FixedLayoutSource | ExampleSource | None = None

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, item) -> tuple[np.ndarray, int]:
        index, draws = (item.record, [item.draws]) if isinstance(item, host_crop.CropAt) else (item, None)
        index = int(index)
        if not 0 <= index < self.num_records:
            raise IndexError(f"record {index} of {self.num_records}")
        images, labels = self._batches()(np.array([index], np.int64), None)
        if self.crop_size is not None:
            return host_crop.crop_flip(images, self.crop_size, draws)[0], int(labels[0])
        return images[0].copy(), int(labels[0])  # a copy: the batch buffer goes back to its pool

    def _batches(self):
        # Opened on first use, so that a copy sent to a loader's worker process opens its own.
        if self._source is None:
            self._source = batch_source(self.data_dir, self.manifest, self.split, training=False)
        return self._source

    def __getstate__(self):
        return dict(self.__dict__, _source=None)


class EpochSampler:
    """Record indices of one epoch in the readers' order (training) or this process's slice; ``crops``
    (training): ``CropAt`` items, each a record and its random window, for a ``RecordDataset`` with ``crop_size``."""

    def __init__(self, records, training: bool = True, seed: int | None = None, *, num_shards: int = 1,
                 index: int = 0, crops: bool = False):
        self.order = RecordOrder(records.counts, 1, training, seed, num_shards=num_shards, index=index)
        self.crops = bool_argument("crops", crops) and self.order.training
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration yields (training; evaluation has one order)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.order.records_per_shard if self.order.training else len(self.order.epoch_share())

    def __iter__(self):
        share = self.order.epoch_share(self.epoch)
        if not self.crops:
            return iter(share.tolist())
        # The epoch's order is perm[index::num_shards]: the i-th record here is at position index + i * num_shards.
        positions = self.order.index + np.arange(len(share), dtype=np.int64) * self.order.num_shards
        draws = host_crop.window_draws(self.order.seed, self.epoch, positions).tolist()
        return iter(host_crop.CropAt(index, tuple(draw)) for index, draw in zip(share.tolist(), draws))
