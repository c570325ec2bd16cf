"""Batches read ahead on a few threads, handed out in order: the framework-free reader's prefetch.

Each thread reads whole batches (``preadv`` and Pillow's decode release the GIL, so threads overlap); at most
``depth`` batches are read or waiting at any time. Dropping or closing the iterator cancels what has not started;
the pool's threads end with it, and at interpreter exit the standard library joins them after at most ``depth``
queued batches, so a process never hangs on them.
"""

from __future__ import annotations

import collections
import concurrent.futures
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

DEFAULT_THREADS = 3
DEFAULT_DEPTH = 6


def prefetched(read: Callable[[int], T], steps: Iterable[int], threads: int | None = None,
               depth: int | None = None) -> Iterator[T]:
    """``read(step)`` for each of ``steps``, in order, computed ahead on ``threads`` threads, ``depth`` ahead."""
    threads = threads or DEFAULT_THREADS
    depth = max(threads, depth or DEFAULT_DEPTH)
    if threads < 1:
        raise ValueError(f"threads must be positive, got {threads}")
    pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardprep-reader")
    pending: collections.deque = collections.deque()
    steps = iter(steps)
    try:
        for step in steps:
            pending.append(pool.submit(read, step))
            if len(pending) >= depth:
                break
        while pending:
            batch = pending.popleft().result()
            for step in steps:
                pending.append(pool.submit(read, step))
                break
            yield batch
            del batch  # the reused buffer is the caller's alone while it holds it
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
