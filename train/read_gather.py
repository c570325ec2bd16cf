"""Read strategy for local fixed-layout shards: only record ids go through the shared order, and each batch's
records are then gathered by random access straight into the batch (:mod:`shardprep.train.record_gather`)."""

from __future__ import annotations

import tensorflow as tf

from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.train import record_gather
from shardprep.train.read_plan import ReadPlan


def gathered_batches(plan: ReadPlan, layout: FixedLayout) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards, which must be local files whose sizes
    match ``layout`` and the manifest's counts (checked here)."""
    if plan.remote:
        raise ValueError(f"random_access reads local shards only, not {plan.data_dir}")
    record_gather.check_shard_sizes(plan.files, plan.counts, layout)
    gather = record_gather.FixedLayoutGather(plan.files, layout)
    # The records' ids go through the same shuffles, interleave and sharding as the streamed records would, so
    # both ways give the same batches; only the ids are shuffled, the pixels are read once they are batched.
    shards = tf.data.Dataset.from_tensor_slices((tf.range(len(plan.files), dtype=tf.int64),
                                                tf.constant(plan.counts, tf.int64)))
    ids = plan.ordered(shards, lambda shard, count: tf.data.Dataset.range(*record_gather.record_ids(shard, count)))
    batches = ids.batch(plan.batch_size, drop_remainder=plan.training)
    return batches.map(_gathered_batch_reader(gather), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=plan.deterministic)


def _gathered_batch_reader(gather: record_gather.FixedLayoutGather):
    def read(ids):
        # stateful=False: the same ids always read the same bytes.
        images, labels = tf.numpy_function(gather, [ids], [tf.uint8, tf.int32], stateful=False,
                                           name="gather_fixed_layout_records")
        images.set_shape([ids.shape[0], *gather.image_shape])  # keep a static B
        labels.set_shape([ids.shape[0]])
        return images, labels

    return read
