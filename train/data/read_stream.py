"""TensorFlow's side of reading: streamed reads (URLs, ``random_access=False``: seeded shard and buffer shuffles, not
the random-access order, never mid-epoch), fixed layouts as chunks of each record's pixels, other records parsed as
Examples and decoded by the encoding's ``decode_tf``; and the Example decoders the gathered reads share.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from shardprep.preprocess.format import encodings, record_format
from shardprep.preprocess.format.dataset import Manifest
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.train.data import record_gather
from shardprep.train.data.record_gather import MAX_VARINT_BYTES

# Files read at once: more files mix better; each open file costs one read buffer.
DEFAULT_CYCLE_LENGTH = 16
# Read buffer per open shard file, for remote files (gs://...), where fewer, larger reads pay. Local files are read
# unbuffered: a record (~200 KB for 256x256 raw) then goes from the file straight into its string, one copy less,
# which measured ~10% less CPU per image.
REMOTE_FILE_BUFFER_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class ReadPlan:
    """The shards this input pipeline streams and how its batches are made (``batch_size`` per replica);
    ``shard_records_by``: ``(pipelines, pipeline_id)`` when files were too few to share out."""

    data_dir: str
    split: str
    files: list
    counts: list
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
    def file_buffer_bytes(self) -> int:
        return REMOTE_FILE_BUFFER_BYTES if "://" in self.data_dir else 0

    def without_empty_shards(self) -> "ReadPlan":
        """The plan without empty shards, which fixed-layout streams cannot take apart."""
        files = [f for f, n in zip(self.files, self.counts) if n]
        if not files:
            raise ValueError(f"split {self.split!r} of {self.data_dir} has no examples")
        return dataclasses.replace(self, files=files, counts=[n for n in self.counts if n])

    def records(self, open_shard) -> tf.data.Dataset:
        """The records of the plan's shards in its order; ``open_shard(path, count)`` opens one shard's records."""
        shards = tf.data.Dataset.from_tensor_slices((self.files, tf.constant(self.counts, tf.int64)))
        if self.training:
            shards = shards.shuffle(len(self.files), seed=self.seed, reshuffle_each_iteration=True).repeat()
        if self.snapshot is not None:
            open_shard = self._checked_open(open_shard)
        cycle_length = min(len(self.files), self.cycle_length or DEFAULT_CYCLE_LENGTH)
        records = shards.interleave(open_shard, cycle_length=cycle_length, block_length=1,
                                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)
        if self.shard_records_by is not None:
            records = records.shard(*self.shard_records_by)
        if self.training:
            records = records.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True)
        return records

    def _checked_open(self, open_shard):
        """``open_shard`` behind the snapshot's check of the file, made as the shard is opened (not when the
        interleave takes the element ahead: a rebuild in between would fail in the file reader, unnamed)."""
        check = record_gather.guarded(self.snapshot.check_path, lambda path: path)

        def checked(path, *rest):
            def open_checked(element):
                verified = tf.numpy_function(check, [element[0]], tf.string, stateful=True,
                                             name="check_shard_identity")
                verified.set_shape([])
                return open_shard(verified, *element[1:])

            return tf.data.Dataset.from_tensors((path, *rest)).flat_map(lambda *element: open_checked(element))

        return checked

    def batched(self, elements: tf.data.Dataset, decode=None) -> tf.data.Dataset:
        """``elements`` in the plan's batches (full ones only in training), each mapped through ``decode``."""
        batches = elements.batch(self.batch_size, drop_remainder=self.training, num_parallel_calls=tf.data.AUTOTUNE,
                                 deterministic=self.deterministic)
        if decode is None:
            return batches
        return batches.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=self.deterministic)

    def finish(self, batches: tf.data.Dataset) -> tf.data.Dataset:
        """``batches`` finished (:func:`finished`): sharded by file here, so tf.distribute must not shard again."""
        whole_pass = not self.training and not self.distributed and self.shard_records_by is None
        return finished(batches, self.deterministic, tf.data.experimental.AutoShardPolicy.OFF if self.distributed
                        else tf.data.experimental.AutoShardPolicy.FILE,
                        -(-sum(self.counts) // self.batch_size) if whole_pass else None)


def finished(batches: tf.data.Dataset, deterministic: bool, shard_policy, cardinality: int | None) -> tf.data.Dataset:
    """``batches`` with these options, prefetched; ``cardinality``: an evaluation pass's batches, declared so that
    Keras reads the pass to its end without warning that the input "ran out of data"."""
    if cardinality is not None:
        batches = batches.apply(tf.data.experimental.assert_cardinality(cardinality))
    options = tf.data.Options()
    options.deterministic = deterministic
    options.experimental_distribute.auto_shard_policy = shard_policy
    return batches.with_options(options).prefetch(tf.data.AUTOTUNE)


def streamed_batches(plan: ReadPlan, layout: FixedLayout) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards, streamed through the shared order, each
    record read as a chunk of ``record_bytes`` from its pixels."""
    def open_file(path, num_records):
        chunks = tf.data.FixedLengthRecordDataset(path, layout.record_bytes, header_bytes=layout.image_offset,
                                                  buffer_size=plan.file_buffer_bytes)
        # FixedLengthRecordDataset already fails on a file that is not header + k records; this names a file
        # holding another number of records than the manifest says.
        return chunks.apply(tf.data.experimental.assert_cardinality(num_records))

    return plan.batched(plan.records(open_file), _chunk_batch_decoder(layout))


def _chunk_batch_decoder(layout: FixedLayout):
    height, width, channels = layout.height, layout.width, record_format.CHANNELS
    label_start = layout.label_offset - layout.image_offset
    shifts = tf.constant([7 * i for i in range(MAX_VARINT_BYTES)], tf.int64)

    def decode(chunks):
        pixels = tf.io.decode_raw(chunks, tf.uint8, fixed_length=layout.image_bytes)
        images = tf.reshape(pixels, [-1, height, width, channels])
        images.set_shape([chunks.shape[0], height, width, channels])  # keep a static B
        # The label is a protobuf varint (7 bits a byte, low bits first, high bit set on all but the last byte).
        varint = tf.cast(tf.io.decode_raw(tf.strings.substr(chunks, label_start, MAX_VARINT_BYTES), tf.uint8,
                                          fixed_length=MAX_VARINT_BYTES), tf.int64)
        counted = tf.math.cumprod(tf.cast(varint >= 128, tf.int64), axis=1, exclusive=True)
        labels = tf.reduce_sum(tf.bitwise.left_shift(tf.bitwise.bitwise_and(varint, 127), shifts) * counted, axis=1)
        return images, tf.cast(labels, tf.int32)

    return decode


def example_batches(plan: ReadPlan, manifest: Manifest) -> tf.data.Dataset:
    """``(uint8 [B, H, W, 3], int32 [B])`` batches of ``plan``'s shards, records parsed as Examples."""
    stored, crop, (height, width) = encodings.get(manifest.encoding), manifest.crop, manifest.stored_shape
    records = plan.records(lambda path, _: tf.data.TFRecordDataset(path, buffer_size=plan.file_buffer_bytes))
    if stored.has_fixed_layout(crop):
        # Parallel batching: assembling a batch copies every record once, and one thread doing it all falls behind.
        return plan.batched(records, _raw_batch_decoder(height, width))
    # One image at a time is unavoidable here (JPEG decode, or a crop of a variable-size image); the random crop
    # positions come from a seeded stream zipped alongside, so a seed still makes the batches repeatable.
    decode = _per_image_decoder(stored, crop, manifest.shorter_side, height, width, plan.training)
    crop_seeds = tf.data.Dataset.random(seed=plan.seed).batch(2)
    return plan.batched(tf.data.Dataset.zip(records, crop_seeds).map(
        decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=plan.deterministic))


_FEATURES = {record_format.ENCODED: tf.io.FixedLenFeature([], tf.string),
             **{key: tf.io.FixedLenFeature([], tf.int64)
                for key in (record_format.LABEL, record_format.HEIGHT, record_format.WIDTH)}}


def _raw_batch_decoder(height: int, width: int):
    spec = {key: _FEATURES[key] for key in (record_format.ENCODED, record_format.LABEL)}

    def decode(serialized_batch):
        features = tf.io.parse_example(serialized_batch, spec)
        pixels = tf.io.decode_raw(features[record_format.ENCODED], tf.uint8)
        images = tf.reshape(pixels, [-1, height, width, record_format.CHANNELS])
        images.set_shape([serialized_batch.shape[0], height, width, record_format.CHANNELS])  # keep a static B
        return images, tf.cast(features[record_format.LABEL], tf.int32)

    return decode


def indexed_batches(serialized: tf.data.Dataset, encoding: str, crop: str, side: int, height: int, width: int,
                    training: bool) -> tf.data.Dataset:
    """``(uint8 [b, H, W, 3], int32 [b])`` batches of gathered ``(serialized Examples, crop draws)``."""
    stored = encodings.get(encoding)
    if stored.has_fixed_layout(crop):
        decode_raw = _raw_batch_decoder(height, width)
        return serialized.map(lambda records, _: decode_raw(records), num_parallel_calls=tf.data.AUTOTUNE,
                              deterministic=True)
    decode = _per_image_decoder(stored, crop, side, height, width, training, _drawn_offsets)
    image_spec = (tf.TensorSpec([height, width, record_format.CHANNELS], tf.uint8), tf.TensorSpec([], tf.int32))

    def decode_batch(records, draws):
        return tf.map_fn(lambda element: decode(*element), (records, draws), fn_output_signature=image_spec,
                         parallel_iterations=16)

    return serialized.map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def _seeded_offsets(spare, crop_seed):
    """Random (top, left) in ``[0, spare]`` from a stateless seed (the streamed reads' crops)."""
    return tf.random.stateless_uniform([2], seed=crop_seed, maxval=tf.int32.max, dtype=tf.int32) % (spare + 1)


def _drawn_offsets(spare, draws):
    """(top, left) from the NumPy order's crop draws: ``draw % (spare + 1)``, as the NumPy reader computes them."""
    return tf.cast(draws % tf.cast(spare + 1, tf.int64), tf.int32)


def _per_image_decoder(stored: encodings.Encoding, crop: str, side: int, height: int, width: int, training: bool,
                       random_offsets=_seeded_offsets):
    def decode(serialized, crop_source):
        features = tf.io.parse_single_example(serialized, _FEATURES)
        stored_height = tf.cast(features[record_format.HEIGHT], tf.int32)
        stored_width = tf.cast(features[record_format.WIDTH], tf.int32)
        image = stored.decode_tf(features[record_format.ENCODED], stored_height, stored_width)
        if crop == "none":  # a side x side square: random in training, central otherwise
            spare = tf.stack([stored_height - side, stored_width - side])
            top_left = random_offsets(spare, crop_source) if training else spare // 2
            image = tf.slice(image, tf.concat([top_left, [0]], axis=0), [side, side, record_format.CHANNELS])
        image = tf.ensure_shape(image, [height, width, record_format.CHANNELS])
        return image, tf.cast(features[record_format.LABEL], tf.int32)

    return decode
