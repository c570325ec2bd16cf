"""``NumpyReader``: :func:`shardprep.train.data.reader.make_dataset`'s batches (same seed, same batches) as NumPy
arrays with no TensorFlow, read ahead on a few threads into reused buffers, any step in O(1); one reader is one
stream (a second active iterator is refused), shards checked as read and at each epoch's start. A split as a
map-style dataset (:class:`RecordDataset`) and a seeded sampler in the readers' order (:class:`EpochSampler`) for
PyTorch's ``DataLoader`` and Grain: with ``drop_last=True`` they yield ``NumpyReader``'s batches.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import os
import weakref

import numpy as np

from shardprep.preprocess.format.dataset import Manifest, load_manifest, typed
from shardprep.train.data import host_crop, split_roles
from shardprep.train.data.batch_sources import ExampleSource, FixedLayoutSource, batch_source
from shardprep.train.data.record_gather import ReusedBuffers
from shardprep.train.data.record_order import ReaderState, RecordOrder, bool_argument, integer_argument

DEFAULT_THREADS, DEFAULT_DEPTH = 3, 6  # threads reading batches, batches read ahead


def open_local(data_dir: str, split: str, manifest) -> tuple[Manifest, str]:
    """The manifest (loaded when not given) and the split ``split`` (a name or a role) means, of a local dataset."""
    check_local(data_dir)
    manifest = typed(manifest) if manifest is not None else load_manifest(data_dir)
    return manifest, split_roles.reading(manifest.splits, split, data_dir)


def check_local(data_dir: str) -> None:
    """Refuses (``ValueError``) a URL: the NumPy readers read local datasets only (``preadv``, ``os.stat``)."""
    if "://" in data_dir:
        raise ValueError(f"NumpyReader reads local datasets only, not {data_dir}: copy the dataset to a local "
                         "disk, or use shardprep.train.data.reader.make_dataset")


class NumpyReader:
    """``(uint8 [B, H, W, 3], int32 [B])`` NumPy batches of a local dataset, arguments as ``make_dataset``'s;
    ``num_shards``/``index``: this process's share; ``threads``/``prefetch``: readers and batches ahead; ``crop_size``:
    a host crop (:mod:`~shardprep.train.data.host_crop`). ``TypeError``/``ValueError`` for a bad argument or a URL."""

    def __init__(self, data_dir, split: str, batch_size: int, training: bool, seed: int | None = None, *,
                 num_shards: int = 1, index: int = 0, start_step: int = 0, manifest=None, threads: int | None = None,
                 prefetch: int | None = None, verify_records: bool = False, crop_size: int | None = None):
        data_dir = _checked_arguments(data_dir, split, training, manifest, threads, prefetch, verify_records)
        self.crop_size = integer_argument("crop_size", crop_size, minimum=1, optional=True)
        self.manifest, split = open_local(data_dir, split, manifest)
        self.order = RecordOrder([shard.num_examples for shard in self.manifest.split(split).shards], batch_size,
                                 training, seed, num_shards=num_shards, index=index)
        self.data_dir, self.split, self.training = data_dir, split, bool(training)
        self.threads, self.prefetch = threads, prefetch
        # Enough buffers for the batches in flight and a few the caller keeps; more are plain arrays.
        self._buffers = ReusedBuffers(max_buffers=2 * (prefetch or DEFAULT_DEPTH) + 8)
        self._source = batch_source(data_dir, self.manifest, split, training, verify=verify_records,
                                    buffers=self._buffers)
        if self.crop_size is not None:
            host_crop.check_fits(self.crop_size, self._source.image_shape)
        self._step = 0
        self._active = None  # a weak reference to the iterator handing out batches, while there is one
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
        stored = self._source.image_shape
        return stored if self.crop_size is None else (self.crop_size, self.crop_size, stored[2])

    def __len__(self) -> int:
        return self.order.steps_per_epoch

    def state(self) -> ReaderState:
        """Where the reader is: the next batch it hands out is global step ``state().step``."""
        return self.order.state(self._step)

    def set_state(self, state: ReaderState | int) -> None:
        """Continues at ``state`` (or a global step); a ``RuntimeError`` while an iterator is active."""
        step = state.step if isinstance(state, ReaderState) else integer_argument("start_step", state)
        if self._iterating():
            raise RuntimeError(f"NumpyReader.set_state while an iterator is active (at step {self._step}): finish, "
                               "close or drop that iterator first")
        if step < 0 or (not self.training and step > len(self)):
            raise ValueError(f"start_step must be in [0, {len(self)}] in evaluation and >= 0 in training, "
                             f"got {step}")
        self._step = step

    def read_batch(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """Global batch ``step``, read now; an epoch's first batch checks the files first."""
        if step % self.order.steps_per_epoch == 0:
            self._source.snapshot.check()
        crops = self.training and self.manifest.crop == "none"
        images, labels = self._source(self.order.batch_ids(step), self.order.crop_draws(step) if crops else None)
        if self.crop_size is None:
            return images, labels
        draws = (host_crop.window_draws(self.seed, step // self.order.steps_per_epoch, self.order.positions(step))
                 if self.training else None)
        out = self._buffers.take(len(images) * int(np.prod(self.image_shape))).reshape((-1,) + self.image_shape)
        return host_crop.crop_flip(images, self.crop_size, draws, out), labels

    def _iterating(self) -> bool:
        iterator = self._active() if self._active is not None else None
        return iterator is not None and iterator.gi_frame is not None  # made, and neither finished nor closed

    def __iter__(self):
        """Batches from the current position (a ``RuntimeError`` while another iterator is active)."""
        if self._iterating():
            raise RuntimeError(
                f"this NumpyReader already has an active iterator (at step {self._step}): a reader is one position "
                "in one stream, so a second iterator would hand out batches twice or skip them. Finish, close or "
                "drop the first; make a second NumpyReader for an independent stream; or use read_batch(step)")
        self._source.snapshot.check()
        iterator = self._batches()
        self._active = weakref.ref(iterator)
        return iterator

    def _batches(self):
        first = self._step
        steps = itertools.count(first) if self.training else range(first, len(self))
        for step, batch in enumerate(prefetched(self.read_batch, steps, self.threads, self.prefetch), first):
            self._step = step + 1
            yield batch
            del batch
        if not self.training:
            self._step = 0

    def as_py_dataset(self, *, steps_done=None, **kwargs):
        """This reader as a ``keras.utils.PyDataset`` (:class:`~shardprep.train.data.keras_batches.KerasBatches`)."""
        from shardprep.train.data.keras_batches import KerasBatches

        return KerasBatches(self, steps_done=steps_done, **kwargs)


def _checked_arguments(data_dir, split, training, manifest, threads, prefetch, verify_records) -> str:
    """``data_dir`` as a str, after the arguments RecordOrder does not check are checked (type and range)."""
    if not isinstance(data_dir, (str, os.PathLike)):
        raise TypeError(f"data_dir must be a path (str or os.PathLike), got {data_dir!r} ({type(data_dir).__name__})")
    if not isinstance(split, str):
        raise TypeError(f"split must be a split name (a string), got {split!r} ({type(split).__name__})")
    bool_argument("training", training)
    bool_argument("verify_records", verify_records)
    if manifest is not None and not isinstance(manifest, (dict, Manifest)):
        raise TypeError(f"manifest must be a loaded manifest (dict or Manifest) or None, got a "
                        f"{type(manifest).__name__}")
    for name, value in (("threads", threads), ("prefetch", prefetch)):
        integer_argument(name, value, minimum=1, optional=True)
    return os.fspath(data_dir)


def prefetched(read, steps, threads: int | None = None, depth: int | None = None):
    """``read(step)`` for each of ``steps``, in order, computed ``depth`` ahead on ``threads`` threads; closing the
    generator cancels what has not started (the pool's threads end with it, never hanging the process at exit)."""
    threads = threads or DEFAULT_THREADS
    depth = max(threads, depth or DEFAULT_DEPTH)
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardprep-reader")
    pending: collections.deque = collections.deque()
    steps = iter(steps)
    try:
        pending.extend(pool.submit(read, step) for step in itertools.islice(steps, depth))
        while pending:
            batch = pending.popleft().result()
            pending.extend(pool.submit(read, step) for step in itertools.islice(steps, 1))
            yield batch
            del batch  # the reused buffer is the caller's alone while it holds it
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)


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
            host_crop.check_fits(self.crop_size, (self.manifest.shorter_side, self.manifest.shorter_side, 3))
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
