"""Read strategy for fixed-layout shards read front to back (``gs://`` shards, ``random_access=False``): each shard
as chunks of ``record_bytes`` that start at a record's pixels, one ``decode_raw`` per batch."""

from __future__ import annotations

import tensorflow as tf

from shardprep.preprocess import record_format
from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.train.read_plan import ReadPlan
from shardprep.train.record_gather import MAX_VARINT_BYTES


def streamed_batches(plan: ReadPlan, layout: FixedLayout) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards, streamed through the shared order."""
    shards = tf.data.Dataset.from_tensor_slices((plan.files, tf.constant(plan.counts, tf.int64)))
    chunks = plan.ordered(shards, _chunk_reader(layout, plan.file_buffer_bytes))
    batches = chunks.batch(plan.batch_size, drop_remainder=plan.training, num_parallel_calls=tf.data.AUTOTUNE,
                           deterministic=plan.deterministic)
    return batches.map(_chunk_batch_decoder(layout), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=plan.deterministic)


def _chunk_reader(layout: FixedLayout, buffer_size: int):
    """(path, records) -> a dataset of the shard's records as chunks of ``record_bytes`` from each one's pixels."""
    record_bytes, image_offset = layout.record_bytes, layout.image_offset

    def open_file(path, num_records):
        chunks = tf.data.FixedLengthRecordDataset(path, record_bytes, header_bytes=image_offset,
                                                  buffer_size=buffer_size)
        # FixedLengthRecordDataset already fails on a file that is not header + k records; this names a file
        # holding another number of records than the manifest says.
        return chunks.apply(tf.data.experimental.assert_cardinality(num_records))

    return open_file


def _chunk_batch_decoder(layout: FixedLayout):
    height, width, channels = layout.height, layout.width, record_format.CHANNELS
    image_bytes = layout.image_bytes
    label_start = layout.label_offset - layout.image_offset
    shifts = tf.constant([7 * i for i in range(MAX_VARINT_BYTES)], tf.int64)

    def decode(chunks):
        pixels = tf.io.decode_raw(chunks, tf.uint8, fixed_length=image_bytes)
        images = tf.reshape(pixels, [-1, height, width, channels])
        images.set_shape([chunks.shape[0], height, width, channels])  # keep a static B
        # The label is a protobuf varint (7 bits a byte, low bits first, high bit set on all but the last byte).
        varint = tf.cast(tf.io.decode_raw(tf.strings.substr(chunks, label_start, MAX_VARINT_BYTES), tf.uint8,
                                          fixed_length=MAX_VARINT_BYTES), tf.int64)
        counted = tf.math.cumprod(tf.cast(varint >= 128, tf.int64), axis=1, exclusive=True)
        labels = tf.reduce_sum(tf.bitwise.left_shift(tf.bitwise.bitwise_and(varint, 127), shifts) * counted, axis=1)
        return images, tf.cast(labels, tf.int32)

    return decode
