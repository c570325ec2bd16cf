"""The framework-free reader: NumPy batches of a prepared dataset, with no TensorFlow anywhere on its path.

``NumpyReader(data_dir, split, batch_size, training, seed=None)`` is an iterable of ``(uint8 [B, H, W, 3], int32
[B])`` batches, the same batches, in the same order, as :func:`shardprep.train.reader.make_dataset` gives for the
same seed (both follow :mod:`shardprep.train.record_order`). Training goes on epoch after epoch, each reshuffled;
evaluation ends after one pass. Raw centre-crop shards are gathered by ``preadv`` into reused, aligned batch buffers
(:mod:`shardprep.train.record_gather`) on a few threads and prefetched (:mod:`shardprep.train.batch_prefetch`); JPEG
and ``crop: none`` shards are read by random access and decoded with Pillow or NumPy
(:mod:`shardprep.train.batch_sources`).

Usage::

    reader = NumpyReader("data", "train", 256, training=True, seed=0)
    for step, (images, labels) in zip(range(reader.steps_per_epoch * epochs), reader):
        ...

Resuming: ``start_step`` (or :meth:`NumpyReader.set_state`) is the number of global batches already read, e.g.
``model.optimizer.iterations`` when one batch is one step; the reader then yields exactly the batches an
uninterrupted run would have from there, found in O(1). :meth:`NumpyReader.state` says where it is.

Multi-host runs: process ``index`` of ``num_shards`` reads its own share; every process gets the same number of
batches. For Keras (any backend), :meth:`NumpyReader.as_py_dataset` wraps the reader in a ``keras.utils.PyDataset``
(:mod:`shardprep.train.keras_batches`); PyTorch's ``DataLoader`` and Grain take
:class:`shardprep.train.record_dataset.RecordDataset` with its seeded sampler.

A batch handed out stays valid while the caller holds it (its buffer is reused only once nothing references it).
"""

from __future__ import annotations

import os

import numpy as np

from shardprep.preprocess import manifest as manifest_lib
from shardprep.preprocess.manifest_types import Manifest, typed
from shardprep.train import batch_prefetch
from shardprep.train.batch_sources import batch_source
from shardprep.train.record_gather import ReusedBuffers
from shardprep.train.record_order import ReaderState, RecordOrder


def load_local_manifest(data_dir: str) -> Manifest:
    """The typed manifest of a local dataset folder, read with plain ``open`` (no TensorFlow, no Beam)."""
    if "://" in data_dir:
        raise ValueError(f"NumpyReader reads local datasets only, not {data_dir}: copy the dataset to a local "
                         "disk, or use shardprep.train.reader.make_dataset")
    path = os.path.join(data_dir, manifest_lib.MANIFEST_NAME)
    if not os.path.isfile(path):
        raise manifest_lib.missing_manifest_error(data_dir)
    with open(path, "rb") as f:
        return typed(manifest_lib.from_json(f.read()))


class NumpyReader:
    """Batches of ``(uint8 [B, H, W, 3], int32 [B])`` NumPy arrays from a prepared shardprep dataset.

    Args:
      data_dir: the local dataset folder holding ``manifest.json``.
      split: a split of the manifest, e.g. ``"train"``.
      batch_size: records per batch of this process.
      training: ``True``: endless, reshuffled every epoch, ``steps_per_epoch`` full batches an epoch, random square
        crops for ``crop: none``. ``False``: one pass in order, the last batch may be smaller, central crops.
      seed: same seed, same batches (and the same as ``make_dataset``'s); ``None`` draws one for this reader.
      num_shards, index: this process's share of the records (multi-host runs).
      start_step: global batches already read: the reader starts right after them.
      manifest: the already loaded manifest (document or :class:`~shardprep.preprocess.manifest_types.Manifest`).
      threads: threads reading batches (default 3); prefetch: batches read ahead (default 6).
      verify_records: check both CRCs of every record as it is read (``OSError`` naming the shard and record).

    Raises ``ValueError`` for a bad ``batch_size``, ``num_shards``/``index`` or ``start_step``, a URL, or shards
    that disagree with the manifest.
    """

    def __init__(self, data_dir, split: str, batch_size: int, training: bool, seed: int | None = None, *,
                 num_shards: int = 1, index: int = 0, start_step: int = 0, manifest=None, threads: int | None = None,
                 prefetch: int | None = None, verify_records: bool = False):
        data_dir = os.fspath(data_dir)
        self.manifest = typed(manifest) if manifest is not None else load_local_manifest(data_dir)
        info = self.manifest.split(split)
        self.order = RecordOrder([shard.num_examples for shard in info.shards], batch_size, training, seed,
                                 num_shards=num_shards, index=index)
        for name, value in (("threads", threads), ("prefetch", prefetch)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        self.data_dir, self.split, self.training = data_dir, split, bool(training)
        self.threads, self.prefetch = threads, prefetch
        # Enough buffers for the batches in flight and a few the caller keeps; more are plain arrays.
        self._source = batch_source(data_dir, self.manifest, split, training, verify=verify_records,
                                    buffers=ReusedBuffers(max_buffers=2 * (prefetch or batch_prefetch.DEFAULT_DEPTH)
                                                          + 8))
        self._step = 0
        self.set_state(start_step)

    @property
    def seed(self) -> int:
        """The order's seed (the one drawn if none was given)."""
        return self.order.seed

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch (training) or in the pass (evaluation)."""
        return self.order.steps_per_epoch

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return self._source.image_shape

    def __len__(self) -> int:
        return self.order.steps_per_epoch

    def state(self) -> ReaderState:
        """Where the reader is: the next batch it hands out is global step ``state().step``."""
        return self.order.state(self._step)

    def set_state(self, state: ReaderState | int) -> None:
        """Continues at ``state`` (a :class:`ReaderState` or a global step): the next iteration starts there."""
        step = state.step if isinstance(state, ReaderState) else int(state)
        if step < 0 or (not self.training and step > len(self)):
            raise ValueError(f"start_step must be in [0, {len(self)}] in evaluation and >= 0 in training, "
                             f"got {step}")
        self._step = step

    def read_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Global batch ``step``, read now on the calling thread (random access: any step, any order)."""
        return self._source(self.order.batch_ids(step), self.order.crop_draws(step) if self._crops else None)

    @property
    def _crops(self) -> bool:
        return self.training and self.manifest.crop == "none"

    def __iter__(self):
        """Batches from the current position: endless in training; to the end of the pass in evaluation, after
        which the next iteration is a new pass."""
        first = self._step
        steps = _count_from(first) if self.training else range(first, len(self))
        for step, batch in zip(_count_from(first), batch_prefetch.prefetched(self.read_batch, steps, self.threads,
                                                                              self.prefetch)):
            self._step = step + 1
            yield batch
            del batch
        if not self.training:
            self._step = 0

    def as_py_dataset(self, *, steps_done=None, **kwargs):
        """This reader as a ``keras.utils.PyDataset`` for ``model.fit`` / ``evaluate`` on any Keras backend
        (:class:`shardprep.train.keras_batches.KerasBatches`; ``kwargs``: ``workers``, ``use_multiprocessing``,
        ``max_queue_size``). ``steps_done``: e.g. ``lambda: int(model.optimizer.iterations)``, read at each epoch's
        start, so that a run resumed by ``keras.callbacks.BackupAndRestore`` continues at the restored step."""
        from shardprep.train.keras_batches import KerasBatches

        return KerasBatches(self, steps_done=steps_done, **kwargs)


def _count_from(first: int):
    step = first
    while True:
        yield step
        step += 1
