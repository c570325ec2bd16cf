"""The streamed reads' plan (URLs such as ``gs://``, ``random_access=False``): the shards one input pipeline reads
(:class:`ReadPlan`) and the tf.data order their records go through.

The order (:meth:`ReadPlan.ordered`): the shards shuffled each epoch (training), interleaved record by record, split
among input pipelines by record when there are fewer shards than pipelines, then a shuffle buffer (training). It is
seeded and repeatable, but it is not the random-access order (:mod:`shardprep.train.record_order`, a global
permutation per epoch): a stream cannot follow a global permutation, nor start at a step without reading up to it.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from shardprep.train import record_gather

# Files read at once: more files mix better; each open file costs one read buffer.
DEFAULT_CYCLE_LENGTH = 16
# Read buffer per open shard file, for remote files (gs://...), where fewer, larger reads pay. Local files are read
# unbuffered: a record (~200 KB for 256x256 raw) then goes from the file straight into its string, one copy less,
# which measured ~10% less CPU per image.
REMOTE_FILE_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The shards of one split that this input pipeline reads, and how its batches are made.

    ``files`` and ``counts`` (records per file) are this pipeline's share; ``shard_records_by`` is
    ``(num_pipelines, pipeline_id)`` when the files were too few to give each pipeline its own, and the records are
    shared out instead. ``batch_size`` is per replica; ``shuffle_buffer`` is used in training only.
    """

    data_dir: str
    split: str
    files: list
    counts: list
    height: int
    width: int
    batch_size: int
    training: bool
    seed: int | None
    deterministic: bool
    shuffle_buffer: int | None
    cycle_length: int | None
    shard_records_by: tuple[int, int] | None
    distributed: bool  # an input context was given: tf.distribute must not shard again
    # Local shards: the DatasetSnapshot each shard is checked against as it is opened (None for URLs).
    snapshot: object | None = None

    @property
    def remote(self) -> bool:
        return "://" in self.data_dir

    @property
    def file_buffer_bytes(self) -> int:
        return REMOTE_FILE_BUFFER_BYTES if self.remote else 0

    def without_empty_shards(self) -> "ReadPlan":
        """The plan without shards that hold no record (a split whose inputs were all rejected has such shards: empty
        files, which the fixed-layout readers cannot take apart)."""
        files = [f for f, n in zip(self.files, self.counts) if n]
        if not files:
            raise ValueError(f"split {self.split!r} of {self.data_dir} has no examples")
        return dataclasses.replace(self, files=files, counts=[n for n in self.counts if n])

    def ordered(self, shards: tf.data.Dataset, open_shard) -> tf.data.Dataset:
        """The records of ``shards`` (one element per file, in ``files`` order) in the plan's order;
        ``open_shard(*element)`` makes one shard's dataset of records."""
        if self.training:
            shards = shards.shuffle(len(self.files), seed=self.seed, reshuffle_each_iteration=True).repeat()
        if self.snapshot is not None:
            open_shard = self._checked_open(open_shard)
        records = shards.interleave(
            open_shard,
            cycle_length=min(len(self.files), self.cycle_length or DEFAULT_CYCLE_LENGTH),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=self.deterministic,
        )
        if self.shard_records_by is not None:
            records = records.shard(*self.shard_records_by)
        if self.training:
            records = records.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True)
        return records

    def _checked_open(self, open_shard):
        """``open_shard`` behind a check that the file is the one the snapshot saw, made as the shard is opened
        (not when the interleave takes the element ahead of time: a dataset rebuilt in between would reach the file
        reader first, and fail with its own message about record sizes instead of naming the change)."""
        check = record_gather.guarded(self.snapshot.check_path, lambda path: path)

        def checked(path, *rest):
            def open_checked(element):
                verified = tf.numpy_function(check, [element[0]], tf.string, stateful=True,
                                             name="check_shard_identity")
                verified.set_shape([])
                return open_shard(verified, *element[1:])

            return tf.data.Dataset.from_tensors((path, *rest)).flat_map(lambda *element: open_checked(element))

        return checked

    def finish(self, batches: tf.data.Dataset) -> tf.data.Dataset:
        """``batches`` with the plan's determinism and sharding options, prefetched; an evaluation pass that is
        not shared out among input pipelines declares its number of batches."""
        if not self.training and not self.distributed and self.shard_records_by is None:
            # Keras then reads the pass to its end without warning that the input "ran out of data".
            batches = batches.apply(tf.data.experimental.assert_cardinality(-(-sum(self.counts) // self.batch_size)))
        options = tf.data.Options()
        options.deterministic = self.deterministic
        if self.distributed:
            # Sharded by the plan, by file; stop tf.distribute from sharding again.
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        else:
            options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
        return batches.with_options(options).prefetch(tf.data.AUTOTUNE)
