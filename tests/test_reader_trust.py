"""The readers trust nothing they did not check: their arguments, their iterators, and a dataset that changes (is
rebuilt, or holds labels outside the classes) while they read it."""

from __future__ import annotations

import itertools
import json
import os
import shutil

import numpy as np
import pytest

from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.train.data.numpy_reader import NumpyReader
from train_helpers import random_images, write_dataset

LAYOUTS = [("raw", "center"), ("jpeg", "none")]


def write(root, *, size=(12, 10), seed=1, encoding="raw", crop="center", count=24, classes=("a", "b", "c")):
    if crop == "center":
        items = random_images(count, *size, seed=seed, labels=tuple(range(len(classes))))
    else:
        rng = np.random.default_rng(seed)
        items = [(rng.integers(0, 256, (8, 8 + i % 5, 3), dtype=np.uint8), i % len(classes)) for i in range(count)]
    write_dataset(root, {"train": items, "validation": items[:9]}, classes=list(classes), encoding=encoding,
                  crop=crop, num_shards=3, shorter_side=8 if crop == "none" else None)
    return str(root)


def rebuild(root, tmp_path, **options) -> None:
    """What ``preprocess --overwrite`` does to a dataset a reader has open: the manifest goes first, every shard
    and then the manifest are written anew (new files, renamed into place)."""
    fresh = tmp_path / "fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    write(fresh, **options)
    os.unlink(os.path.join(root, manifest_lib.MANIFEST_NAME))
    for folder, _, files in os.walk(fresh):
        for name in files:
            relative = os.path.relpath(os.path.join(folder, name), fresh)
            os.makedirs(os.path.dirname(os.path.join(root, relative)) or root, exist_ok=True)
            os.replace(os.path.join(folder, name), os.path.join(root, relative))


# ---- arguments ------------------------------------------------------------------------------------------------------

@pytest.fixture
def dataset(tmp_path):
    return write(tmp_path / "data")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(batch_size=2.5), TypeError, r"batch_size must be an integer, got 2\.5 \(float\)"),
    (dict(batch_size="4"), TypeError, r"batch_size must be an integer, got '4' \(str\)"),
    (dict(batch_size=True), TypeError, r"batch_size must be an integer, got True \(bool\)"),
    (dict(batch_size=0), ValueError, "batch_size must be positive, got 0"),
    (dict(training="no"), TypeError, r"training must be True or False, got 'no' \(str\)"),
    (dict(seed=1.5), TypeError, r"seed must be an integer or None, got 1\.5 \(float\)"),
    (dict(seed=-1), ValueError, "seed must be >= 0, got -1"),
    (dict(num_shards=2.0), TypeError, r"num_shards must be an integer, got 2\.0 \(float\)"),
    (dict(index=0.5), TypeError, r"index must be an integer"),
    (dict(start_step=1.5), TypeError, r"start_step must be an integer, got 1\.5 \(float\)"),
    (dict(threads=2.5), TypeError, r"threads must be an integer or None, got 2\.5 \(float\)"),
    (dict(prefetch=0), ValueError, "prefetch must be positive, got 0"),
    (dict(split=3), TypeError, r"split must be a split name \(a string\), got 3 \(int\)"),
    (dict(manifest=[1]), TypeError, r"manifest must be a loaded manifest \(dict or Manifest\) or None, got a list"),
])
def test_numpy_reader_refuses_arguments_of_the_wrong_type_or_range(dataset, kwargs, error, message):
    arguments = dict(split="train", batch_size=4, training=True) | kwargs
    with pytest.raises(error, match=message):
        NumpyReader(dataset, arguments.pop("split"), arguments.pop("batch_size"), arguments.pop("training"),
                    **arguments)


def test_numpy_reader_refuses_a_data_dir_that_is_not_a_path(dataset):
    with pytest.raises(TypeError, match=r"data_dir must be a path \(str or os.PathLike\), got 3 \(int\)"):
        NumpyReader(3, "train", 4, True)


def test_set_state_and_make_dataset_check_their_arguments_too(dataset):
    reader = NumpyReader(dataset, "train", 4, True)
    with pytest.raises(TypeError, match=r"start_step must be an integer, got 2\.5"):
        reader.set_state(2.5)
    from shardprep.train.data import reader as tf_reader

    for kwargs, error, message in [
            (dict(batch_size=2.5), TypeError, r"batch_size must be an integer, got 2\.5 \(float\)"),
            (dict(seed="1"), TypeError, r"seed must be an integer or None, got '1' \(str\)"),
            (dict(start_step=0.5), TypeError, r"start_step must be an integer"),
            (dict(shuffle_buffer=0), ValueError, "shuffle_buffer must be positive"),
            (dict(cycle_length=1.5), TypeError, "cycle_length must be an integer or None")]:
        arguments = dict(batch_size=4) | kwargs
        with pytest.raises(error, match=message):
            tf_reader.make_dataset(dataset, "train", arguments.pop("batch_size"), True, **arguments)


# ---- iterators ------------------------------------------------------------------------------------------------------

def test_a_second_iterator_while_one_is_active_is_refused(dataset):
    reader = NumpyReader(dataset, "train", 4, True, seed=0)
    first = iter(reader)
    next(first)
    with pytest.raises(RuntimeError, match="already has an active iterator"):
        iter(reader)
    with pytest.raises(RuntimeError, match="already has an active iterator"):
        list(zip(reader, range(2)))
    with pytest.raises(RuntimeError, match="while an iterator is active"):
        reader.set_state(0)
    assert reader.state().step == 1
    first.close()  # (or dropping it) ends it: the next iteration continues where it stopped
    uninterrupted = list(itertools.islice(NumpyReader(dataset, "train", 4, True, seed=0), 4))
    second = iter(reader)
    np.testing.assert_array_equal(next(second)[0], uninterrupted[1][0])
    del second
    for images, _ in reader:  # a for loop's iterator ends with the loop
        np.testing.assert_array_equal(images, uninterrupted[2][0])
        break
    np.testing.assert_array_equal(next(iter(reader))[0], uninterrupted[3][0])


def test_evaluation_passes_one_after_another_are_allowed(dataset):
    reader = NumpyReader(dataset, "validation", 4, False)
    first = [labels.tolist() for _, labels in reader]
    second = [labels.tolist() for _, labels in reader]
    assert first == second and len(first) == len(reader)


# ---- a dataset changed under a reader ---------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding, crop", LAYOUTS, ids=["-".join(layout) for layout in LAYOUTS])
@pytest.mark.parametrize("change", ["other_size", "same_size"])
def test_numpy_reader_notices_its_dataset_rebuilt(tmp_path, encoding, crop, change):
    root = write(tmp_path / "data", encoding=encoding, crop=crop)
    reader = NumpyReader(root, "train", 4, True, seed=0, prefetch=1, threads=1)
    batches = iter(reader)
    next(batches)
    rebuild(root, tmp_path, encoding=encoding, crop=crop, seed=2,
            size=(20, 16) if change == "other_size" else (12, 10))
    with pytest.raises(ValueError, match=r"changed since the reader opened it") as error:
        for _ in range(20):  # batches read ahead before the rebuild may still come
            _, labels = next(batches)
            assert labels.min() >= 0 and labels.max() < 3, labels  # never a garbage label
    assert root in str(error.value) and "open the dataset again" in str(error.value)


def test_numpy_reader_notices_a_rebuild_at_an_epoch_boundary_before_reading(tmp_path):
    root = write(tmp_path / "data")
    reader = NumpyReader(root, "validation", 4, False)
    assert len(list(reader)) == 3
    (tmp_path / "data" / manifest_lib.MANIFEST_NAME).write_text(
        (tmp_path / "data" / manifest_lib.MANIFEST_NAME).read_text())  # rewritten: a new manifest
    with pytest.raises(ValueError, match=r"manifest\.json changed since the reader opened it"):
        next(iter(reader))


def test_labels_outside_the_classes_are_an_error_naming_the_record(tmp_path):
    root = write(tmp_path / "data", classes=("a", "b", "c"))
    path = os.path.join(root, manifest_lib.MANIFEST_NAME)
    document = json.loads(open(path).read())
    document["classes"], document["num_classes"] = ["a", "b"], 2  # records labelled 2 are now outside
    for info in document["splits"].values():
        info["class_counts"]["a"] += info["class_counts"].pop("c")
    open(path, "w").write(manifest_lib.document_text(document))
    reader = NumpyReader(root, "validation", 9, False)
    with pytest.raises(ValueError, match=r"label 2 is outside 0\.\.1 .*validation/validation-0000\d-of-00003"
                                         r"\.tfrecord record \d"):
        next(iter(reader))
    from shardprep.train.data.numpy_reader import RecordDataset

    with pytest.raises(ValueError, match=r"label 2 is outside 0\.\.1"):
        RecordDataset(root, "validation")[8]  # shard 2 holds the records labelled 2


@pytest.mark.parametrize("random_access", [True, False], ids=["gathered", "streamed"])
def test_make_dataset_notices_its_dataset_rebuilt(tmp_path, random_access):
    import tensorflow as tf

    from shardprep.train.data import reader as tf_reader

    root = write(tmp_path / "data")
    batches = iter(tf_reader.make_dataset(root, "train", 4, True, seed=0, random_access=random_access))
    next(batches)
    rebuild(root, tmp_path, seed=2, size=(20, 16))
    # Each shard is checked as it is opened; the streamed reader's interleave may still open a shard it checked
    # just before the rebuild, and TensorFlow's fixed-length reader then stops on the new file's size, naming it
    # (another way of noticing: never a batch of the new records read as the old layout).
    noticed = r"changed since the reader opened it|outside 0\.\.2"
    if not random_access:
        noticed += r"|input file \S+ has body length \d+ bytes, which is not an exact multiple of the record length"
    with pytest.raises(tf.errors.OpError, match=noticed):
        for _ in range(200):
            _, labels = next(batches)
            assert labels.numpy().min() >= 0 and labels.numpy().max() < 3


def test_make_dataset_refuses_labels_outside_the_classes(tmp_path):
    import tensorflow as tf

    from shardprep.train.data import reader as tf_reader

    root = write(tmp_path / "data", classes=("a", "b", "c"))
    path = os.path.join(root, manifest_lib.MANIFEST_NAME)
    document = json.loads(open(path).read())
    document["classes"], document["num_classes"] = ["a", "b"], 2
    for info in document["splits"].values():
        info["class_counts"]["a"] += info["class_counts"].pop("c")
    open(path, "w").write(manifest_lib.document_text(document))
    for random_access in (True, False):
        with pytest.raises(tf.errors.OpError, match=r"outside 0\.\.1"):
            list(tf_reader.make_dataset(root, "validation", 9, False, random_access=random_access))
