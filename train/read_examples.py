"""Decoding shards of Examples in TensorFlow: ``verify_records=True``, datasets without a fixed record layout, JPEG
and ``crop: none`` shards, whether their records were gathered by random access (:func:`indexed_batches`, local
shards, the NumPy order) or streamed (:func:`example_batches`: ``TFRecordDataset`` through the tf.data order of
:class:`~shardprep.train.read_plan.ReadPlan`, for URLs and ``random_access=False``).

Raw centre crops (an encoding with a fixed layout) are parsed a batch at a time (``parse_example``); the other
layouts need one step per image:

* each image decoded by the manifest's encoding
  (:meth:`~shardprep.preprocess.encodings.Encoding.decode_tf`, the same pixels as the NumPy decoder that
  :class:`~shardprep.train.numpy_reader.NumpyReader` uses; JPEG: a whole-image decode, ``INTEGER_ACCURATE`` DCT);
  an encoding this version does not know is an ``UnknownEncodingError`` before anything is read;
* ``crop: none`` shards (shorter side resized, aspect kept): a square ``shorter_side`` crop, random in training and
  central in evaluation, so that images can be batched. Gathered reads take the crop positions from the NumPy
  order's draws; streamed reads from a seeded stream zipped alongside.
"""

from __future__ import annotations

import tensorflow as tf

from shardprep.preprocess import encodings, record_format
from shardprep.train.read_plan import ReadPlan


def example_batches(plan: ReadPlan, encoding: str, crop: str, side: int) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards streamed, each record parsed as an Example;
    ``side`` is the manifest's ``shorter_side``."""
    stored = encodings.get(encoding)
    shards = tf.data.Dataset.from_tensor_slices((plan.files, tf.constant(plan.counts, tf.int64)))
    buffer_size = plan.file_buffer_bytes
    records = plan.ordered(shards, lambda path, _: tf.data.TFRecordDataset(path, buffer_size=buffer_size))
    if stored.has_fixed_layout(crop):
        # Parallel batching: assembling a batch copies every record once, and one thread doing it all falls behind.
        batches = records.batch(plan.batch_size, drop_remainder=plan.training, num_parallel_calls=tf.data.AUTOTUNE,
                                deterministic=plan.deterministic)
        return batches.map(_raw_batch_decoder(plan.height, plan.width), num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=plan.deterministic)
    # One image at a time is unavoidable here (JPEG decode, or a crop of a variable-size image); the random crop
    # positions come from a seeded stream zipped alongside, so a seed still makes the batches repeatable.
    decode = _per_image_decoder(stored, crop, side, plan.height, plan.width, plan.training)
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


def indexed_batches(serialized: tf.data.Dataset, encoding: str, crop: str, side: int, height: int, width: int,
                    training: bool) -> tf.data.Dataset:
    """``(uint8 [b, H, W, 3], int32 [b])`` batches of ``(serialized Examples [b], crop draws [b, 2])`` read by random
    access (:func:`shardprep.train.read_gather.serialized_batches`): each batch decoded as it was gathered."""
    stored = encodings.get(encoding)
    if stored.has_fixed_layout(crop):
        decode_raw = _raw_batch_decoder(height, width)
        return serialized.map(lambda records, _: decode_raw(records), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True)
    decode = _per_image_decoder(stored, crop, side, height, width, training, _drawn_offsets)
    image_spec = (tf.TensorSpec([height, width, record_format.CHANNELS], tf.uint8), tf.TensorSpec([], tf.int32))

    def decode_batch(records, draws):
        images, labels = tf.map_fn(lambda element: decode(*element), (records, draws), fn_output_signature=image_spec,
                                   parallel_iterations=16)
        return images, labels

    return serialized.map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _seeded_offsets(spare, crop_seed):
    """Random (top, left) in ``[0, spare]`` from a stateless seed (the streamed reads' crops)."""
    offsets = tf.random.stateless_uniform([2], seed=crop_seed, maxval=tf.int32.max, dtype=tf.int32)
    return offsets % (spare + 1)


def _drawn_offsets(spare, draws):
    """(top, left) from the NumPy order's crop draws: ``draw % (spare + 1)``, as the NumPy reader computes them."""
    return tf.cast(draws % tf.cast(spare + 1, tf.int64), tf.int32)


def _per_image_decoder(stored: encodings.Encoding, crop: str, side: int, height: int, width: int, training: bool,
                       random_offsets=_seeded_offsets):
    spec = {
        record_format.ENCODED: tf.io.FixedLenFeature([], tf.string),
        record_format.LABEL: tf.io.FixedLenFeature([], tf.int64),
        record_format.HEIGHT: tf.io.FixedLenFeature([], tf.int64),
        record_format.WIDTH: tf.io.FixedLenFeature([], tf.int64),
    }

    def decode(serialized, crop_source):
        features = tf.io.parse_single_example(serialized, spec)
        encoded = features[record_format.ENCODED]
        stored_height = tf.cast(features[record_format.HEIGHT], tf.int32)
        stored_width = tf.cast(features[record_format.WIDTH], tf.int32)
        image = stored.decode_tf(encoded, stored_height, stored_width)
        if crop == "none":  # a side x side square: random in training, central otherwise
            spare = tf.stack([stored_height - side, stored_width - side])
            top_left = random_offsets(spare, crop_source) if training else spare // 2
            image = tf.slice(image, tf.concat([top_left, [0]], axis=0), [side, side, record_format.CHANNELS])
        image = tf.ensure_shape(image, [height, width, record_format.CHANNELS])
        return image, tf.cast(features[record_format.LABEL], tf.int32)

    return decode
