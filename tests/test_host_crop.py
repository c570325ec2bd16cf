"""Host crops (``shardprep.train.data.host_crop``): random windows and flips in NumPy for loops without augmentation on
the accelerator; the same windows for the same seed whatever the batch size, in ``NumpyReader`` and in a
``RecordDataset`` fed by ``EpochSampler(crops=True)``, and a resumed reader cuts what the uninterrupted one cut."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from shardprep.train.data import host_crop
from shardprep.train.data.numpy_reader import NumpyReader
from shardprep.train.data.numpy_reader import EpochSampler, RecordDataset
from train_helpers import random_images, write_dataset

SIDE, CROP = 12, 8


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("host-crop")
    write_dataset(root, {"train": random_images(24, SIDE, SIDE, seed=1, labels=(0, 1, 2)),
                         "validation": random_images(7, SIDE, SIDE, seed=2, labels=(0, 1, 2))},
                  classes=["a", "b", "c"], num_shards=3)
    return str(root)


def windows_of(image: np.ndarray) -> list[np.ndarray]:
    """Every CROP window of ``image``, plain and mirrored."""
    found = []
    for top in range(SIDE - CROP + 1):
        for left in range(SIDE - CROP + 1):
            window = image[top:top + CROP, left:left + CROP]
            found += [window, window[:, ::-1]]
    return found


def test_crop_flip_cuts_the_drawn_window_and_mirrors_odd_flip_draws():
    images = np.arange(2 * 6 * 7 * 3, dtype=np.uint8).reshape(2, 6, 7, 3)
    draws = np.array([[5, 9, 2], [1, 2, 7]])  # tops 5 % 3 = 2 and 1; lefts 9 % 4 = 1 and 2; flips 0 and 1
    cut = host_crop.crop_flip(images, 4, draws)
    np.testing.assert_array_equal(cut[0], images[0, 2:6, 1:5])
    np.testing.assert_array_equal(cut[1], images[1, 1:5, 2:6][:, ::-1])
    np.testing.assert_array_equal(host_crop.crop_flip(images, 4), images[:, 1:5, 1:5])  # central, unflipped
    with pytest.raises(ValueError, match="crop_size 7 does not fit the stored 6x7 images: give at most 6"):
        host_crop.crop_flip(images, 7, draws)


def test_window_draws_depend_on_seed_epoch_and_position_only():
    draws = host_crop.window_draws(3, 1, np.arange(1000))
    assert draws.shape == (1000, 3) and draws.min() >= 0 and draws.max() < 2 ** 31
    np.testing.assert_array_equal(host_crop.window_draws(3, 1, [7, 500]), draws[[7, 500]])
    assert not np.array_equal(host_crop.window_draws(4, 1, np.arange(1000)), draws)
    assert not np.array_equal(host_crop.window_draws(3, 2, np.arange(1000)), draws)
    flips = draws[:, 2] & 1
    assert 400 < flips.sum() < 600  # about half mirrored
    assert len(set((draws[:, 0] % 5).tolist())) == 5  # every position drawn


def test_numpy_reader_crops_are_windows_of_the_stored_images_and_resume_exactly(dataset):
    stored = NumpyReader(dataset, "train", 4, True, seed=9)
    cropped = NumpyReader(dataset, "train", 4, True, seed=9, crop_size=CROP)
    assert cropped.image_shape == (CROP, CROP, 3)
    batches = [(images.copy(), labels.copy()) for images, labels in itertools.islice(cropped, 14)]  # 2+ epochs
    flips = 0
    for (images, labels), (full, full_labels) in zip(batches, itertools.islice(stored, 14)):
        np.testing.assert_array_equal(labels, full_labels)
        for image, original in zip(images, full):
            matches = [k for k, window in enumerate(windows_of(original)) if np.array_equal(window, image)]
            assert matches, "a crop that is no window of its image"
            flips += matches[0] % 2
    assert 0 < flips < 14 * 4
    resumed = NumpyReader(dataset, "train", 4, True, seed=9, crop_size=CROP, start_step=9)
    for (images, labels), (again, again_labels) in zip(batches[9:], itertools.islice(resumed, 5)):
        np.testing.assert_array_equal(images, again)
        np.testing.assert_array_equal(labels, again_labels)
    other_seed = NumpyReader(dataset, "train", 4, True, seed=10, crop_size=CROP)
    assert not all(np.array_equal(a, b[0]) for (a, _), b in zip(batches, itertools.islice(other_seed, 14)))


def test_evaluation_crops_are_central(dataset):
    full = next(iter(NumpyReader(dataset, "validation", 7, False)))[0]
    cropped = next(iter(NumpyReader(dataset, "validation", 7, False, crop_size=CROP)))[0]
    margin = (SIDE - CROP) // 2
    np.testing.assert_array_equal(cropped, full[:, margin:margin + CROP, margin:margin + CROP])
    with pytest.raises(ValueError, match="crop_size 13 does not fit the stored 12x12 images"):
        NumpyReader(dataset, "validation", 7, False, crop_size=13)


@pytest.mark.parametrize("epoch", [0, 1])
def test_record_dataset_with_epoch_sampler_crops_cuts_numpy_reader_s_windows(dataset, epoch):
    records = RecordDataset(dataset, "train", crop_size=CROP)
    sampler = EpochSampler(records, training=True, seed=9, crops=True)
    sampler.set_epoch(epoch)
    items = [records[item] for item in sampler]
    reader = NumpyReader(dataset, "train", 4, True, seed=9, crop_size=CROP, start_step=epoch * 6)
    for step, (images, labels) in enumerate(itertools.islice(reader, 6)):
        np.testing.assert_array_equal(np.stack([image for image, _ in items[step * 4:step * 4 + 4]]), images)
        assert [label for _, label in items[step * 4:step * 4 + 4]] == labels.tolist()
    central = RecordDataset(dataset, "train", crop_size=CROP)[0][0]
    np.testing.assert_array_equal(central, RecordDataset(dataset, "train")[0][0][2:10, 2:10])
