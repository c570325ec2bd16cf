"""The training reader: prepared shards in, batches of uint8 images and int32 labels out, at almost no host cost.

The fast path (``raw`` shards, ``crop: center``) never touches one image at a time. Such shards have a fixed record
layout (``record_layout`` in the manifest, :class:`preprocess.record_format.FixedLayout`): every record is
``record_bytes`` long with its pixels at ``image_offset`` and its label's varint at ``label_offset``, and a shard
file is ``image_offset + N * record_bytes`` bytes. So where a record lies follows from its index, and for local
shards only the records' ids go through tf.data::

    shard indices -> shuffle (each epoch) -> parallel interleave of each shard's record ids -> shuffle buffer
      -> batch of ids -> gather: one preadv per record, straight into the batch (train.record_gather) -> prefetch

The kernel's copy out of the page cache is the only copy of the pixels: no TFRecord framing, no CRC pass, no protobuf
parsing, no intermediate strings (2.1x less host CPU per image than streaming the same shards, 3.4-3.6x less than
TFRecordDataset + ``parse_example``; BENCHMARKS.md). ``random_access=False`` (``shardprep train
--sequential-reads``), and shards behind a URL such as ``gs://``, stream each shard instead::

    shard files -> shuffle (each epoch) -> parallel interleave of FixedLengthRecordDatasets -> shuffle buffer
      -> batch -> decode_raw on the batch -> prefetch

Both go through the same shuffles, so for a seed they give the same batches. The shards' integrity is checked by
``shardprep validate`` (CRCs, the manifest's sha256 and every record's layout); a file whose size or record count
disagrees with the manifest still fails loudly. ``verify_records=True`` reads through TFRecordDataset and
``parse_example`` instead, checking every record's CRC; so do datasets written before the layout existed.

The reshape to ``[B, H, W, 3]`` is free. Augmentation and normalization are not done here: they are part of the model
(:mod:`train.augment`) so that they run batched on the accelerator and the host ships uint8 (4x fewer bytes than
float32).

The other layouts need one step per image, which runs in a parallel map before batching:

* ``jpeg`` shards: a decode per image; with ``crop: none`` it is ``decode_and_crop_jpeg``, which decodes only the
  crop window.
* ``crop: none`` shards (shorter side resized, aspect kept): a square ``shorter_side`` crop, random in training and
  central in evaluation, so that images can be batched.

Every dataset yields square-or-stored-size images of one shape, :func:`stored_image_shape`.
"""

from __future__ import annotations

import tensorflow as tf

from preprocess import manifest as manifest_lib
from preprocess import record_format
from train import record_gather

# Memory the shuffle buffer may hold by default; with 256x256 raw records (196 KiB) that is ~5,400 images.
SHUFFLE_BUFFER_BYTES = 1 << 30
MIN_SHUFFLE_BUFFER = 1024
MAX_SHUFFLE_BUFFER = 16384
# Files read at once: more files mix better; each open file costs one read buffer.
DEFAULT_CYCLE_LENGTH = 16
# Read buffer per open shard file, for remote files (gs://...), where fewer, larger reads pay. Local files are read
# unbuffered: a record (~200 KB for 256x256 raw) then goes from the file straight into its string, one copy less,
# which measured ~10% less CPU per image.
REMOTE_FILE_BUFFER_BYTES = 8 << 20


def load_manifest(data_dir: str) -> dict:
    """Reads ``data_dir/manifest.json`` through ``tf.io.gfile``, so local paths and ``gs://`` both work."""
    path = manifest_lib.join(data_dir, manifest_lib.MANIFEST_NAME)
    if not tf.io.gfile.exists(path):
        raise manifest_lib.missing_manifest_error(data_dir)
    with tf.io.gfile.GFile(path, "rb") as f:
        return manifest_lib.from_json(f.read())


def stored_image_shape(manifest: dict) -> tuple[int, int]:
    """(height, width) of the images :func:`make_dataset` yields for this dataset.

    ``crop: center`` datasets store one size; ``crop: none`` datasets keep the aspect ratio, and the reader cuts a
    ``shorter_side`` square out of each image.
    """
    if manifest["crop"] == "none":
        side = int(manifest["shorter_side"])
        return side, side
    return int(manifest["image_height"]), int(manifest["image_width"])


def split_size(manifest: dict, split: str) -> int:
    """Number of examples in ``split``."""
    manifest_lib.shard_files(manifest, split)  # raises a KeyError naming the known splits
    return int(manifest["splits"][split]["num_examples"])


def default_shuffle_buffer(manifest: dict, split: str) -> int:
    """Records the shuffle buffer holds by default: about 1 GiB of records, within [1024, 16384], at most the split."""
    info = manifest["splits"][split]
    num_examples = max(1, int(info["num_examples"]))
    total_bytes = sum(int(shard.get("num_bytes") or 0) for shard in info["shards"])
    height, width = stored_image_shape(manifest)
    record_bytes = total_bytes / num_examples if total_bytes else height * width * record_format.CHANNELS
    buffer = int(SHUFFLE_BUFFER_BYTES // max(1.0, record_bytes))
    return max(1, min(num_examples, max(MIN_SHUFFLE_BUFFER, min(MAX_SHUFFLE_BUFFER, buffer))))


def make_dataset(
    data_dir: str,
    split: str,
    batch_size: int,
    training: bool,
    seed: int | None = None,
    *,
    input_context: tf.distribute.InputContext | None = None,
    shuffle_buffer: int | None = None,
    cycle_length: int | None = None,
    deterministic: bool | None = None,
    manifest: dict | None = None,
    verify_records: bool = False,
    random_access: bool | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches from a prepared shardprep dataset.

    ``images`` is ``uint8 [B, H, W, 3]`` with ``(H, W) = stored_image_shape(manifest)``; ``labels`` is
    ``int32 [B]``, indices into ``manifest["classes"]``. Batches are prefetched and ready to ship to the device;
    crop, flip and normalization belong to the model (:mod:`train.augment`).

    Args:
      data_dir: dataset folder holding ``manifest.json`` (a local path or any ``tf.io.gfile`` URL, e.g. ``gs://``).
      split: a split of the manifest, e.g. ``"train"`` or ``"validation"``.
      batch_size: the global batch size. Under ``tf.distribute`` the dataset yields per-replica batches of
        ``input_context.get_per_replica_batch_size(batch_size)``.
      training: ``True``: shuffle the file order every epoch and the records through a buffer, repeat forever, drop
        the last partial batch, random square crops for ``crop: none`` data. ``False``: one pass in a fixed order,
        the last batch may be smaller, centre crops.
      seed: with a seed, training batches are deterministic (same seed, same batches, same crops); without one
        the reader may reorder records between parallel reads for speed.
      input_context: given by ``strategy.distribute_datasets_from_function``: each input pipeline (worker) reads
        only its share of the shard files (by record if there are fewer files than pipelines).
      shuffle_buffer: records in the shuffle buffer; default :func:`default_shuffle_buffer` (about 1 GiB).
      cycle_length: shard files read concurrently (default ``min(files, 16)``).
      deterministic: force (or forbid) deterministic element order; default: ``training`` and no seed -> not.
      manifest: the already loaded manifest, to skip reading it again.
      verify_records: read fixed-layout shards as TFRecords, checking every record's CRC (slower); other shards
        are always read that way.
      random_access: for fixed-layout shards, gather each batch's records straight from the files
        (:mod:`train.record_gather`) instead of streaming every shard through a read buffer. Default: on for local
        paths (needs ``os.preadv``), off for URLs. Both give the same batches; streaming reads each shard
        sequentially, which suits storage that is slow at random reads and not cached in memory.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    manifest = manifest if manifest is not None else load_manifest(data_dir)
    encoding, crop = manifest["encoding"], manifest["crop"]
    if encoding not in record_format.ENCODINGS:
        raise manifest_lib.ManifestError(f"unknown encoding {encoding!r} in manifest")
    if crop not in ("center", "none"):
        raise manifest_lib.ManifestError(f"unknown crop {crop!r} in manifest")
    files = [manifest_lib.join(data_dir, name) for name in manifest_lib.shard_files(manifest, split)]
    if not files:
        raise ValueError(f"split {split!r} of {data_dir} has no shards")
    layout = manifest["splits"][split].get("record_layout") if encoding == "raw" and crop == "center" else None
    if verify_records:
        layout = None
    counts = [int(entry["num_examples"]) for entry in manifest["splits"][split]["shards"]]
    if deterministic is None:
        deterministic = not training or seed is not None

    per_replica_batch = batch_size
    shard_records_by = None  # (num_pipelines, pipeline_id) when files are too few to give each pipeline its own
    if input_context is not None:
        per_replica_batch = input_context.get_per_replica_batch_size(batch_size)
        pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
        if pipelines > 1:
            if len(files) >= pipelines:
                files, counts = files[pipeline_id::pipelines], counts[pipeline_id::pipelines]
            else:
                shard_records_by = (pipelines, pipeline_id)

    remote = "://" in data_dir
    buffer_size = REMOTE_FILE_BUFFER_BYTES if remote else 0
    height, width = stored_image_shape(manifest)
    gather = None
    if layout is not None:
        # An empty shard (a split whose inputs were all rejected) is an empty file: no chunk to read.
        files, counts = [f for f, n in zip(files, counts) if n], [n for n in counts if n]
        if not files:
            raise ValueError(f"split {split!r} of {data_dir} has no examples")
        if random_access is None:
            random_access = not remote and record_gather.AVAILABLE
        if random_access:
            if remote:
                raise ValueError(f"random_access reads local shards only, not {data_dir}")
            record_gather.check_shard_sizes(files, counts, layout)
            gather = record_gather.FixedLayoutGather(files, layout, height, width)
        else:
            open_file = _fixed_layout_reader(layout, buffer_size)
    else:
        open_file = lambda path, _: tf.data.TFRecordDataset(path, buffer_size=buffer_size)  # noqa: E731

    if gather is not None:
        # The records' ids go through the same shuffles, interleave and sharding as the streamed records would, so
        # both ways give the same batches; only the ids are shuffled, the pixels are read once they are batched.
        records = tf.data.Dataset.from_tensor_slices((tf.range(len(files), dtype=tf.int64),
                                                     tf.constant(counts, tf.int64)))
        open_file = lambda shard, count: tf.data.Dataset.range(*record_gather.record_ids(shard, count))  # noqa: E731
    else:
        records = tf.data.Dataset.from_tensor_slices((files, tf.constant(counts, tf.int64)))
    if training:
        records = records.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
    records = records.interleave(
        open_file,
        cycle_length=min(len(files), cycle_length or DEFAULT_CYCLE_LENGTH),
        block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic,
    )
    if shard_records_by is not None:
        records = records.shard(*shard_records_by)
    if training:
        buffer = shuffle_buffer or default_shuffle_buffer(manifest, split)
        records = records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)

    if gather is not None:
        batches = records.batch(per_replica_batch, drop_remainder=training)
        batches = batches.map(_gathered_batch_reader(gather), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=deterministic)
    elif layout is not None:
        batches = records.batch(per_replica_batch, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=deterministic)
        batches = batches.map(_fixed_layout_batch_decoder(layout, height, width), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=deterministic)
    elif encoding == "raw" and crop == "center":
        # Parallel batching: assembling a batch copies every record once, and one thread doing it all falls behind.
        batches = records.batch(per_replica_batch, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=deterministic)
        batches = batches.map(_raw_batch_decoder(height, width), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=deterministic)
    else:
        # One image at a time is unavoidable here (JPEG decode, or a crop of a variable-size image); the random
        # crop positions come from a seeded stream zipped alongside, so a seed still makes the batches repeatable.
        decode = _per_image_decoder(encoding, crop, int(manifest["shorter_side"]), height, width, training)
        crop_seeds = tf.data.Dataset.random(seed=seed).batch(2)
        images = tf.data.Dataset.zip(records, crop_seeds).map(
            decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        batches = images.batch(per_replica_batch, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=deterministic)

    options = tf.data.Options()
    options.deterministic = deterministic
    if input_context is not None:
        # Sharded above, by file; stop tf.distribute from sharding again.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    else:
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return batches.with_options(options).prefetch(tf.data.AUTOTUNE)


def _fixed_layout_reader(layout: dict, buffer_size: int):
    """(path, records) -> a dataset of the shard's records as chunks of ``record_bytes`` from each one's pixels."""
    record_bytes, image_offset = int(layout["record_bytes"]), int(layout["image_offset"])

    def open_file(path, num_records):
        chunks = tf.data.FixedLengthRecordDataset(path, record_bytes, header_bytes=image_offset,
                                                  buffer_size=buffer_size)
        # FixedLengthRecordDataset already fails on a file that is not header + k records; this names a file
        # holding another number of records than the manifest says.
        return chunks.apply(tf.data.experimental.assert_cardinality(num_records))

    return open_file


def _gathered_batch_reader(gather: record_gather.FixedLayoutGather):
    def read(ids):
        # stateful=False: the same ids always read the same bytes.
        images, labels = tf.numpy_function(gather, [ids], [tf.uint8, tf.int32], stateful=False,
                                           name="gather_fixed_layout_records")
        images.set_shape([ids.shape[0], *gather.image_shape])  # keep a static B
        labels.set_shape([ids.shape[0]])
        return images, labels

    return read


def _fixed_layout_batch_decoder(layout: dict, height: int, width: int):
    image_bytes = height * width * record_format.CHANNELS
    label_start = int(layout["label_offset"]) - int(layout["image_offset"])
    shifts = tf.constant([7 * i for i in range(10)], tf.int64)

    def decode(chunks):
        pixels = tf.io.decode_raw(chunks, tf.uint8, fixed_length=image_bytes)
        images = tf.reshape(pixels, [-1, height, width, record_format.CHANNELS])
        images.set_shape([chunks.shape[0], height, width, record_format.CHANNELS])  # keep a static B
        # The label is a protobuf varint (7 bits a byte, low bits first, high bit set on all but the last byte).
        varint = tf.cast(tf.io.decode_raw(tf.strings.substr(chunks, label_start, 10), tf.uint8, fixed_length=10),
                         tf.int64)
        counted = tf.math.cumprod(tf.cast(varint >= 128, tf.int64), axis=1, exclusive=True)
        labels = tf.reduce_sum(tf.bitwise.left_shift(tf.bitwise.bitwise_and(varint, 127), shifts) * counted, axis=1)
        return images, tf.cast(labels, tf.int32)

    return decode


def _raw_batch_decoder(height: int, width: int):
    spec = {
        record_format.ENCODED: tf.io.FixedLenFeature([], tf.string),
        record_format.LABEL: tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(serialized_batch):
        features = tf.io.parse_example(serialized_batch, spec)
        pixels = tf.io.decode_raw(features[record_format.ENCODED], tf.uint8)
        images = tf.reshape(pixels, [-1, height, width, record_format.CHANNELS])
        images.set_shape([serialized_batch.shape[0], height, width, record_format.CHANNELS])  # keep a static B
        return images, tf.cast(features[record_format.LABEL], tf.int32)

    return decode


def _per_image_decoder(encoding: str, crop: str, side: int, height: int, width: int, training: bool):
    spec = {
        record_format.ENCODED: tf.io.FixedLenFeature([], tf.string),
        record_format.LABEL: tf.io.FixedLenFeature([], tf.int64),
        record_format.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        record_format.WIDTH: tf.io.FixedLenFeature([], tf.int64),
    }

    def crop_window(stored_height, stored_width, crop_seed):
        """(top, left) of the ``side`` x ``side`` square: random in training, central otherwise."""
        spare = tf.stack([stored_height - side, stored_width - side])
        if training:
            offsets = tf.random.stateless_uniform([2], seed=crop_seed, maxval=tf.int32.max, dtype=tf.int32)
            return offsets % (spare + 1)
        return spare // 2

    def decode(serialized, crop_seed):
        features = tf.io.parse_single_example(serialized, spec)
        encoded = features[record_format.ENCODED]
        stored_height = tf.cast(features[record_format.HEIGHT], tf.int32)
        stored_width = tf.cast(features[record_format.WIDTH], tf.int32)
        if crop == "none":
            top_left = crop_window(stored_height, stored_width, crop_seed)
            if encoding == "jpeg":
                window = tf.concat([top_left, [side, side]], axis=0)
                image = tf.io.decode_and_crop_jpeg(encoded, window, channels=record_format.CHANNELS)
            else:
                image = tf.reshape(tf.io.decode_raw(encoded, tf.uint8),
                                   [stored_height, stored_width, record_format.CHANNELS])
                image = tf.slice(image, tf.concat([top_left, [0]], axis=0), [side, side, record_format.CHANNELS])
        else:  # a centre-cropped JPEG: the whole stored image is the crop
            image = tf.io.decode_jpeg(encoded, channels=record_format.CHANNELS)
        image = tf.ensure_shape(image, [height, width, record_format.CHANNELS])
        return image, tf.cast(features[record_format.LABEL], tf.int32)

    return decode
