"""The one record order of every random-access read, in NumPy: training epoch ``e`` is a permutation drawn from
``PCG64(SeedSequence([seed, e, 0]))``, process ``index`` taking ``perm[index::num_shards]``, so any step is O(1);
evaluation is one pass of contiguous slices. ``crop: none`` squares draw from a second stream.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import secrets
import threading

import numpy as np

# Crop draws are in [0, CROP_DRAW_LIMIT): an offset is draw % (spare + 1), exact in int64 on NumPy and TensorFlow.
CROP_DRAW_LIMIT = 1 << 31
_PERMUTATION_STREAM, _CROP_STREAM = 0, 1
_CACHED_EPOCHS = 2


@dataclasses.dataclass(frozen=True)
class ReaderState:
    """A reader's position: ``step`` global batches already read (pass it as ``start_step`` to resume there)."""

    step: int
    epoch: int
    batch: int  # within the epoch


class RecordOrder:
    """The batches of one split for one process as global record indices: ``counts`` records per shard,
    ``batch_size`` per batch, endless reshuffled epochs (``training``) or one pass; ``seed=None`` draws one;
    ``num_shards``/``index``: this process's share. ``TypeError``/``ValueError`` for bad arguments, too few records."""

    def __init__(self, counts, batch_size: int, training: bool, seed: int | None = None, *, num_shards: int = 1,
                 index: int = 0):
        counts = np.asarray(counts, np.int64).reshape(-1)
        _check(int(counts.sum()), batch_size, num_shards, index, training)
        seed = integer_argument("seed", seed, minimum=0, optional=True)
        self.num_records = int(counts.sum())
        self.batch_size, self.training = int(batch_size), bool(training)
        self.num_shards, self.index = int(num_shards), int(index)
        self.seed = int(seed) if seed is not None else secrets.randbits(63)
        # The last epochs' permutations and crop draws (parallel readers straddle an epoch boundary), one at a time.
        self._lock = threading.Lock()
        self._permutation = functools.lru_cache(_CACHED_EPOCHS)(lambda epoch: _generator(
            self.seed, epoch, _PERMUTATION_STREAM).permutation(self.num_records).astype(np.int64, copy=False))
        # A row per position in the epoch's permutation.
        self._crop_draws = functools.lru_cache(_CACHED_EPOCHS)(lambda epoch: _generator(
            self.seed, epoch, _CROP_STREAM).integers(0, CROP_DRAW_LIMIT, (self.num_records, 2), dtype=np.int64))
        if training:
            self.records_per_shard = self.num_records // self.num_shards
            self.steps_per_epoch = self.records_per_shard // self.batch_size
            self._eval_sizes = None
        else:
            self._eval_first, self._eval_sizes = _eval_share(self.num_records, self.batch_size, self.num_shards,
                                                             self.index)
            self._eval_ends = self._eval_first + np.cumsum(self._eval_sizes)
            self.steps_per_epoch = len(self._eval_sizes)

    def __len__(self) -> int:
        """Batches per epoch (training) or in the pass (evaluation)."""
        return self.steps_per_epoch

    def state(self, step: int) -> ReaderState:
        return ReaderState(step, step // self.steps_per_epoch, step % self.steps_per_epoch)

    def batch_ids(self, step) -> np.ndarray:
        """Global indices (int64) of global batch ``step``'s records (any step >= 0 in training)."""
        step = int(step)
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if not self.training:
            if step >= self.steps_per_epoch:
                raise IndexError(f"evaluation has {self.steps_per_epoch} batches, no batch {step}")
            end = int(self._eval_ends[step])
            return np.arange(end - int(self._eval_sizes[step]), end, dtype=np.int64)
        return self.epoch_ids(step // self.steps_per_epoch)[self.positions(step)]

    def epoch_share(self, epoch: int = 0) -> np.ndarray:
        """This process's global indices of epoch ``epoch`` in reading order (evaluation: its slice)."""
        if not self.training:
            return np.arange(self._eval_first, int(self._eval_ends[-1]) if len(self._eval_ends) else 0, dtype=np.int64)
        return self.epoch_ids(epoch)[self.index::self.num_shards][:self.records_per_shard]

    def positions(self, step) -> np.ndarray:
        """Positions in its epoch's permutation of batch ``step``'s records (what :meth:`crop_draws` indexes)."""
        first = self.index + int(step) % self.steps_per_epoch * self.batch_size * self.num_shards
        return np.arange(first, first + self.batch_size * self.num_shards, self.num_shards, dtype=np.int64)

    def epoch_ids(self, epoch: int) -> np.ndarray:
        """Epoch ``epoch``'s permutation of every global index (all shards), cached for the last two epochs."""
        with self._lock:
            return self._permutation(int(epoch))

    def crop_draws(self, step) -> np.ndarray:
        """int64 ``[B, 2]`` crop draws of batch ``step``: top, left ``= d % (spare + 1)``; zeros in evaluation."""
        if not self.training:
            return np.zeros((len(self.batch_ids(step)), 2), np.int64)
        with self._lock:
            draws = self._crop_draws(int(step) // self.steps_per_epoch)
        return draws[self.positions(step)]


def shard_starts(counts) -> np.ndarray:
    """The global index of each shard's first record, and the split's size last."""
    return np.concatenate([[0], np.cumsum(np.asarray(counts, np.int64))]).astype(np.int64)


def locate(starts: np.ndarray, ids) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, record in shard)`` int64 arrays of global indices ``ids`` (``starts``: :func:`shard_starts`)."""
    ids = np.asarray(ids, np.int64)
    shards = np.searchsorted(starts, ids, side="right") - 1
    return shards, ids - starts[shards]


def _generator(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), int(epoch), stream])))


def integer_argument(name: str, value, *, minimum: int | None = None, optional: bool = False) -> int | None:
    """``value`` as an int: an integer (NumPy's too; not a bool, float or str) of at least ``minimum``, or None when
    ``optional``; else ``TypeError``/``ValueError`` naming the argument."""
    if value is None and optional:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer{' or None' if optional else ''}, got {value!r} "
                        f"({type(value).__name__})")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be positive, got {value}" if minimum == 1
                         else f"{name} must be >= {minimum}, got {value}")
    return value


def bool_argument(name: str, value) -> bool:
    """``value`` if it is True or False (NumPy's too); ``TypeError`` naming the argument otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def _check(num_records: int, batch_size: int, num_shards: int, index: int, training: bool) -> None:
    batch_size = integer_argument("batch_size", batch_size, minimum=1)
    num_shards = integer_argument("num_shards", num_shards, minimum=1)
    index = integer_argument("index", index)
    bool_argument("training", training)
    if not 0 <= int(index) < int(num_shards):
        raise ValueError(f"index must be in [0, num_shards={num_shards}), got {index}")
    if num_records < 1:
        raise ValueError("the split has no records")
    if int(num_shards) > num_records:
        raise ValueError(f"num_shards={num_shards} is more than the split's {num_records} records: some processes "
                         "would read nothing")
    if training and num_records // int(num_shards) < int(batch_size):
        raise ValueError(f"the split's {num_records} records make no training batch of {batch_size} "
                         f"for each of {num_shards} process(es): lower batch_size")


def _eval_share(num_records: int, batch_size: int, num_shards: int, index: int) -> tuple[int, np.ndarray]:
    """(first global index, batch sizes) of process ``index``'s evaluation slice: contiguous near-equal slices
    (the first ``N % S`` one longer), each in ``ceil(ceil(N / S) / B)`` batches, full ones first (with ``B`` 1 a
    shorter slice ends with an empty batch: the only way every process gets as many)."""
    base, extra = divmod(num_records, num_shards)
    first = index * base + min(index, extra)
    remaining = base + (1 if index < extra else 0)
    batches = -(-(-(-num_records // num_shards)) // batch_size)
    sizes = []
    for left in range(batches, 0, -1):
        size = min(batch_size, max(remaining - (left - 1), min(1, remaining)))
        sizes.append(size)
        remaining -= size
    return first, np.asarray(sizes, np.int64)
