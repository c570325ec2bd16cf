"""Fixed-layout shards gathered by random access: one ``preadv`` per record, the pixels straight into their reused,
aligned batch slot (:class:`ReusedBuffers`), the kernel's copy the only one (BENCHMARKS.md); :class:`VerifiedGather`
checks both CRCs over the pieces read. Plain NumPy and ``os``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import os
import struct
import sys
import threading
import time

import google_crc32c
import numpy as np

from shardprep.preprocess.format import record_format, tfrecord_io
from shardprep.preprocess.format.fixed_layout import FixedLayout

# Record ids carry the shard's index in the high bits and the record's index in the shard in the low bits.
RECORD_INDEX_BITS = 32
# TensorFlow borrows a NumPy array's memory only if it is aligned for Eigen (at most 64 bytes on any build).
ALIGNMENT = 64
# A protobuf varint is at most 10 bytes.
MAX_VARINT_BYTES = 10
_HEADER, _FOOTER = tfrecord_io.HEADER_BYTES, tfrecord_io.FOOTER_BYTES
# ``preadv`` is POSIX (Linux, the BSDs); elsewhere the reader streams.
AVAILABLE = hasattr(os, "preadv")


class ReusedBuffers:
    """Aligned uint8 buffers, each handed out again once nothing references it: every view (the batch, an array
    TensorFlow borrows) holds a reference to the owning array, so its reference count says whether it is in use."""

    def __init__(self, max_buffers: int = 32):
        self.max_buffers = max_buffers
        self._owners: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A 1-D uint8 array of ``nbytes``, aligned to :data:`ALIGNMENT`, that nothing else is using."""
        with self._lock:
            owners = self._owners.setdefault(nbytes, [])
            for i in range(len(owners)):
                # References: the list's and getrefcount's argument. Anything more is a view still alive.
                if sys.getrefcount(owners[i]) == 2:
                    return _aligned_view(owners[i], nbytes)
            owner = np.empty(nbytes + ALIGNMENT, np.uint8)
            if len(owners) < self.max_buffers:
                owners.append(owner)
            # The view is made under the lock: from here on the owner is referenced, so no other caller takes it.
            return _aligned_view(owner, nbytes)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(owners) for owners in self._owners.values())


def _aligned_view(owner: np.ndarray, nbytes: int) -> np.ndarray:
    start = -owner.ctypes.data % ALIGNMENT
    return owner[start:start + nbytes]


class _Calls:
    """Counts gathers in progress, so that the interpreter can wait for them before it shuts down (see ``_settle``)."""

    def __init__(self):
        self.lock, self.running, self.last_end, self.exiting = threading.Lock(), 0, 0.0, False

    def start(self) -> bool:
        """True if a gather may run; False once the interpreter is shutting down."""
        with self.lock:
            if self.exiting:
                return False
            self.running += 1
            return True

    def end(self) -> None:
        with self.lock:
            self.running -= 1
            self.last_end = time.monotonic()

    def idle_for(self) -> float:
        with self.lock:
            return 0.0 if self.running else time.monotonic() - self.last_end


_CALLS = _Calls()
# tf.data runs gathers on its own threads (tf.numpy_function); an iterator alive at interpreter shutdown would hang
# the process on a gather that can never finish. At exit (hook registered on first use, not on import): collect
# unreachable iterators, make new gathers return empty batches, and wait until no gather has run for a moment.
SETTLE_SECONDS = 0.05
SETTLE_TIMEOUT_SECONDS = 5.0


@functools.cache  # once (a second registration under a race would only settle twice)
def _register_exit_hook() -> None:
    atexit.register(_settle)


def guarded(function, empty):
    """``function`` for a ``tf.numpy_function``, made safe at exit like the gathers: the exit hook (registered now)
    waits for calls in progress, and calls after it return ``empty(*args)`` at once."""
    _register_exit_hook()

    def call(*args):
        if not _CALLS.start():
            return empty(*args)
        try:
            return function(*args)
        finally:
            _CALLS.end()

    return call


def _settle():
    gc.collect()
    with _CALLS.lock:
        _CALLS.exiting = True
    deadline = time.monotonic() + SETTLE_TIMEOUT_SECONDS
    while _CALLS.idle_for() < SETTLE_SECONDS and time.monotonic() < deadline:
        time.sleep(SETTLE_SECONDS / 5)


class FixedLayoutGather:
    """``ids -> (uint8 [n, H, W, 3] images, int32 [n] labels)`` from fixed-layout shards ``paths`` (ids:
    shard << RECORD_INDEX_BITS | record), each checked against ``snapshot``. Making one registers the exit hook."""

    def __init__(self, paths, layout: FixedLayout, buffers: ReusedBuffers | None = None, snapshot=None):
        self.paths = [os.fspath(path) for path in paths]
        self.snapshot = snapshot
        # Plain ints on the instance: the layout's properties are computed, and the gather reads these per record.
        self.record_bytes = layout.record_bytes
        self.image_offset = layout.image_offset
        self.image_shape = (layout.height, layout.width, record_format.CHANNELS)
        self.image_bytes = layout.image_bytes
        # Each read's second buffer: the bytes from the pixels' end to the label's last possible byte.
        self.tail_bytes = layout.label_offset - self.image_offset - self.image_bytes + MAX_VARINT_BYTES
        self.buffers = buffers if buffers is not None else ReusedBuffers()
        # At exit, an empty batch lets the pipeline's buffers fill up quietly.
        self._call = guarded(lambda ids: self._gather(np.asarray(ids, np.int64)),
                             lambda ids: (np.zeros((0,) + self.image_shape, np.uint8), np.zeros(0, np.int32)))

    def __call__(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._call(ids)

    def _gather(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        count = len(ids)
        images = self.buffers.take(count * self.image_bytes)
        label_rows = np.empty((count, MAX_VARINT_BYTES), np.uint8)
        shards, records = ids >> RECORD_INDEX_BITS, ids & ((1 << RECORD_INDEX_BITS) - 1)
        with open_shards(self.paths, shards, self.snapshot) as descriptors:
            for j, (shard, record) in enumerate(zip(shards.tolist(), records.tolist())):
                slot = images[j * self.image_bytes:(j + 1) * self.image_bytes]
                label_rows[j] = self._read(descriptors[shard], shard, record, slot)
        return images.reshape((count,) + self.image_shape), decode_varints(label_rows).astype(np.int32)

    def _read(self, fd: int, shard: int, record: int, slot: np.ndarray) -> np.ndarray:
        """The record's pixels into ``slot``; returns the bytes its label starts with."""
        tail = np.empty(self.tail_bytes, np.uint8)
        wanted = self.image_bytes + self.tail_bytes
        got = os.preadv(fd, [slot, tail], self.image_offset + record * self.record_bytes)
        if got != wanted:
            raise OSError(f"{self.paths[shard]}: record {record} ends {wanted - got} bytes early: the shard "
                          "is shorter than its manifest says (run `shardprep validate` on the dataset)")
        return tail[-MAX_VARINT_BYTES:]


# Opening never waits: a FIFO put in a shard's place would block a plain open (regular files ignore the flag).
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def open_shards(paths, shards: np.ndarray, snapshot=None):
    """``{shard: read-only descriptor}`` for a batch's shards, checked against ``snapshot``; closed on exit."""
    descriptors = {}
    try:
        for shard in np.unique(shards).tolist():
            descriptors[shard] = os.open(paths[shard], OPEN_FLAGS)
            if snapshot is not None:
                snapshot.check_descriptor(shard, descriptors[shard])
        yield descriptors
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)


def decode_varints(rows: np.ndarray) -> np.ndarray:
    """int64 values of the protobuf varints that start each row of ``rows`` (uint8 [n, k], k >= the longest)."""
    values = rows.astype(np.int64)
    # A byte belongs to the varint while every byte before it has the high bit set.
    continued = np.cumprod(np.concatenate([np.ones((len(rows), 1), np.int64), values[:, :-1] >= 128], axis=1),
                           axis=1)
    shifts = 7 * np.arange(rows.shape[1], dtype=np.int64)
    return (((values & 127) << shifts) * continued).sum(axis=1)


def check_shard_sizes(paths, counts, layout: FixedLayout) -> None:
    """Raises ``ValueError`` naming every shard whose size is not ``image_offset + count * record_bytes``."""
    record_bytes, image_offset = layout.record_bytes, layout.image_offset
    wrong = []
    for path, count in zip(paths, counts):
        expected = image_offset + int(count) * record_bytes if count else 0
        size = os.path.getsize(path)
        if size != expected:
            wrong.append(f"{path}: {size} bytes, {expected} expected for {count} records of {record_bytes} bytes")
    if wrong:
        raise ValueError("shards that disagree with the manifest (run `shardprep validate` on the dataset): "
                         + "; ".join(wrong))


class VerifiedGather(FixedLayoutGather):
    """:class:`FixedLayoutGather` checking each record's length and data CRC (``OSError`` naming shard, record and
    byte): one ``preadv`` reads the bytes before the pixels, the pixels into their slot and the rest (a shard's last
    record is ``image_offset`` bytes longer), the CRC extended over the three pieces in place."""

    def __init__(self, paths, counts, layout: FixedLayout, buffers: ReusedBuffers | None = None, snapshot=None):
        super().__init__(paths, layout, buffers, snapshot)
        self.counts = [int(count) for count in counts]
        self.label_at = layout.label_offset - self.image_offset - self.image_bytes  # in the piece after the pixels
        self.after_bytes = self.record_bytes - self.image_offset - self.image_bytes  # a shard's last: + image_offset

    def _read(self, fd: int, shard: int, record: int, slot: np.ndarray) -> np.ndarray:
        before = np.empty(self.image_offset, np.uint8)
        tail = np.empty(self.after_bytes + (self.image_offset if record == self.counts[shard] - 1 else 0), np.uint8)
        offset = record * self.record_bytes
        wanted = len(before) + len(slot) + len(tail)
        got = os.preadv(fd, [before, slot, tail], offset)
        problem = None
        if got != wanted:
            problem = f"ends {wanted - got} bytes early: the shard is shorter than its manifest says"
        else:
            length_bytes = before[:8].tobytes()
            length, length_crc = struct.unpack("<QI", before[:_HEADER].tobytes())
            (data_crc,) = struct.unpack("<I", tail[-_FOOTER:].tobytes())
            crc = google_crc32c.extend(google_crc32c.value(before[_HEADER:].tobytes()), slot)
            crc = google_crc32c.extend(crc, tail[:-_FOOTER])
            if tfrecord_io.masked_crc32c(length_bytes) != length_crc or length != wanted - _HEADER - _FOOTER:
                problem = "has a wrong length or length checksum"
            elif tfrecord_io.mask_crc(crc) != data_crc:
                problem = "data checksum mismatch"
        if problem:
            raise OSError(f"{self.paths[shard]}: record {record} (byte {offset}) {problem} "
                          "(run `shardprep validate` on the dataset)")
        return tail[self.label_at:self.label_at + MAX_VARINT_BYTES]
