"""The framework-free reader: no TensorFlow, make_dataset's batches, start steps, shares, loaders, clean exits."""

import itertools
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from shardprep.train.numpy_reader import NumpyReader
from shardprep.train.record_dataset import EpochSampler, RecordDataset
from train_helpers import random_images, write_dataset

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYOUTS = [("raw", "center"), ("jpeg", "center"), ("raw", "none"), ("jpeg", "none")]


def _items(crop, count, seed):
    if crop == "center":
        return random_images(count, 12, 10, seed=seed, labels=(0, 1, 2))
    rng = np.random.default_rng(seed)  # shorter side 8, other side varied: crops have room to move
    sizes = [(8, 14), (12, 8), (8, 8), (8, 11), (10, 8)]
    return [(rng.integers(0, 256, (*sizes[i % len(sizes)], 3), dtype=np.uint8), i % 3) for i in range(count)]


@pytest.fixture(scope="module", params=LAYOUTS, ids=["-".join(layout) for layout in LAYOUTS])
def dataset(request, tmp_path_factory):
    encoding, crop = request.param
    root = tmp_path_factory.mktemp(f"{encoding}-{crop}")
    splits = {"train": _items(crop, 23, 1), "validation": _items(crop, 11, 2)}
    write_dataset(root, splits, classes=["a", "b", "c"], encoding=encoding, crop=crop, num_shards=3,
                  shorter_side=8 if crop == "none" else None)
    return str(root)


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
    from shardprep.train import reader

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
    from shardprep.train import reader

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
    from shardprep.train import reader

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

    from shardprep.train import reader

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
