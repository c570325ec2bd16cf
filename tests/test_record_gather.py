"""Random-access gathers of fixed-layout records: labels, reused buffers, held batches, shutdown."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from shardprep.preprocess.format import fixed_layout, record_format
from shardprep.train.data import reader, record_gather
from train_helpers import random_images, write_dataset


def test_varints_decode_at_every_length():
    values = [0, 1, 127, 128, 300, 16383, 16384, 2**21 + 5, 2**35 + 7, 2**62 + 11]
    rows = np.full((len(values), 12), 0xAB, np.uint8)  # bytes after each varint are noise
    for row, value in zip(rows, values):
        encoded = record_format.varint(value)  # the writer's encoder
        row[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    assert record_gather.decode_varints(rows).tolist() == values


def test_buffers_are_aligned_reused_once_released_and_never_while_held():
    buffers = record_gather.ReusedBuffers(max_buffers=2)
    first = buffers.take(1000)
    second = buffers.take(1000)
    assert first.ctypes.data % record_gather.ALIGNMENT == 0 and first.nbytes == 1000
    assert first.ctypes.data != second.ctypes.data  # the first is still held
    held = first.reshape(10, 100)  # a view keeps the memory in use
    address = first.ctypes.data
    del first
    assert buffers.take(1000).ctypes.data != address
    del held
    assert buffers.take(1000).ctypes.data == address
    assert buffers.take(24).nbytes == 24 and len(buffers) == 3  # sizes are pooled apart
    kept = [buffers.take(1000) for _ in range(4)]  # beyond max_buffers: fresh, unpooled arrays
    assert len({b.ctypes.data for b in kept}) == 4 and len(buffers) == 3


def test_batches_kept_by_the_caller_are_never_overwritten(tmp_path):
    items = random_images(24, 8, 6, seed=11, labels=(0, 1, 2))
    write_dataset(tmp_path, {"train": items}, classes=["a", "b", "c"], num_shards=3)
    stored = {pixels.tobytes(): label for pixels, label in items}
    dataset = reader.make_dataset(str(tmp_path), "train", 5, training=True, seed=1, random_access=True)
    kept = []
    for images, labels in dataset.take(40):  # 200 images: every record read ~8 times into reused buffers
        kept.append((images, images.numpy().copy(), labels.numpy()))
    for images, copy, labels in kept:
        np.testing.assert_array_equal(images.numpy(), copy)
        assert [stored[image.tobytes()] for image in copy] == labels.tolist()


def test_buffers_go_back_to_the_pool_when_batches_are_dropped(tmp_path):
    items = random_images(24, 8, 6, seed=12, labels=(0, 1))
    write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=2)
    manifest = reader.load_manifest(str(tmp_path))
    shards = [str(tmp_path / shard.file) for shard in manifest.split("train").shards]
    gather = record_gather.FixedLayoutGather(shards, manifest.split("train").record_layout)
    ids = np.array([(shard << record_gather.RECORD_INDEX_BITS) + record for shard, record in [(0, 3), (1, 0), (1, 11)]])
    for _ in range(50):
        images, labels = gather(ids)  # the previous batch is still held while this one is read
    assert len(gather.buffers) == 2
    np.testing.assert_array_equal(images[1], items[1][0])
    np.testing.assert_array_equal(images[2], items[23][0])
    assert labels.tolist() == [items[6][1], items[1][1], items[23][1]]


def test_at_exit_running_gathers_finish_and_later_ones_read_nothing(tmp_path, monkeypatch):
    items = random_images(6, 8, 6, seed=14, labels=(0, 1))
    manifest = write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=1)
    gather = record_gather.FixedLayoutGather([str(tmp_path / manifest["splits"]["train"]["shards"][0]["file"])],
                                             reader.load_manifest(str(tmp_path)).split("train").record_layout)
    monkeypatch.setattr(record_gather._CALLS, "exiting", False)  # restored after the test
    release, reads = threading.Event(), []
    read = gather._gather
    monkeypatch.setattr(gather, "_gather", lambda ids: release.wait() and reads.append(ids) or read(ids))
    running = threading.Thread(target=gather, args=(np.arange(3),))
    running.start()
    settled = threading.Thread(target=record_gather._settle)
    settled.start()
    time.sleep(0.3)
    assert settled.is_alive()  # waits for the gather in progress
    release.set()
    running.join()
    settled.join(timeout=record_gather.SETTLE_TIMEOUT_SECONDS)
    assert not settled.is_alive() and len(reads) == 1
    images, labels = gather(np.arange(3))  # after the hook: nothing is read
    assert images.shape == (0, 8, 6, 3) and labels.shape == (0,) and len(reads) == 1


def test_a_layout_that_does_not_fit_the_images_is_refused(tmp_path):
    manifest = write_dataset(tmp_path, {"train": random_images(4, 8, 8, seed=15)}, classes=["a", "b"])
    manifest["splits"]["train"]["record_layout"] = fixed_layout.FixedLayout.for_records(4, 4, (5, 9), 3).to_json()
    for random_access in (True, False):
        with pytest.raises(ValueError, match="does not fit 8x8 images"):
            reader.make_dataset(str(tmp_path), "train", 2, training=False, manifest=manifest,
                                random_access=random_access)


# What a process prints as it registers the exit hook (tensorflow_child.py's script, and this module's): a streamed
# read of local shards runs Python on tf.data's threads too (each shard's identity is checked as it is opened), so it
# registers the hook as well; importing does not, and it is registered once.
HOOK_LINES = ["IMPORTED []", "STREAMED ['shardprep.train.data.record_gather._settle']",
              "GATHERED ['shardprep.train.data.record_gather._settle']", "read"]


def test_a_process_exits_while_its_iterator_is_reading_and_registers_the_hook_when_a_dataset_needs_it(
        tensorflow_child, tmp_path):
    """In a real process, twice: the exit hook is registered by the first dataset that runs Python on tf.data's
    threads, not on import, and once; then the process exits while its iterator is reading. Without the hook such
    a process hangs at exit in some runs (tf.data threads call into an interpreter that is shutting down), more
    often the bigger the batches. The first process is the session's TensorFlow child (tensorflow_child.py: its
    other readers read too at its exit), the second this one, the gathering reader alone."""
    assert tensorflow_child.returncode == 0, tensorflow_child.stderr[-2000:]
    assert tensorflow_child.stdout_lines[1:] == HOOK_LINES
    from tensorflow_child import RECORD_HOOKS

    items = random_images(64, 256, 256, seed=13, labels=(0, 1))
    write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=4)
    script = RECORD_HOOKS + textwrap.dedent(f"""
        from shardprep.train.data import record_gather
        print("IMPORTED", ours())
        from shardprep.train.data import reader
        reader.make_dataset({str(tmp_path)!r}, "train", 4, training=False, random_access=False)
        print("STREAMED", ours())
        for _ in range(2):
            dataset = reader.make_dataset({str(tmp_path)!r}, "train", 64, training=True, seed=0, random_access=True)
        print("GATHERED", ours())
        iterator = iter(dataset)
        for _ in range(30):
            next(iterator)
        print("read", flush=True)
    """)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=repo, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:4] == HOOK_LINES
