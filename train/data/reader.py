"""``make_dataset``: a prepared dataset's batches of uint8 images and int32 labels as a ``tf.data.Dataset``. Local
shards are read by random access in the NumPy order (fixed layouts gathered by ``preadv``: BENCHMARKS.md), so
``start_step`` resumes in O(1); URLs and ``random_access=False`` stream (:mod:`~shardprep.train.data.read_stream`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from shardprep.preprocess.format import record_format
from shardprep.preprocess.format.dataset import Manifest, load_manifest, typed  # noqa: F401 - load_manifest: README's import
from shardprep.train.data import read_stream, record_gather, split_roles
from shardprep.train.data.batch_sources import DatasetSnapshot, ExampleGather, FixedLayoutSource, SplitFiles, split_files
from shardprep.train.data.read_stream import ReadPlan
from shardprep.train.data.record_order import RecordOrder, bool_argument, integer_argument

# Memory the shuffle buffer may hold by default; with 256x256 raw records (196 KiB) that is ~5,400 images.
SHUFFLE_BUFFER_BYTES = 1 << 30
MIN_SHUFFLE_BUFFER = 1024
MAX_SHUFFLE_BUFFER = 16384


def read_url(path: str, at_most: int) -> bytes | None:
    """At most ``at_most`` bytes of the file at the URL ``path`` (``tf.io.gfile``, as the shards are read), None
    if there is none: how ``load_manifest`` reads a URL's manifest."""
    try:
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read(at_most)
    except tf.errors.OpError as e:
        raise OSError(e.message) from e


def split_size(manifest: dict | Manifest, split: str) -> int:
    """Number of examples in ``split``, a name or a role (a KeyError listing the splits if none)."""
    manifest = typed(manifest)
    return manifest.split(split_roles.resolve_split(manifest.splits, split).name).num_examples


def default_shuffle_buffer(manifest: dict | Manifest, split: str) -> int:
    """Records the shuffle buffer holds by default: about 1 GiB of records, within [1024, 16384], at most the split."""
    manifest = typed(manifest)
    info = manifest.split(split)
    num_examples = max(1, info.num_examples)
    height, width = manifest.stored_shape
    record_bytes = info.num_bytes / num_examples if info.num_bytes else height * width * record_format.CHANNELS
    buffer = int(SHUFFLE_BUFFER_BYTES // max(1.0, record_bytes))
    return max(1, min(num_examples, max(MIN_SHUFFLE_BUFFER, min(MAX_SHUFFLE_BUFFER, buffer))))


def make_dataset(data_dir: str, split: str, batch_size: int, training: bool, seed: int | None = None, *,
                 input_context: tf.distribute.InputContext | None = None, shuffle_buffer: int | None = None,
                 cycle_length: int | None = None, deterministic: bool | None = None,
                 manifest: dict | Manifest | None = None, verify_records: bool = False,
                 random_access: bool | None = None, start_step: int = 0) -> tf.data.Dataset:
    """Prefetched ``(uint8 [B, H, W, 3] images, int32 [B] labels)`` batches of ``split`` (a name or a role) of
    ``data_dir`` (local or ``gs://``). ``batch_size``: global; ``training``: endless reshuffled full batches, else one
    pass in order; same ``seed``, same batches. Streamed reads only: ``shuffle_buffer``, ``cycle_length`` (default
    ``min(files, 16)``), ``deterministic``. ``verify_records``: check both CRCs. ``random_access``: gather from local
    files (default where ``os.preadv`` exists) or stream. ``start_step``: global batches already read (random access).
    """
    integer_argument("batch_size", batch_size, minimum=1)
    bool_argument("training", training)
    integer_argument("seed", seed, minimum=0, optional=True)
    integer_argument("start_step", start_step, minimum=0)
    integer_argument("shuffle_buffer", shuffle_buffer, minimum=1, optional=True)
    integer_argument("cycle_length", cycle_length, minimum=1, optional=True)
    manifest = typed(manifest) if manifest is not None else load_manifest(data_dir, read_url=read_url)
    split = split_roles.reading(manifest.splits, split, data_dir)
    random_access = _reads_by_random_access(data_dir, random_access, start_step)
    if not manifest.split(split).shards:
        raise ValueError(f"split {split!r} of {data_dir} has no shards")
    files = split_files(data_dir, manifest, split)
    per_replica, pipelines, pipeline_id = batch_size, 1, 0
    if input_context is not None:
        per_replica = input_context.get_per_replica_batch_size(batch_size)
        pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
    if random_access:
        if not sum(files.counts):
            raise ValueError(f"split {split!r} of {data_dir} has no examples")
        order = RecordOrder(files.counts, per_replica, training, seed, num_shards=pipelines, index=pipeline_id)
        return _random_access_batches(data_dir, manifest, split, files, order, input_context is not None,
                                      verify_records, start_step)
    paths, counts, shard_records_by = files.paths, files.counts, None
    if pipelines > 1 and len(paths) >= pipelines:
        paths, counts = paths[pipeline_id::pipelines], counts[pipeline_id::pipelines]
    elif pipelines > 1:
        shard_records_by = (pipelines, pipeline_id)
    plan = ReadPlan(
        data_dir=data_dir, split=split, files=paths, counts=counts, batch_size=per_replica, training=training,
        seed=seed, deterministic=deterministic if deterministic is not None else not training or seed is not None,
        shuffle_buffer=(shuffle_buffer or default_shuffle_buffer(manifest, split)) if training else None,
        cycle_length=cycle_length, shard_records_by=shard_records_by, distributed=input_context is not None,
        snapshot=files.snapshot)
    # Each shard read front to back through the plan's tf.data order: fixed-layout chunks, or Examples parsed.
    layout = None if verify_records else manifest.split(split).record_layout
    batches = (read_stream.example_batches(plan, manifest) if layout is None
               else read_stream.streamed_batches(plan.without_empty_shards(), layout))
    return plan.finish(labels_checked(batches, manifest.num_classes, data_dir))


def labels_checked(batches: tf.data.Dataset, num_classes: int, data_dir: str) -> tf.data.Dataset:
    """``batches`` with every label asserted in ``0..num_classes-1`` (the dataset changed, or is damaged)."""
    message = (f"a label is outside 0..{num_classes - 1} (the manifest's {num_classes} classes): {data_dir} changed "
               f"since the reader opened it, or is damaged; run `shardprep validate {data_dir}`. Labels:")

    def check(images, labels):
        in_range = tf.logical_and(tf.reduce_all(labels >= 0), tf.reduce_all(labels < num_classes))
        with tf.control_dependencies([tf.debugging.Assert(in_range, [message, labels], summarize=16)]):
            return images, tf.identity(labels)

    return batches.map(check)


def _reads_by_random_access(data_dir: str, random_access: bool | None, start_step: int) -> bool:
    """Whether ``make_dataset`` gathers by random access; a ``ValueError`` for a URL or a streamed start."""
    remote = "://" in data_dir
    if random_access is None:
        random_access = not remote and record_gather.AVAILABLE
    if random_access and remote:
        raise ValueError(f"random_access reads local shards only, not {data_dir}")
    if not random_access and start_step:
        raise ValueError(f"start_step={start_step}: resuming mid-epoch needs local shards read by random access "
                         f"(a {'URL' if remote else 'streamed read'} follows tf.data's shuffles, which cannot "
                         "start at a step); copy the dataset to a local disk, or start at 0")
    return random_access


def _random_access_batches(data_dir: str, manifest: Manifest, split: str, files: SplitFiles, order: RecordOrder,
                           distributed: bool, verify_records: bool, start_step: int) -> tf.data.Dataset:
    """The batches of the NumPy order (:mod:`~shardprep.train.data.record_order`), gathered from local shards:
    fixed layouts as ``FixedLayoutSource`` reads them, else ``(serialized Examples, crop draws)`` decoded by TF."""
    paths, counts, snapshot = files
    layout = manifest.split(split).record_layout
    if layout is not None and record_gather.AVAILABLE:
        source = FixedLayoutSource(paths, counts, layout, verify=verify_records, snapshot=snapshot,
                                   num_classes=manifest.num_classes)
        batches = _read_by_step(order, start_step, snapshot, lambda step: source(order.batch_ids(step)),
                                [(np.uint8, tf.uint8, source.image_shape), (np.int32, tf.int32, ())],
                                "gather_fixed_layout_records")
    else:
        examples = ExampleGather(paths, counts, verify=verify_records, snapshot=snapshot)
        serialized = _read_by_step(order, start_step, snapshot,
            lambda step: (np.array(examples(order.batch_ids(step)), dtype=object), order.crop_draws(step)),
            [(object, tf.string, ()), (np.int64, tf.int64, (2,))], "gather_serialized_records")
        batches = read_stream.indexed_batches(serialized, manifest.encoding, manifest.crop, manifest.shorter_side,
                                              *manifest.stored_shape, order.training)
    # Sharded by the order already (input_context); a dataset given to tf.distribute as a whole is split by batch.
    return read_stream.finished(labels_checked(batches, manifest.num_classes, data_dir), True,
                                tf.data.experimental.AutoShardPolicy.OFF if distributed
                                else tf.data.experimental.AutoShardPolicy.DATA,
                                None if order.training else len(order) - start_step)


def _read_by_step(order: RecordOrder, start_step: int, snapshot: DatasetSnapshot | None, read, specs,
                  name: str) -> tf.data.Dataset:
    """``read(step)``'s NumPy arrays for each global step, through ``tf.numpy_function``; ``specs``: each array's
    (NumPy dtype, TensorFlow dtype, shape after the batch). The snapshot is checked in full at each epoch's start."""

    def read_step(step):
        if snapshot is not None and int(step) % order.steps_per_epoch == 0:
            snapshot.check()
        return read(step)

    # Python on tf.data's threads: guarded, so that a process exiting while the dataset is alive does not hang.
    guarded = record_gather.guarded(read_step, lambda _: tuple(np.zeros((0, *shape), dtype)
                                                               for dtype, _, shape in specs))
    batch = order.batch_size if order.training else None  # keep a static B where there is one

    def to_tensors(step):
        # stateful=False: the same step always reads the same bytes.
        tensors = tf.numpy_function(guarded, [step], [tf_dtype for _, tf_dtype, _ in specs], stateful=False,
                                    name=name)
        for tensor, (_, _, shape) in zip(tensors, specs):
            tensor.set_shape([batch, *shape])
        return tuple(tensors)

    if not order.training and not 0 <= start_step <= len(order):
        raise ValueError(f"start_step must be in [0, {len(order)}] in evaluation, got {start_step}")
    steps = (tf.data.Dataset.counter(start_step, dtype=tf.int64) if order.training
             else tf.data.Dataset.range(start_step, len(order), dtype=tf.int64))
    return steps.map(to_tensors, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
