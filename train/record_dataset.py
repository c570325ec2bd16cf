"""A prepared split as a map-style dataset of single records, and a seeded sampler in the reader's order, for the
ecosystem's loaders: PyTorch's ``DataLoader`` and Grain take them without shardprep importing either.

* :class:`RecordDataset`: ``len(records)`` records; ``records[i]`` is ``(uint8 [H, W, 3], int label)`` of global
  record ``i`` (manifest shard order; ``crop: none`` images cut to their central square).
* :class:`EpochSampler`: an iterable of record indices, ``set_epoch(e)`` picks the epoch; training: epoch ``e``'s
  permutation of :mod:`shardprep.train.record_order` (this process's share), so that
  ``DataLoader(records, batch_size=B, sampler=sampler, drop_last=True)`` yields the records of
  :class:`~shardprep.train.numpy_reader.NumpyReader`'s batches, batch for batch; evaluation: this process's slice
  of the records in order.

PyTorch::

    records = RecordDataset("data", "train")
    sampler = EpochSampler(records, training=True, seed=0, num_shards=world_size, index=rank)
    loader = torch.utils.data.DataLoader(records, batch_size=256, sampler=sampler, drop_last=True, num_workers=8)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for images, labels in loader: ...

Grain: ``grain.MapDataset.source(records)`` takes the dataset as it is (``__len__``, ``__getitem__``);
``.shuffle(seed=...)`` there draws Grain's own order, so for the reader's order index the source with the sampler's
indices instead, e.g. ``grain.MapDataset.source(list(sampler)).map(records.__getitem__)``.

Host crops for loops with no augmentation on the accelerator: ``RecordDataset(..., crop_size=224)`` cuts each
record's central window, and with ``EpochSampler(..., crops=True)`` (training) a random window, mirrored for half
of them, the one ``NumpyReader(..., crop_size=224)`` cuts for the same seed (:mod:`shardprep.train.host_crop`).
Random ``crop: none`` squares are not made here (a record alone has no epoch): read with ``NumpyReader`` for those.
No TensorFlow.
"""

from __future__ import annotations

import os

import numpy as np

from shardprep.preprocess.dataset import load_manifest, typed
from shardprep.train.batch_sources import ExampleSource, FixedLayoutSource, batch_source
from shardprep.train.numpy_reader import check_local
from shardprep.train import host_crop
from shardprep.train.record_order import RecordOrder, bool_argument, integer_argument
from shardprep.train.split_roles import reading


class RecordDataset:
    """The records of one split of a local prepared dataset, by global index.

    Args:
      data_dir: the local dataset folder; split: its split, or a role (``"validation"`` finds ``val``:
        :mod:`shardprep.train.split_roles`); manifest: the manifest
        :func:`~shardprep.preprocess.dataset.load_manifest` returned, if you have it.
      crop_size: cut each image to a ``crop_size`` square: the window a ``CropAt`` item names (what
        ``EpochSampler(..., crops=True)`` hands out), else the central one. ``None``: the stored images.
    """

    def __init__(self, data_dir, split: str, *, manifest=None, crop_size: int | None = None):
        data_dir = os.fspath(data_dir)
        check_local(data_dir)
        self.manifest = typed(manifest) if manifest is not None else load_manifest(data_dir)
        self.data_dir, self.split = data_dir, reading(self.manifest.splits, split, data_dir)
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
    """Record indices of one epoch in the reader's order (training) or this process's slice in order (evaluation).

    Args:
      records: a :class:`RecordDataset` (or anything with ``counts``: records per shard).
      training, seed, num_shards, index: as :class:`~shardprep.train.numpy_reader.NumpyReader`'s; ``seed=None``
        draws one for this sampler.
      crops: (training) hand out ``host_crop.CropAt`` items, each a record and its random window, for a
        ``RecordDataset`` made with ``crop_size``.
    """

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
