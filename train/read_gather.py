"""Random-access read strategies for local shards: the global step goes through tf.data, and each step's records,
chosen by the NumPy order (:mod:`shardprep.train.record_order`), are then read straight into the batch.

    global steps (start_step, start_step + 1, ...) -> records of the step (RecordOrder.batch_ids)
      -> gather: one preadv per record into the batch (fixed layout, :mod:`shardprep.train.record_gather`)
         or: one pread per serialized Example, decoded in TensorFlow (:mod:`shardprep.train.read_examples`)
      -> prefetch

Because a step's records follow from (seed, epoch, batch) alone, starting at ``start_step`` reads nothing before it.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.train import record_gather
from shardprep.train.batch_sources import FixedLayoutSource
from shardprep.train.record_identity import DatasetSnapshot
from shardprep.train.record_index import ExampleGather
from shardprep.train.record_order import RecordOrder


def steps(order: RecordOrder, start_step: int) -> tf.data.Dataset:
    """The global steps to read: endless in training, the rest of the pass in evaluation."""
    if order.training:
        return tf.data.Dataset.counter(start_step, dtype=tf.int64)
    if not 0 <= start_step <= len(order):
        raise ValueError(f"start_step must be in [0, {len(order)}] in evaluation, got {start_step}")
    return tf.data.Dataset.range(start_step, len(order), dtype=tf.int64)


def gathered_batches(order: RecordOrder, paths, counts, layout: FixedLayout, start_step: int,
                     verify: bool = False, snapshot: DatasetSnapshot | None = None,
                     num_classes: int | None = None) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of local fixed-layout shards whose sizes match ``layout`` and the
    manifest's counts (checked here); ``verify`` checks every record's CRCs as it is gathered; ``snapshot`` and
    ``num_classes``: as :class:`~shardprep.train.batch_sources.FixedLayoutSource`'s, the snapshot also checked in
    full at each epoch's first step."""
    source = FixedLayoutSource(paths, counts, layout, verify=verify, snapshot=snapshot, num_classes=num_classes)
    gather = source.gather

    def read_step(step):
        _check_at_epoch_start(snapshot, order, step)
        return source(order.batch_ids(step))

    # Python on tf.data's threads: guarded, so that a process exiting while the dataset is alive does not hang.
    read_step = record_gather.guarded(read_step, lambda _: (np.zeros((0, *gather.image_shape), np.uint8),
                                                            np.zeros(0, np.int32)))

    def read(step):
        # stateful=False: the same step always reads the same bytes.
        images, labels = tf.numpy_function(read_step, [step], [tf.uint8, tf.int32], stateful=False,
                                           name="gather_fixed_layout_records")
        batch = order.batch_size if order.training else None  # keep a static B where there is one
        images.set_shape([batch, *gather.image_shape])
        labels.set_shape([batch])
        return images, labels

    return steps(order, start_step).map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _check_at_epoch_start(snapshot: DatasetSnapshot | None, order: RecordOrder, step) -> None:
    if snapshot is not None and int(step) % order.steps_per_epoch == 0:
        snapshot.check()


def serialized_batches(order: RecordOrder, paths, counts, verify: bool, start_step: int,
                       snapshot: DatasetSnapshot | None = None) -> tf.data.Dataset:
    """``(serialized Examples [b], crop draws int64 [b, 2])`` per step, read by random access; ``verify`` checks
    every record's CRCs as it is read; every shard read is checked against ``snapshot``, in full at each epoch's
    first step."""
    examples = ExampleGather(paths, counts, verify=verify, snapshot=snapshot)
    crops = order.training

    def read_step(step):
        _check_at_epoch_start(snapshot, order, step)
        serialized = np.array(examples(order.batch_ids(step)), dtype=object)
        draws = order.crop_draws(step) if crops else np.zeros((len(serialized), 2), np.int64)
        return serialized, draws

    # Python on tf.data's threads: guarded, so that a process exiting while the dataset is alive does not hang.
    read_guarded = record_gather.guarded(read_step, lambda _: (np.zeros(0, object), np.zeros((0, 2), np.int64)))

    def read(step):
        serialized, draws = tf.numpy_function(read_guarded, [step], [tf.string, tf.int64], stateful=False,
                                              name="gather_serialized_records")
        batch = order.batch_size if order.training else None
        serialized.set_shape([batch])
        draws.set_shape([batch, 2])
        return serialized, draws

    return steps(order, start_step).map(read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def finish(batches: tf.data.Dataset, order: RecordOrder, distributed: bool, start_step: int) -> tf.data.Dataset:
    """``batches`` prefetched, deterministic, not sharded again by tf.distribute; an evaluation pass declares its
    number of batches (Keras then reads it to its end without warning that the input "ran out of data")."""
    if not order.training:
        batches = batches.apply(tf.data.experimental.assert_cardinality(len(order) - start_step))
    options = tf.data.Options()
    options.deterministic = True
    # Sharded by the order already (input_context); a dataset given to tf.distribute as a whole is split by batch.
    options.experimental_distribute.auto_shard_policy = (tf.data.experimental.AutoShardPolicy.OFF if distributed
                                                         else tf.data.experimental.AutoShardPolicy.DATA)
    return batches.with_options(options).prefetch(tf.data.AUTOTUNE)
