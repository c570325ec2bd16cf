"""The training reader: prepared shards in, batches of uint8 images and int32 labels out, at almost no host cost.

Local shards are read by random access in one record order defined in NumPy (:mod:`shardprep.train.record_order`):
records numbered in manifest shard order, a full permutation per (seed, epoch) in training, the global order in
evaluation, each input pipeline (``input_context``) its own share with as many batches as every other. Only the global
step goes through tf.data; each step's records follow from (seed, epoch, batch) alone, so ``start_step`` resumes
mid-epoch in O(1), and :class:`shardprep.train.numpy_reader.NumpyReader` (no TensorFlow) gives the same batches::

    global steps from start_step -> the step's record ids (RecordOrder.batch_ids)
      -> gather: one preadv per record, straight into the batch (train.record_gather) -> prefetch

That is the fast path (``raw`` shards, ``crop: center``): such shards have a fixed record layout (``record_layout``
in the manifest, :class:`shardprep.preprocess.fixed_layout.FixedLayout`), so where a record lies follows from its
index. The kernel's copy out of the page cache is the only copy of the pixels: no TFRecord framing, no CRC pass, no
protobuf parsing, no intermediate strings (2.1x less host CPU per image than streaming the same shards, 3.4-3.6x
less than TFRecordDataset + ``parse_example``; BENCHMARKS.md). ``verify_records=True`` gathers the same way and
checks both CRCs of every record over the pieces it read (:mod:`shardprep.train.verified_gather`). Every other layout
(JPEG, ``crop: none``, datasets written before the layout existed) is read by random access too: each shard's record
offsets come from its framing's headers (:mod:`shardprep.train.record_index`), a step's serialized Examples are read
with one ``pread`` each (CRCs checked with ``verify_records``) and decoded in TensorFlow
(:mod:`shardprep.train.read_examples`).

``random_access=False`` (``shardprep train --sequential-reads``), and shards behind a URL such as ``gs://``, stream
each shard instead, in tf.data's order (:class:`shardprep.train.read_plan.ReadPlan`: shards shuffled each epoch,
interleaved, a shuffle buffer): seeded and repeatable, but another order than the random-access one, and it cannot
start mid-epoch (``start_step`` must be 0)::

    shard files -> shuffle (each epoch) -> parallel interleave of FixedLengthRecordDatasets -> shuffle buffer
      -> batch -> decode_raw on the batch -> prefetch

A dataset changed while it is read (rebuilt, a shard replaced: local shards are checked as they are opened and at
each epoch's start), or a label outside the manifest's classes, fails the iteration with an error naming the file,
never a garbage batch (:mod:`shardprep.train.record_identity`). Arguments of the wrong type (``batch_size=2.5``) are
a ``TypeError``.

The shards' integrity is checked by ``shardprep validate`` (CRCs, the manifest's sha256 and every record's layout);
a file whose size or record count disagrees with the manifest still fails loudly.

The reshape to ``[B, H, W, 3]`` is free. Augmentation and normalization are not done here: they are part of the model
(:mod:`shardprep.train.augment`) so that they run batched on the accelerator and the host ships uint8 (4x fewer bytes
than float32). Every dataset yields images of one shape, its manifest's ``stored_shape``.

This module takes the manifest (:func:`shardprep.preprocess.dataset.load_manifest`, read once and passed on) and
dispatches to a read strategy, each its own module:

* :mod:`shardprep.train.read_gather`: local shards by random access, in the NumPy order (the default);
* :mod:`shardprep.train.read_stream`: fixed-layout shards streamed (``random_access=False``, URLs);
* :mod:`shardprep.train.read_examples`: Examples decoded in TensorFlow, gathered or streamed (every other layout).
"""

from __future__ import annotations

import tensorflow as tf

from shardprep.preprocess import manifest as manifest_lib
from shardprep.preprocess import record_format
from shardprep.preprocess.dataset import Manifest, load_manifest, typed  # noqa: F401 - load_manifest: README's import
from shardprep.train import read_examples, read_gather, read_stream, record_gather, split_roles
from shardprep.train.read_plan import DEFAULT_CYCLE_LENGTH, REMOTE_FILE_BUFFER_BYTES, ReadPlan  # noqa: F401
from shardprep.train.record_identity import DatasetSnapshot
from shardprep.train.record_order import RecordOrder, bool_argument, integer_argument

# Memory the shuffle buffer may hold by default; with 256x256 raw records (196 KiB) that is ~5,400 images.
SHUFFLE_BUFFER_BYTES = 1 << 30
MIN_SHUFFLE_BUFFER = 1024
MAX_SHUFFLE_BUFFER = 16384


def read_url(path: str, at_most: int) -> bytes | None:
    """At most ``at_most`` bytes of the file at the URL ``path`` through ``tf.io.gfile`` (``gs://`` and every other
    TensorFlow file system, as the shards are read), None if there is none: how :func:`make_dataset` has
    ``load_manifest`` read a URL's manifest."""
    try:
        if not tf.io.gfile.exists(path):
            return None
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read(at_most)
    except tf.errors.OpError as e:
        raise OSError(e.message) from e


def split_size(manifest: dict | Manifest, split: str) -> int:
    """Number of examples in ``split``, a split's name or a role (``"validation"`` finds ``val``: see
    :mod:`shardprep.train.split_roles`; a KeyError naming the known splits if there is none)."""
    manifest = typed(manifest)
    return manifest.split(split_roles.resolve_split(manifest.splits, split).name).num_examples


def default_shuffle_buffer(manifest: dict | Manifest, split: str) -> int:
    """Records the shuffle buffer holds by default: about 1 GiB of records, within [1024, 16384], at most the split."""
    manifest = typed(manifest)
    info = manifest.split(split)
    num_examples = max(1, info.num_examples)
    total_bytes = info.num_bytes
    height, width = manifest.stored_shape
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
    manifest: dict | Manifest | None = None,
    verify_records: bool = False,
    random_access: bool | None = None,
    start_step: int = 0,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` of ``(images, labels)`` batches from a prepared shardprep dataset.

    ``images`` is ``uint8 [B, H, W, 3]`` (``manifest.stored_shape``), ``labels`` ``int32 [B]`` indices into
    ``manifest.classes``; batches are prefetched; crop, flip and normalization belong to the model (``augment``).

    Args:
      data_dir: dataset folder holding ``manifest.json`` (local, or ``gs://``: shards through ``tf.io.gfile``).
      split: a split's name, or a role: ``"validation"`` reads ``val`` (:mod:`~shardprep.train.split_roles`).
      batch_size: the global batch size. Under ``tf.distribute`` the dataset yields per-replica batches of
        ``input_context.get_per_replica_batch_size(batch_size)``.
      training: ``True``: a new permutation of the records every epoch (local shards; streamed ones: shuffled
        files and a buffer), repeat forever, ``N // batch_size`` full batches an epoch, random square crops for
        ``crop: none`` data. ``False``: one pass in a fixed order, the last batch may be smaller, centre crops.
      seed: same seed, same training batches and crops (for local shards also :class:`~shardprep.train.numpy_reader.
        NumpyReader`'s); without one, a random seed is drawn for this dataset.
      input_context: given by ``strategy.distribute_datasets_from_function``: each input pipeline (worker) reads
        only its share of the records, with as many batches as every other.
      shuffle_buffer: streamed reads only: records in the shuffle buffer; default :func:`default_shuffle_buffer`.
      cycle_length: streamed reads only: shard files read concurrently (default ``min(files, 16)``).
      deterministic: streamed reads only: force (or forbid) deterministic element order; default: ``training`` and
        no seed -> not. Random-access reads are always in their order.
      manifest: what :func:`~shardprep.preprocess.dataset.load_manifest` returned; by default loaded here.
      verify_records: check both CRCs of every record as it is read (a little more host CPU); streamed
        fixed-layout shards are then read as TFRecords and parsed as Examples.
      random_access: gather each batch's records straight from the files in the NumPy order (default: on for
        local paths, where ``os.preadv`` exists) instead of streaming each shard; streaming suits storage slow at
        random reads, and is the only way for URLs.
      start_step: global batches already read (e.g. ``model.optimizer.iterations``): the dataset starts with the
        batch an uninterrupted run would read next, found without reading the ones before (random access only).
        ``model.fit`` builds its iterator before ``BackupAndRestore`` restores the step: pass your checkpoint's
        step here, or give ``fit`` ``NumpyReader(...).as_py_dataset(steps_done=...)``, which reads it each epoch.

    In your own Keras code: ``training=True`` never ends, so give ``model.fit`` a ``steps_per_epoch``; labels are
    sparse (not one-hot) and :func:`~shardprep.train.model.build_model` returns logits (``from_logits=True``).
    """
    _check_arguments(batch_size, training, seed, start_step, shuffle_buffer, cycle_length)
    manifest, split = _opened(data_dir, split, manifest)
    if _reads_by_random_access(data_dir, random_access, start_step):
        return _random_access_batches(data_dir, split, batch_size, training, seed, manifest, input_context,
                                      verify_records, start_step)
    plan = _plan(data_dir, split, batch_size, training, seed, manifest, input_context, shuffle_buffer,
                 cycle_length, deterministic)
    return plan.finish(labels_checked(_streamed_batches(plan, manifest, split, verify_records), manifest.num_classes,
                                      data_dir))


def _opened(data_dir: str, split: str, manifest: dict | Manifest | None) -> tuple[Manifest, str]:
    """The manifest (loaded here when not given) and the split that ``split``, a name or a role, means."""
    manifest = typed(manifest) if manifest is not None else load_manifest(data_dir, read_url=read_url)
    return manifest, split_roles.reading(manifest.splits, split, data_dir)


def _check_arguments(batch_size, training, seed, start_step, shuffle_buffer, cycle_length) -> None:
    integer_argument("batch_size", batch_size, minimum=1)
    bool_argument("training", training)
    integer_argument("seed", seed, minimum=0, optional=True)
    integer_argument("start_step", start_step, minimum=0)
    integer_argument("shuffle_buffer", shuffle_buffer, minimum=1, optional=True)
    integer_argument("cycle_length", cycle_length, minimum=1, optional=True)


def labels_checked(batches: tf.data.Dataset, num_classes: int, data_dir: str) -> tf.data.Dataset:
    """``batches`` with every batch's labels asserted to lie in ``0..num_classes-1`` (an ``InvalidArgumentError``
    naming the dataset otherwise: it changed while read, or is damaged)."""
    message = (f"a label is outside 0..{num_classes - 1} (the manifest's {num_classes} classes): {data_dir} changed "
               f"since the reader opened it, or is damaged; run `shardprep validate {data_dir}`. Labels:")

    def check(images, labels):
        in_range = tf.logical_and(tf.reduce_all(labels >= 0), tf.reduce_all(labels < num_classes))
        with tf.control_dependencies([tf.debugging.Assert(in_range, [message, labels], summarize=16)]):
            return images, tf.identity(labels)

    return batches.map(check)


def _reads_by_random_access(data_dir: str, random_access: bool | None, start_step: int) -> bool:
    """Whether ``make_dataset`` gathers records by random access (default: local paths where ``os.preadv`` exists);
    a ``ValueError`` for random access to a URL, or a start step on a streamed read."""
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


def _streamed_batches(plan: ReadPlan, manifest: Manifest, split: str, verify_records: bool) -> tf.data.Dataset:
    """Each shard read front to back through the plan's tf.data order: fixed-layout chunks, or Examples parsed."""
    layout = None if verify_records else manifest.split(split).record_layout
    if layout is None:
        return read_examples.example_batches(plan, manifest.encoding, manifest.crop, manifest.shorter_side)
    return read_stream.streamed_batches(plan.without_empty_shards(), layout)


def _random_access_batches(data_dir: str, split: str, batch_size: int, training: bool, seed: int | None,
                           manifest: Manifest, input_context, verify_records: bool,
                           start_step: int) -> tf.data.Dataset:
    """The batches of the NumPy order (:mod:`~shardprep.train.record_order`), gathered from local shards."""
    shards = manifest.split(split).shards
    if not shards:
        raise ValueError(f"split {split!r} of {data_dir} has no shards")
    counts = [shard.num_examples for shard in shards]
    if not sum(counts):
        raise ValueError(f"split {split!r} of {data_dir} has no examples")
    num_shards, index = 1, 0
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)
        num_shards, index = input_context.num_input_pipelines, input_context.input_pipeline_id
    order = RecordOrder(counts, batch_size, training, seed, num_shards=num_shards, index=index)
    paths = [manifest_lib.join(data_dir, shard.file) for shard in shards]
    snapshot = DatasetSnapshot(data_dir, paths, [shard.num_bytes for shard in shards])
    layout = manifest.split(split).record_layout
    if layout is not None and record_gather.AVAILABLE:
        batches = read_gather.gathered_batches(order, paths, counts, layout, start_step, verify=verify_records,
                                               snapshot=snapshot, num_classes=manifest.num_classes)
    else:
        height, width = manifest.stored_shape
        serialized = read_gather.serialized_batches(order, paths, counts, verify_records, start_step, snapshot)
        batches = read_examples.indexed_batches(serialized, manifest.encoding, manifest.crop, manifest.shorter_side,
                                                height, width, training)
    return read_gather.finish(labels_checked(batches, manifest.num_classes, data_dir), order,
                              input_context is not None, start_step)


def _plan(data_dir: str, split: str, batch_size: int, training: bool, seed: int | None, manifest: Manifest,
          input_context, shuffle_buffer: int | None, cycle_length: int | None,
          deterministic: bool | None) -> ReadPlan:
    """The :class:`ReadPlan` of ``make_dataset``'s arguments: this input pipeline's shards and batch size."""
    shards = manifest.split(split).shards  # encoding and crop are known ones: Manifest.from_json checked the shape
    files = [manifest_lib.join(data_dir, shard.file) for shard in shards]
    if not files:
        raise ValueError(f"split {split!r} of {data_dir} has no shards")
    counts = [shard.num_examples for shard in shards]
    per_replica_batch, shard_records_by = batch_size, None
    if input_context is not None:
        per_replica_batch = input_context.get_per_replica_batch_size(batch_size)
        pipelines, pipeline_id = input_context.num_input_pipelines, input_context.input_pipeline_id
        if pipelines > 1:
            if len(files) >= pipelines:
                files, counts = files[pipeline_id::pipelines], counts[pipeline_id::pipelines]
            else:
                shard_records_by = (pipelines, pipeline_id)
    height, width = manifest.stored_shape
    return ReadPlan(
        data_dir=data_dir, split=split, files=files, counts=counts, height=height, width=width,
        batch_size=per_replica_batch, training=training, seed=seed,
        deterministic=deterministic if deterministic is not None else not training or seed is not None,
        shuffle_buffer=(shuffle_buffer or default_shuffle_buffer(manifest, split)) if training else None,
        cycle_length=cycle_length, shard_records_by=shard_records_by, distributed=input_context is not None,
        snapshot=None if "://" in data_dir else DatasetSnapshot(
            data_dir, [manifest_lib.join(data_dir, shard.file) for shard in shards],
            [shard.num_bytes for shard in shards]))
