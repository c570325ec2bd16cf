"""The tf.data training reader: shapes, dtypes, labels, pixels, crops, determinism, sharding, URLs."""

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from shardprep.preprocess.format import encodings
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.train.data import reader
from train_helpers import random_images, write_dataset

CLASSES = ["cat", "dog", "eel"]


def _take(dataset, batches):
    return [(images.numpy(), labels.numpy()) for images, labels in dataset.take(batches)]


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("raw")
    splits = {"train": random_images(40, 12, 10, seed=1, labels=(0, 1, 2)),
              "validation": random_images(13, 12, 10, seed=2, labels=(0, 1, 2))}
    write_dataset(root, splits, classes=CLASSES, num_shards=3)
    return str(root), splits


def _index(items):
    """{image bytes: label} for every stored image."""
    return {pixels.tobytes(): label for pixels, label in items}


def test_training_batches_have_stored_shape_dtype_and_matching_labels(raw_dataset):
    root, splits = raw_dataset
    stored = _index(splits["train"])
    dataset = reader.make_dataset(root, "train", batch_size=8, training=True, seed=3)
    assert dataset.element_spec[0].shape.as_list() == [8, 12, 10, 3]
    assert dataset.element_spec[0].dtype == tf.uint8
    assert dataset.element_spec[1].dtype == tf.int32
    seen = set()
    for images, labels in _take(dataset, 10):  # 80 images: the 40-image split repeats
        assert images.shape == (8, 12, 10, 3) and labels.shape == (8,)
        for image, label in zip(images, labels):
            assert stored[image.tobytes()] == label
            seen.add(image.tobytes())
    assert seen == set(stored)


def test_eval_is_one_ordered_pass_with_a_partial_last_batch(raw_dataset):
    root, splits = raw_dataset
    stored = _index(splits["validation"])
    batches = _take(reader.make_dataset(root, "validation", batch_size=5, training=False), 100)
    assert [len(labels) for _, labels in batches] == [5, 5, 3]
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert sorted(image.tobytes() for image in images) == sorted(stored)
    assert all(stored[image.tobytes()] == label for image, label in zip(images, labels))
    again = _take(reader.make_dataset(root, "validation", batch_size=5, training=False), 100)
    np.testing.assert_array_equal(np.concatenate([b[0] for b in again]), images)


def test_same_seed_gives_same_batches_and_another_seed_another_order(raw_dataset):
    root, _ = raw_dataset
    first = _take(reader.make_dataset(root, "train", 8, training=True, seed=7), 12)
    second = _take(reader.make_dataset(root, "train", 8, training=True, seed=7), 12)
    other = _take(reader.make_dataset(root, "train", 8, training=True, seed=8), 12)
    for (a_images, a_labels), (b_images, b_labels) in zip(first, second):
        np.testing.assert_array_equal(a_images, b_images)
        np.testing.assert_array_equal(a_labels, b_labels)
    assert any(not np.array_equal(a[1], c[1]) for a, c in zip(first, other))
    # Each epoch is reshuffled: the second pass over the 40 images is in another order.
    epoch_1 = np.concatenate([labels for _, labels in first[:5]])
    epoch_2 = np.concatenate([labels for _, labels in first[5:10]])
    assert not np.array_equal(epoch_1, epoch_2)


def test_input_pipelines_read_disjoint_files_and_per_replica_batches(raw_dataset):
    root, splits = raw_dataset
    shares = []
    for pipeline_id in range(3):
        context = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=6)
        dataset = reader.make_dataset(root, "validation", batch_size=12, training=False, input_context=context)
        batches = _take(dataset, 100)
        assert max(len(labels) for _, labels in batches) == 2  # 12 global / 6 replicas
        shares.append({image.tobytes() for images, _ in batches for image in images})
    assert not (shares[0] & shares[1]) and not (shares[1] & shares[2]) and not (shares[0] & shares[2])
    assert set().union(*shares) == set(_index(splits["validation"]))


def test_more_pipelines_than_files_shard_by_record(raw_dataset):
    root, splits = raw_dataset
    shares = []
    for pipeline_id in range(4):  # the split has 3 files
        context = tf.distribute.InputContext(num_input_pipelines=4, input_pipeline_id=pipeline_id,
                                             num_replicas_in_sync=4)
        batches = _take(reader.make_dataset(root, "validation", 4, training=False, input_context=context), 100)
        shares.append([image.tobytes() for images, _ in batches for image in images])
    flat = [image for share in shares for image in share]
    assert len(flat) == len(set(flat)) == 13


@pytest.mark.parametrize("num_classes", [3, 300, 20000])  # labels are 1-, 2- and 3-byte varints
def test_fixed_layout_records_read_as_the_tfrecords_do(tmp_path, num_classes):
    # Filenames of varied lengths (and non-ASCII) make the padding differ from record to record.
    items = random_images(23, 6, 5, seed=4, labels=(0, num_classes - 1, num_classes // 2, 1))
    write_dataset(tmp_path, {"train": items}, classes=[f"c{i}" for i in range(num_classes)], num_shards=3,
                  filename=lambda split, index: f"{split}/{'é' * (index % 7)}{index}.jpg")
    manifest = reader.load_manifest(str(tmp_path))
    assert manifest.split("train").record_layout is not None
    stored = _index(items)
    for kwargs in (dict(training=False), dict(training=True, seed=5)):
        gathered = _take(reader.make_dataset(str(tmp_path), "train", 4, random_access=True, **kwargs), 12)
        checked = _take(reader.make_dataset(str(tmp_path), "train", 4, verify_records=True, **kwargs), 12)
        # Streamed reads follow tf.data's shuffles: the same records and labels, in another order.
        streamed = _take(reader.make_dataset(str(tmp_path), "train", 4, random_access=False, **kwargs), 12)
        assert len(gathered) == len(streamed) == len(checked) == (6 if not kwargs["training"] else 12)
        for (images, labels), (checked_images, checked_labels) in zip(gathered, checked):
            np.testing.assert_array_equal(images, checked_images)
            np.testing.assert_array_equal(labels, checked_labels)
            assert [stored[image.tobytes()] for image in images] == labels.tolist()
        for images, labels in streamed:
            assert [stored[image.tobytes()] for image in images] == labels.tolist()
        if not kwargs["training"]:
            assert sorted(image.tobytes() for images, _ in streamed for image in images) == sorted(stored)


def test_datasets_without_a_record_layout_are_read_as_tfrecords(tmp_path):
    items = random_images(9, 6, 5, seed=6, labels=(0, 1))
    manifest = write_dataset(tmp_path, {"train": items}, classes=["a", "b"], fixed_layout=False)
    assert "record_layout" not in manifest["splits"]["train"]
    batches = _take(reader.make_dataset(str(tmp_path), "train", 9, training=False), 2)
    assert sorted(image.tobytes() for image in batches[0][0]) == sorted(_index(items))


@pytest.mark.parametrize("random_access", [True, False])
@pytest.mark.parametrize("cut", ["one record", "five bytes"])
def test_a_shard_that_disagrees_with_the_manifest_fails_loudly(tmp_path, cut, random_access):
    items = random_images(12, 6, 5, seed=7, labels=(0, 1))
    manifest = write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=2)
    path = tmp_path / manifest["splits"]["train"]["shards"][1]["file"]
    data = path.read_bytes()
    path.write_bytes(data[:-manifest["splits"]["train"]["record_layout"]["record_bytes"]] if cut == "one record"
                     else data[:-5])
    # File sizes are checked against the manifest when the dataset is made, streamed or not.
    with pytest.raises(ValueError, match=f"{path.name}: {path.stat().st_size:,} bytes, the manifest says "
                                         f"{len(data):,}"):
        reader.make_dataset(str(tmp_path), "train", 4, training=False, random_access=random_access)


def test_a_shard_cut_after_the_dataset_was_made_fails_loudly(tmp_path):
    items = random_images(12, 6, 5, seed=7, labels=(0, 1))
    manifest = write_dataset(tmp_path, {"train": items}, classes=["a", "b"], num_shards=2)
    dataset = reader.make_dataset(str(tmp_path), "train", 4, training=False, random_access=True)
    path = tmp_path / manifest["splits"]["train"]["shards"][1]["file"]
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-manifest["splits"]["train"]["record_layout"]["record_bytes"]])
    with pytest.raises(tf.errors.OpError, match=f"{path.name} changed since the reader opened it "
                                                f"\\({size:,} bytes then, {path.stat().st_size:,} now\\)"):
        _take(dataset, 10)


def test_random_access_is_the_default_for_local_shards_and_refused_for_urls(raw_dataset, monkeypatch):
    from shardprep.train.data import record_gather

    made = []
    gather = record_gather.FixedLayoutGather
    monkeypatch.setattr(record_gather, "FixedLayoutGather", lambda *args, **kwargs: made.append(1) or gather(
        *args, **kwargs))
    root, _ = raw_dataset
    reader.make_dataset(root, "train", 4, training=True)
    assert made == [1]
    reader.make_dataset(root, "train", 4, training=True, random_access=False)
    reader.make_dataset(root, "train", 4, training=True, verify_records=True)
    assert made == [1]
    with pytest.raises(ValueError, match="random_access reads local shards only"):
        reader.make_dataset("ram://somewhere", "train", 4, training=True, random_access=True,
                            manifest=reader.load_manifest(root))


def test_center_crop_jpeg_shards_decode_to_the_stored_image(tmp_path):
    smooth = [(np.tile(np.linspace(0, 255, 16, dtype=np.uint8)[:, None, None], (1, 16, 3)) // (k + 1), k % 2)
              for k in range(6)]
    write_dataset(tmp_path, {"validation": smooth}, classes=["a", "b"], encoding="jpeg", num_shards=2)
    batches = _take(reader.make_dataset(str(tmp_path), "validation", 4, training=False), 10)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert images.shape == (6, 16, 16, 3) and images.dtype == np.uint8
    for image, label in zip(images, labels):
        # JPEG is lossy: find the stored image it is closest to, and check the label came with it.
        distances = [np.abs(image.astype(int) - pixels.astype(int)).mean() for pixels, _ in smooth]
        best = int(np.argmin(distances))
        assert distances[best] < 3 and smooth[best][1] == label


@pytest.mark.parametrize("encoding", ["raw", "jpeg"])
def test_crop_none_shards_give_square_crops_inside_each_image(tmp_path, encoding):
    # Images of different aspect ratios, shorter side 8, each pixel's value says its column (red) and row (green),
    # blue holds the image number, so a crop reveals where it came from.
    items = []
    for k, (height, width) in enumerate([(8, 14), (12, 8), (8, 8), (8, 20)]):
        rows, cols = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
        pixels = np.stack([cols * 12, rows * 12, np.full_like(rows, k * 60)], axis=-1).astype(np.uint8)
        items.append((pixels, k % 2))
    write_dataset(tmp_path, {"train": items, "validation": items}, classes=["a", "b"], encoding=encoding,
                  crop="none", shorter_side=8, num_shards=1, jpeg_quality=100)
    if encoding == "raw":
        references, tolerance = [pixels for pixels, _ in items], 0
    else:  # a full decode of each stored JPEG (the helper encodes deterministically); steps of 12 tell shifts apart
        references, tolerance = [], 10  # cropped decoding upsamples chroma differently at the edges
        for pixels, _ in items:
            stored = encodings.get("jpeg").encode(Image.fromarray(pixels), 100)  # as the helper stores it
            references.append(tf.io.decode_jpeg(stored, channels=3).numpy())

    def locate(image):
        """(image number, its label, top, left) of the in-bounds 8x8 window that ``image`` is."""
        k = int(round(image[..., 2].mean() / 60))
        reference = references[k].astype(int)
        errors = {(top, left): np.abs(reference[top:top + 8, left:left + 8] - image.astype(int)).max()
                  for top in range(reference.shape[0] - 7) for left in range(reference.shape[1] - 7)}
        (top, left), error = min(errors.items(), key=lambda item: item[1])
        assert error <= tolerance
        return k, items[k][1], top, left

    evaluated = _take(reader.make_dataset(str(tmp_path), "validation", 4, training=False), 1)[0]
    assert evaluated[0].shape == (4, 8, 8, 3)
    centres = {}
    for image, label in zip(*evaluated):
        k, stored_label, top, left = locate(image)
        assert stored_label == label
        centres[k] = (top, left)
    assert centres == {0: (0, 3), 1: (2, 0), 2: (0, 0), 3: (0, 6)}

    offsets = set()
    for images, labels in _take(reader.make_dataset(str(tmp_path), "train", 4, training=True, seed=1), 12):
        for image, label in zip(images, labels):
            k, stored_label, top, left = locate(image)
            assert stored_label == label
            offsets.add((k, top, left))
    assert len({o for o in offsets if o[0] == 3}) > 2  # random positions, not always the centre


def test_crop_none_training_crops_repeat_with_the_seed(tmp_path):
    items = random_images(6, 8, 16, seed=4)
    write_dataset(tmp_path, {"train": items}, classes=["a", "b"], crop="none", shorter_side=8, num_shards=2)
    first = _take(reader.make_dataset(str(tmp_path), "train", 3, training=True, seed=5), 6)
    second = _take(reader.make_dataset(str(tmp_path), "train", 3, training=True, seed=5), 6)
    for (a, _), (b, _) in zip(first, second):
        np.testing.assert_array_equal(a, b)


def test_reads_through_a_tf_filesystem_url(raw_dataset):
    # ram:// goes through the same tf.io.gfile / TFRecordDataset code path as gs://.
    root, splits = raw_dataset
    url = "ram://shardprep-reader-test"
    for path in tf.io.gfile.glob(f"{root}/*") + tf.io.gfile.glob(f"{root}/*/*"):
        if not tf.io.gfile.isdir(path):
            relative = path[len(root) + 1:]
            tf.io.gfile.makedirs(manifest_lib.join(url, relative.rpartition("/")[0]) if "/" in relative else url)
            tf.io.gfile.copy(path, manifest_lib.join(url, relative), overwrite=True)
    batches = _take(reader.make_dataset(url, "validation", 13, training=False), 1)
    assert sorted(image.tobytes() for image in batches[0][0]) == sorted(_index(splits["validation"]))


def test_missing_manifest_and_unknown_split_are_explained(tmp_path, raw_dataset):
    with pytest.raises(manifest_lib.ManifestError, match="is an empty folder, not a prepared dataset"):
        reader.make_dataset(str(tmp_path), "train", 4, training=True)
    with pytest.raises(KeyError, match="splits: train, validation"):
        reader.make_dataset(raw_dataset[0], "test", 4, training=False)


def test_default_shuffle_buffer_is_about_a_gibibyte_of_records_within_the_split():
    def split(n, num_bytes):  # a well-formed split: the reader reads the manifest as a typed Manifest
        return {"num_examples": n, "class_counts": {"a": n},
                "shards": [{"file": "s.tfrecord", "num_examples": n, "num_bytes": num_bytes}]}

    manifest = {"format_version": 1, "classes": ["a"], "encoding": "jpeg", "shorter_side": 256, "crop": "center",
                "image_height": 256, "image_width": 256, "splits": {
                    "train": split(100_000, 100_000 * (256 * 256 * 3 + 80)), "tiny": split(10, 10 * 200_000)}}
    assert reader.default_shuffle_buffer(manifest, "train") == (1 << 30) // (256 * 256 * 3 + 80)
    assert reader.default_shuffle_buffer(manifest, "tiny") == 10


def test_eval_batch_through_the_model_input_layer_is_the_stored_centre_crop(raw_dataset):
    from shardprep.train.model.augment import CropFlipNormalize

    root, splits = raw_dataset
    stored = {pixels.tobytes(): pixels for pixels, _ in splits["validation"]}
    layer = CropFlipNormalize(8, mean_rgb=[0, 0, 0], std_rgb=[1, 1, 1])
    for images, labels in _take(reader.make_dataset(root, "validation", 5, training=False), 100):
        cropped = layer(tf.constant(images), training=False).numpy()
        for image, crop in zip(images, cropped):
            np.testing.assert_array_equal(crop, stored[image.tobytes()][2:10, 1:9].astype(np.float32))


def test_a_process_exits_while_its_example_reads_run(tensorflow_child):
    # Serialized Examples are read by Python on tf.data's threads: the exit hook must cover them as it does gathers.
    # One process, both layouts read that way (JPEG centre crops, raw uncropped), both iterators still reading at exit
    # (the child, shared with test_first_hour.py: tensorflow_child.py).
    done = tensorflow_child
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout_lines[0] == "42" and done.stdout_lines[-1] == "read"  # every reader read, then it exited


def test_start_step_and_small_splits_are_checked(raw_dataset):
    root, _ = raw_dataset
    with pytest.raises(ValueError, match="start_step must be >= 0"):
        reader.make_dataset(root, "train", 4, training=True, start_step=-1)
    with pytest.raises(ValueError, match="records make no training batch of 41"):
        reader.make_dataset(root, "train", 41, training=True)
    with pytest.raises(ValueError, match=r"start_step must be in \[0, 3\] in evaluation"):
        reader.make_dataset(root, "validation", 5, training=False, start_step=4)
    # An evaluation pass started at a step is the rest of the pass.
    full = _take(reader.make_dataset(root, "validation", 5, training=False), 10)
    tail = _take(reader.make_dataset(root, "validation", 5, training=False, start_step=1), 10)
    assert len(tail) == 2
    for (images, labels), (tail_images, tail_labels) in zip(full[1:], tail):
        np.testing.assert_array_equal(images, tail_images)
        np.testing.assert_array_equal(labels, tail_labels)


@pytest.mark.parametrize("encoding,record", [("raw", 2), ("raw", 5), ("jpeg", 5)])  # record 5 ends its shard
def test_verify_records_finds_a_flipped_byte_that_plain_reads_pass_over(tmp_path, encoding, record):
    items = random_images(12, 6, 5, seed=8, labels=(0, 1))
    manifest = write_dataset(tmp_path, {"train": items}, classes=["a", "b"], encoding=encoding, num_shards=2)
    path = tmp_path / manifest["splits"]["train"]["shards"][1]["file"]
    data = bytearray(path.read_bytes())
    layout = manifest["splits"]["train"].get("record_layout")
    # A byte inside the record's data that plain reads do not notice: a pixel (raw), a filename's digit (JPEG).
    starts = [0]
    while starts[-1] < len(data):
        starts.append(starts[-1] + 16 + int.from_bytes(data[starts[-1]:starts[-1] + 8], "little"))
    where = (starts[record] + layout["image_offset"] + 7) if layout else data.index(b".png", starts[record]) - 1
    data[where] ^= 0x01
    path.write_bytes(bytes(data))
    assert len(_take(reader.make_dataset(str(tmp_path), "train", 4, training=False), 10)) == 3
    with pytest.raises(tf.errors.OpError, match=f"{path.name}: record {record} .*data checksum mismatch"):
        _take(reader.make_dataset(str(tmp_path), "train", 4, training=False, verify_records=True), 10)
