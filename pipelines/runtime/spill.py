"""Spill files: decoded records under OUTPUT/.tmp/ between decoding and shard writing (``SpillWriter``), read back by
(file, offset, size) (``SpillReader``), removed once the manifest is written (``remove_spill``)."""

from __future__ import annotations

import collections
import contextlib
import hashlib
import os
import threading
import uuid
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.preprocess_job.common import PreprocessError, failing_as
from shardprep.pipelines.runtime.storage import JOURNAL_NAME, SPILL_DIR, deletable, is_local
from shardprep.preprocess.format import manifest

SPILL_READ_THREADS = 8  # remote spill reads are latency-bound: overlap them
SPILL_READ_AHEAD = 32  # remote records in flight per shard writer: what it holds at most, besides the one it writes


class SpillWriter:
    """An append-only file of framed records under OUTPUT/.tmp/ (one per decode group, or per bundle)."""

    def __init__(self, output: str, hashed: bool = False):
        self.path = manifest.join(output, SPILL_DIR, f"spill-{uuid.uuid4().hex}.records")
        self.digest = hashlib.sha256() if hashed else None
        with failing_as(f"cannot write to {self.path}"):
            self.stream = FileSystems.create(self.path, mime_type="application/octet-stream",
                                             compression_type=CompressionTypes.UNCOMPRESSED)
        self.offset = 0

    def append(self, framed: bytes) -> tuple[int, int]:
        """Writes one framed record; returns its (offset, size) in the file."""
        with failing_as(f"writing {self.path} failed"):
            self.stream.write(framed)
        if self.digest is not None:
            self.digest.update(framed)
        offset, self.offset = self.offset, self.offset + len(framed)
        return offset, len(framed)

    def sha256(self) -> str:
        return self.digest.hexdigest()

    def close(self) -> None:
        with failing_as(f"writing {self.path} failed"):
            self.stream.close()


def remove_spill(output: str) -> None:
    """Deletes OUTPUT/.tmp/ once the manifest is written (until then its journal is what a resume starts from)."""
    if is_local(output):
        remove_local_spill(output)
        return
    if spill_files := [m.path for m in FileSystems.match([manifest.join(output, SPILL_DIR, "*")])[0].metadata_list]:
        FileSystems.delete(spill_files)


def remove_local_spill(output: str) -> None:
    """Deletes a run's files in a local OUTPUT/.tmp/ (never through a link), the journal last (a kill leaves the
    journal or nothing), then the folder if empty; anything else stays."""
    folder = manifest.join(output, SPILL_DIR)
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    names = [name for name in os.listdir(folder) if deletable(f"{SPILL_DIR}/{name}")
             and os.path.isfile(os.path.join(folder, name)) and not os.path.islink(os.path.join(folder, name))]
    for name in sorted(names, key=lambda name: (name == JOURNAL_NAME, name)):
        remove_file(os.path.join(folder, name))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def remove_file(path: str) -> None:
    """Deletes one local file (the one place spill files are deleted at the end of a run)."""
    os.remove(path)


class SpillReader:
    """Reads framed records back from spill files, in the order asked: local ones with ``os.pread``, remote ones
    with record-sized reads on a thread pool, SPILL_READ_AHEAD ahead. One pool per reader until :meth:`close` (a
    shard writer's teardown): fresh threads per shard each kept a malloc arena holding about a shard."""

    def __init__(self, threads: int = SPILL_READ_THREADS, read_ahead: int = SPILL_READ_AHEAD):
        self.threads, self.read_ahead = threads, read_ahead
        self._pool: ThreadPoolExecutor | None = None

    def records(self, pointers):
        """The framed records at ``pointers`` ((spill file, offset, size), ...), one at a time."""
        pointers = list(pointers)
        if pointers:
            yield from (_iter_local if is_local(pointers[0][0]) else self._iter_remote)(pointers)

    def _iter_remote(self, pointers):
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="spill-read")
        largest: dict[str, int] = {}
        for path, _, size in pointers:
            largest[path] = max(largest.get(path, 0), size)
        streams: dict = {}  # (thread, spill file) -> its read stream; each key set by its own thread only

        def read(path: str, offset: int, size: int) -> bytes:
            key = (threading.get_ident(), path)
            if key not in streams:
                streams[key] = open_for_record_reads(path, largest[path])
            streams[key].seek(offset)
            data = streams[key].read(size)
            if len(data) != size:
                raise PreprocessError(f"spill file {path} is shorter than expected (offset {offset})")
            return data

        pending = collections.deque()
        try:
            for pointer in pointers:
                pending.append(self._pool.submit(read, *pointer))
                if len(pending) >= self.read_ahead:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()
            futures.wait(pending)
            for stream in streams.values():
                with contextlib.suppress(Exception):
                    stream.close()

    def close(self) -> None:
        """Shuts the thread pool down (waiting for reads in flight); the reader can still be used afterwards."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def open_for_record_reads(path: str, largest_record: int):
    """A read stream buffered for single-record reads: Beam's GCS reader otherwise fetches 16 MiB (its default
    buffer) on each miss, ~80x the data for a shard writer's scattered records (``GcsIO``, Beam's public API)."""
    if FileSystems.get_scheme(path) == "gs":
        from apache_beam.io.gcp.gcsio import GcsIO

        return GcsIO().open(path, "rb", read_buffer_size=max(largest_record, 64 * 1024))
    return FileSystems.open(path, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED)


def _iter_local(pointers):
    descriptors = {}
    try:
        for path, offset, size in pointers:
            descriptor = descriptors.get(path)
            if descriptor is None:
                try:
                    descriptor = descriptors[path] = os.open(path, os.O_RDONLY)
                except OSError as e:
                    raise PreprocessError(f"cannot read spill file {path}: {e}") from e
            data = os.pread(descriptor, size, offset)
            if len(data) != size:
                raise PreprocessError(f"spill file {path} is shorter than expected (offset {offset})")
            yield data
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)
