"""The framework-free reader: no TensorFlow, make_dataset's batches, start steps, shares, loaders, clean exits."""

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shardprep.train.data.numpy_reader import EpochSampler, NumpyReader, RecordDataset
from train_helpers import random_images, write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = [("raw", "center"), ("jpeg", "center"), ("raw", "none"), ("jpeg", "none")]


def _items(crop, count, seed):
    if crop == "center":
        return random_images(count, 12, 10, seed=seed, labels=(0, 1, 2))
    rng = np.random.default_rng(seed)  # shorter side 8, other side varied: crops have room to move
    sizes = [(8, 14), (12, 8), (8, 8), (8, 11), (10, 8)]
    return [(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8), i % 3) for i in range(count)]


@pytest.fixture(scope="module")
def layout_dataset(tmp_path_factory):
    """``layout_dataset(encoding, crop)``: the module's dataset of that layout, written once on first use."""
    written = {}

    def get(encoding, crop):
        if (encoding, crop) not in written:
            root = tmp_path_factory.mktemp(f"{encoding}-{crop}")
            splits = {"train": _items(crop, 23, 1), "validation": _items(crop, 11, 2)}
            write_dataset(root, splits, classes=["a", "b", "c"], encoding=encoding, crop=crop, num_shards=3,
                          shorter_side=8 if crop == "none" else None)
            written[encoding, crop] = str(root)
        return written[encoding, crop]

    return get


@pytest.fixture(scope="module", params=LAYOUTS, ids=["-".join(layout) for layout in LAYOUTS])
def dataset(request, layout_dataset):
    return layout_dataset(*request.param)


def _numpy_batches(reader, count):
    return [(images.copy(), labels.copy()) for images, labels in itertools.islice(reader, count)]


def _tf_batches(dataset, count):
    return [(images.numpy(), labels.numpy()) for images, labels in dataset.take(count)]


def _assert_same(first, second):
    assert len(first) == len(second)
    for (images, labels), (other_images, other_labels) in zip(first, second):
        np.testing.assert_array_equal(images, other_images)
        np.testing.assert_array_equal(labels, other_labels)


@pytest.mark.parametrize("training", [False, True])
def test_batches_equal_make_datasets_for_a_seed(dataset, training):
    from shardprep.train.data import reader

    split, count = ("train", 12) if training else ("validation", 100)
    numpy_batches = _numpy_batches(NumpyReader(dataset, split, 4, training, seed=5), count)
    _assert_same(numpy_batches, _tf_batches(reader.make_dataset(dataset, split, 4, training, seed=5), count))
    if not training:
        assert [len(labels) for _, labels in numpy_batches] == [4, 4, 3]
    else:  # CRC-checked reads give the same batches too
        _assert_same(numpy_batches[:3], _tf_batches(
            reader.make_dataset(dataset, split, 4, training, seed=5, verify_records=True), 3))


def test_same_seed_same_batches_and_epochs_reshuffled(dataset):
    first = _numpy_batches(NumpyReader(dataset, "train", 4, True, seed=2), 10)
    _assert_same(first, _numpy_batches(NumpyReader(dataset, "train", 4, True, seed=2), 10))
    reader = NumpyReader(dataset, "train", 4, True, seed=2)
    assert reader.steps_per_epoch == len(reader) == 5
    epochs = [np.concatenate([labels for _, labels in first[e * 5:(e + 1) * 5]]) for e in range(2)]
    images = [np.concatenate([images for images, _ in first[e * 5:(e + 1) * 5]]) for e in range(2)]
    assert not np.array_equal(images[0], images[1])
    assert sorted(epochs[0].tolist()) != [] and len(epochs[0]) == 20


def test_start_step_continues_exactly_where_an_uninterrupted_run_was(dataset):
    from shardprep.train.data import reader

    uninterrupted = _numpy_batches(NumpyReader(dataset, "train", 4, True, seed=8), 14)
    for start in (3, 5, 7):  # mid-epoch, at an epoch boundary, across one (5 batches an epoch)
        resumed = NumpyReader(dataset, "train", 4, True, seed=8, start_step=start)
        _assert_same(_numpy_batches(resumed, 14 - start), uninterrupted[start:])
        assert resumed.state().step == 14
        _assert_same(_tf_batches(reader.make_dataset(dataset, "train", 4, True, seed=8, start_step=start), 4),
                     uninterrupted[start:start + 4])
    paused = NumpyReader(dataset, "train", 4, True, seed=8)
    _numpy_batches(paused, 6)
    state = paused.state()
    assert (state.step, state.epoch, state.batch) == (6, 1, 1)
    again = NumpyReader(dataset, "train", 4, True, seed=8)
    again.set_state(state)
    _assert_same(_numpy_batches(again, 3), uninterrupted[6:9])


def test_streamed_reads_refuse_a_start_step(dataset):
    from shardprep.train.data import reader

    with pytest.raises(ValueError, match="resuming mid-epoch needs local shards read by random access"):
        reader.make_dataset(dataset, "train", 4, True, seed=1, random_access=False, start_step=3)


@pytest.mark.parametrize("training", [True, False])
def test_shares_of_processes_cover_every_record_once_with_equal_batch_counts(dataset, training):
    split = "train" if training else "validation"
    readers = [NumpyReader(dataset, split, 2, training, seed=4, num_shards=3, index=i) for i in range(3)]
    assert len({len(r) for r in readers}) == 1
    shares = [_numpy_batches(r, len(r)) for r in readers]
    seen = [image.tobytes() for share in shares for images, _ in share for image in images]
    assert len(seen) == len(set(seen))
    if not training:  # crops are central: every stored record is there once
        everything = _numpy_batches(NumpyReader(dataset, split, 100, False), 1)[0][0]
        assert sorted(seen) == sorted(image.tobytes() for image in everything)
    else:
        assert len(seen) == 3 * len(readers[0]) * 2 == 3 * ((23 // 3) // 2) * 2


def test_input_pipelines_of_make_dataset_read_the_numpy_shares(dataset):
    import tensorflow as tf

    from shardprep.train.data import reader

    for index in range(2):
        context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=index, num_replicas_in_sync=2)
        _assert_same(_tf_batches(reader.make_dataset(dataset, "validation", 6, False, input_context=context), 10),
                     _numpy_batches(NumpyReader(dataset, "validation", 3, False, num_shards=2, index=index), 10))


def test_the_loader_protocol_gives_the_readers_records(dataset):
    records = RecordDataset(dataset, "train")
    assert len(records) == 23
    image, label = records[0]
    assert image.dtype == np.uint8 and image.shape == (*NumpyReader(dataset, "train", 1, False).image_shape,)
    assert isinstance(label, int)
    for index in range(2):
        sampler = EpochSampler(records, training=True, seed=6, num_shards=2, index=index)
        reader = NumpyReader(dataset, "train", 4, True, seed=6, num_shards=2, index=index)
        batches = _numpy_batches(reader, 2 * len(reader))
        assert len(sampler) == 11
        for epoch in range(2):
            sampler.set_epoch(epoch)
            ids = list(sampler)
            for b in range(len(reader)):  # what DataLoader(batch_size=4, drop_last=True) makes of them
                labels = [records[i][1] for i in ids[4 * b:4 * b + 4]]
                assert labels == batches[epoch * len(reader) + b][1].tolist()
                if records.manifest.crop == "center":
                    np.testing.assert_array_equal(np.stack([records[i][0] for i in ids[4 * b:4 * b + 4]]),
                                                  batches[epoch * len(reader) + b][0])
    evaluation = EpochSampler(records, training=False, num_shards=2, index=1)
    assert list(evaluation) == list(range(12, 23)) and len(evaluation) == 11
    with pytest.raises(IndexError):
        records[23]


def test_torch_dataloader_yields_the_same_records(dataset):
    torch = pytest.importorskip("torch")
    records = RecordDataset(dataset, "train")
    sampler = EpochSampler(records, training=True, seed=6)
    loader = torch.utils.data.DataLoader(records, batch_size=4, sampler=sampler, drop_last=True)
    reader = NumpyReader(dataset, "train", 4, True, seed=6)
    for (images, labels), (expected_images, expected_labels) in zip(loader, _numpy_batches(reader, len(reader))):
        assert labels.tolist() == expected_labels.tolist()
        if records.manifest.crop == "center":
            np.testing.assert_array_equal(images.numpy(), expected_images)


def _run(script, timeout=120):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_framework_free_reader_imports_no_tensorflow(layout_dataset):
    # One process reads every layout (each decodes its own way): no framework is imported by any of them.
    datasets = [layout_dataset(*layout) for layout in LAYOUTS]
    done = _run(f"""
        import sys
        from shardprep.train.data.numpy_reader import EpochSampler, NumpyReader, RecordDataset
        for dataset in {datasets!r}:
            reader = NumpyReader(dataset, "train", 4, True, seed=0)
            images, labels = next(iter(reader))
            records = RecordDataset(dataset, "train")
            records[list(EpochSampler(records, seed=0))[0]]
            assert len(list(NumpyReader(dataset, "validation", 4, False))) == 3, dataset
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "tf_keras", "jax",
                                                                   "torch", "apache_beam")))
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_process_exits_while_the_reader_prefetches(tmp_path):
    items = random_images(64, 128, 128, seed=13, labels=(0, 1))
    write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=4)
    done = _run(f"""
        from shardprep.train.data.numpy_reader import NumpyReader
        reader = NumpyReader({str(tmp_path)!r}, "train", 16, True, seed=0, threads=4, prefetch=8)
        kept = iter(reader)
        for _ in range(5):
            next(kept)
        dropped = iter(NumpyReader({str(tmp_path)!r}, "train", 16, True, seed=1))
        next(dropped)
        del dropped
        print("read", flush=True)
    """)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "read"


def test_batches_kept_by_the_caller_are_never_overwritten(dataset):
    reader = NumpyReader(dataset, "train", 4, True, seed=3, prefetch=2)
    kept = [(images, images.copy(), labels, labels.copy()) for images, labels in itertools.islice(reader, 30)]
    for images, copy, labels, labels_copy in kept:
        np.testing.assert_array_equal(images, copy)
        np.testing.assert_array_equal(labels, labels_copy)


@pytest.mark.parametrize("kwargs,message", [
    (dict(batch_size=0), "batch_size must be positive"),
    (dict(num_shards=2, index=2), r"index must be in \[0, num_shards=2\)"),
    (dict(num_shards=30), "num_shards=30 is more than the split's 23 records"),
    (dict(start_step=-1), "start_step must be"),
    (dict(threads=0), "threads must be positive"),
])
def test_bad_arguments_are_refused_clearly(dataset, kwargs, message):
    arguments = dict(batch_size=4) | kwargs
    with pytest.raises(ValueError, match=message):
        NumpyReader(dataset, "train", arguments.pop("batch_size"), True, **arguments)


def test_missing_datasets_splits_and_urls_are_explained(tmp_path, dataset):
    from shardprep.preprocess.format.manifest import ManifestError

    with pytest.raises(ManifestError, match="is an empty folder, not a prepared dataset"):
        NumpyReader(str(tmp_path), "train", 4, True)
    with pytest.raises(KeyError, match="splits: train, validation"):
        NumpyReader(dataset, "test", 4, False)
    with pytest.raises(ValueError, match="NumpyReader reads local datasets only"):
        NumpyReader("gs://bucket/data", "train", 4, True)


def test_keras_py_dataset_gives_the_readers_batches_epoch_after_epoch(dataset):
    reader = NumpyReader(dataset, "train", 4, True, seed=7)
    expected = _numpy_batches(NumpyReader(dataset, "train", 4, True, seed=7), 10)
    batches = reader.as_py_dataset()
    assert batches.num_batches == len(batches) == 5
    for epoch in range(2):
        batches.on_epoch_begin()
        _assert_same([batches[i] for i in (4, 0)], [expected[epoch * 5 + 4], expected[epoch * 5]])
        batches.on_epoch_end()
    assert reader.state().step == 10
    validation = NumpyReader(dataset, "validation", 4, False).as_py_dataset()
    assert len(validation) == 3 and len(validation[2][1]) == 3


def test_keras_backup_and_restore_resumes_with_the_batches_of_an_uninterrupted_run(tmp_path):
    # Keras 3 restores the weights, the optimizer (its iterations: the global step) and the epoch, and restarts that
    # epoch at batch 0; steps_done makes the PyDataset start each epoch at the restored step instead.
    keras = pytest.importorskip("keras")
    write_dataset(tmp_path / "data", {"train": random_images(24, 6, 5, seed=3, labels=(0, 1, 2))},
                  classes=["a", "b", "c"], num_shards=2)
    fed, restored = [], []

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 9:
                raise RuntimeError("interrupted")

    class Watch(keras.callbacks.Callback):
        def __init__(self, batches):
            super().__init__()
            self.batches = batches

        def on_train_begin(self, logs=None):
            restored.append(int(self.model.optimizer.iterations))

        def on_train_batch_begin(self, batch, logs=None):
            fed.append(self.batches.epoch_start + batch)

    def fit(*extra):
        model = keras.Sequential([keras.Input((6, 5, 3)), keras.layers.Flatten(), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        batches = NumpyReader(str(tmp_path / "data"), "train", 4, True, seed=1).as_py_dataset(
            steps_done=lambda: int(model.optimizer.iterations))  # 6 batches an epoch
        callbacks = [keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=4), Watch(batches)]
        model.fit(batches, epochs=3, callbacks=callbacks + list(extra), verbose=0)

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(Interrupt())
    assert fed == list(range(9)) and restored == [0]
    del fed[:]
    fit()
    step = restored[1]
    assert 0 < step < 9 and step % 6  # restored mid-epoch
    assert fed == list(range(step, step + len(fed))) and len(fed) == (3 - step // 6) * 6


def test_dropping_an_iterator_stops_its_threads(dataset):
    import threading
    import time

    before = set(threading.enumerate())
    iterator = iter(NumpyReader(dataset, "train", 4, True, seed=0, threads=3))
    next(iterator)
    started = [t for t in threading.enumerate() if t not in before and t.name.startswith("shardprep-reader")]
    assert started
    del iterator
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in started) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.is_alive() for t in started)


def test_datasets_without_a_record_layout_and_damaged_shards(tmp_path):
    from shardprep.train.data import reader

    items = random_images(10, 6, 5, seed=6, labels=(0, 1))
    manifest = write_dataset(tmp_path / "old", {"train": items}, classes=["a", "b"], fixed_layout=False)
    assert "record_layout" not in manifest["splits"]["train"]
    _assert_same(_numpy_batches(NumpyReader(tmp_path / "old", "train", 3, True, seed=1), 6),
                 _tf_batches(reader.make_dataset(str(tmp_path / "old"), "train", 3, True, seed=1), 6))
    for layout in (True, False):
        root = tmp_path / f"cut-{layout}"
        manifest = write_dataset(root, {"train": items}, classes=["a", "b"], fixed_layout=layout)
        path = root / manifest["splits"]["train"]["shards"][0]["file"]
        path.write_bytes(path.read_bytes()[:-7])
        with pytest.raises(ValueError, match=path.name):
            NumpyReader(root, "train", 3, True)
