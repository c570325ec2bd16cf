"""Read strategy for shards read as TFRecords of Examples: ``verify_records=True``, datasets without a fixed record
layout, JPEG and ``crop: none`` shards.

Raw centre crops are parsed a batch at a time (``parse_example``); the other layouts need one step per image, run in
a parallel map before batching:

* ``jpeg`` shards: a decode per image; with ``crop: none`` it is ``decode_and_crop_jpeg``, which decodes only the
  crop window.
* ``crop: none`` shards (shorter side resized, aspect kept): a square ``shorter_side`` crop, random in training and
  central in evaluation, so that images can be batched.
"""

from __future__ import annotations

import tensorflow as tf

from shardprep.preprocess import record_format
from shardprep.train.read_plan import ReadPlan


def example_batches(plan: ReadPlan, encoding: str, crop: str, side: int) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards, each record parsed as an Example;
    ``side`` is the manifest's ``shorter_side``."""
    shards = tf.data.Dataset.from_tensor_slices((plan.files, tf.constant(plan.counts, tf.int64)))
    buffer_size = plan.file_buffer_bytes
    records = plan.ordered(shards, lambda path, _: tf.data.TFRecordDataset(path, buffer_size=buffer_size))
    if encoding == "raw" and crop == "center":
        # Parallel batching: assembling a batch copies every record once, and one thread doing it all falls behind.
        batches = records.batch(plan.batch_size, drop_remainder=plan.training, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=plan.deterministic)
        return batches.map(_raw_batch_decoder(plan.height, plan.width), num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=plan.deterministic)
    # One image at a time is unavoidable here (JPEG decode, or a crop of a variable-size image); the random crop
    # positions come from a seeded stream zipped alongside, so a seed still makes the batches repeatable.
    decode = _per_image_decoder(encoding, crop, side, plan.height, plan.width, plan.training)
    crop_seeds = tf.data.Dataset.random(seed=plan.seed).batch(2)
    images = tf.data.Dataset.zip(records, crop_seeds).map(
        decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=plan.deterministic)
    return images.batch(plan.batch_size, drop_remainder=plan.training, num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=plan.deterministic)


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
