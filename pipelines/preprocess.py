"""The preprocess job: decode, convert, resize and re-shard a source of images into uniform TFRecord shards.

Stages (named as in the Beam graph)::

    ListInputs            folder/labels-file listing per class directory, or TFRecord reading per file
    CountInputs           inputs per split, counted on the listing side (the accounting check's other half)
    BatchInputs           small batches of inputs, so the runner handles one element per batch, not per image
    PackInputs            each batch of listed files as a few strings (sources.InputBatch)
    FixedLayouts          raw centre crops: per split, the one record length (record_format.FixedLayout) fitting
                          every listed key and label; it also makes the split's bytes known before decoding
    DecodeGroupBoundaries the inputs' sort keys ranked (as ShardBoundaries below) into decode groups: the shards
                          when their count is known before decoding (--num-shards, or raw centre crops), else
                          pieces of them; at least two groups per local worker
    AssignDecodeGroups    GroupInputs: each group's inputs together (files only: TFRecord inputs are decoded where
                          their file was read, the files having been spread)
    DecodeResizeEncode    preprocess.image_ops.process_image, a group's inputs in seeded order; records go to the
                          group's file under OUTPUT/.tmp/ (hashed as written), and only pointers go on (one
                          RecordPointers per group), with one RecordSummary per bundle (counts, bytes, classes,
                          pixel sums); bad inputs go to the rejects output
    SumRecords            the bundles' summaries merged: per split examples, bytes, class counts; mean/std sums
    ShardBoundaries       exact rank boundaries of the seeded order among the written records, from sort keys
                          grouped in bounded hash-range buckets (BucketSortKeys, GroupBuckets, FindShardBoundaries)
    AssignShards          each group's pointers cut by the shard their rank falls in (uniform: sizes differ by at
                          most one)
    WriteShards           one worker per shard: a shard that is exactly one group's file is that file, renamed
                          (written once); any other shard is streamed from its groups' files in seeded order
                          (fixed-layout records re-padded so that only its last is a shard's end), written under a
                          temporary name and renamed
    WriteRejects          OUTPUT/rejects.jsonl
    WriteManifest         OUTPUT/manifest.json, last, only when every input is accounted for

Order and sharding depend only on the inputs, the options and ``--seed`` (a record's sort key is a hash of the seed,
its split and its source key), so shards are byte-identical whatever the number or speed of workers.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from pipelines import progress, storage
from pipelines.storage import _existing_files, _is_local, output_lock, prepare_output  # noqa: F401
from preprocess import image_ops, manifest, record_format, record_pointers, sharding, sources, tfrecord_io

METRICS_NAMESPACE = "shardprep"  # Beam metrics of the job (the runner's UI shows them; tests query them)


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
    """Every option of a preprocess run; recorded in the manifest as ``options``."""

    source: str
    output: str
    shorter_side: int = 256
    crop: str = "center"
    encoding: str = "raw"
    jpeg_quality: int = 90
    num_shards: int | None = None
    seed: int = 0
    max_pixels: int = image_ops.DEFAULT_MAX_PIXELS
    strict: bool = False
    overwrite: bool = False
    labels_file: str | None = None
    split: str = "train"
    labels_split: str | None = None
    tfds_data_dir: str | None = None
    tfds_download: bool = False
    image_key: str = "image"
    label_key: str = "label"

    @property
    def process_options(self) -> image_ops.ProcessOptions:
        return image_ops.ProcessOptions(self.shorter_side, self.crop, self.encoding, self.jpeg_quality,
                                        self.max_pixels)


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What the job reads, resolved before the pipeline starts (small: directories and files, not images)."""

    kind: str
    splits: tuple[str, ...]
    classes: tuple[str, ...] | None  # None: unnamed int labels, class names become "0".."max"
    class_dirs: tuple[tuple[str, str, str], ...] = ()  # (split, class name, directory)
    flat_dirs: tuple[tuple[str, str], ...] = ()  # (split, directory) of images labelled by the labels file
    labels_split: str | None = None
    tfrecord_files: tuple[tuple[str, str], ...] = ()  # (split, file)

    @property
    def stats_split(self) -> str:
        return "train" if "train" in self.splits else self.splits[0]


class PreprocessError(RuntimeError):
    """The job cannot start or finish; the message is meant for the user."""


# --- planning (runs on the launching machine) --------------------------------------------------------------

def list_children(path: str) -> tuple[list[str], list[str]]:
    """(sub-directory names, file names) directly inside ``path``, without hidden entries, sorted."""
    if _is_local(path):
        if not os.path.isdir(path):
            raise sources.SourceError(f"{path} is not a directory")
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        dirs = [e.name for e in entries if e.is_dir() and not sources.is_hidden(e.name)]
        files = [e.name for e in entries if not e.is_dir() and not sources.is_hidden(e.name)]
        return dirs, files
    # Object stores have no directories; TensorFlow's file system lists one level with a delimiter query.
    import tensorflow as tf

    if not tf.io.gfile.isdir(path):
        raise sources.SourceError(f"{path} is not a directory")
    # On gs:// every sub-directory (a common prefix) comes back with a trailing "/", so no entry needs a probe; a
    # probe per file would be a request per file (50,000 for ImageNet's flat val/ folder) before the job starts.
    marks_directories = FileSystems.get_scheme(path) == "gs"
    dirs, files = [], []
    for name in sorted(tf.io.gfile.listdir(path)):
        clean = name.rstrip("/")
        if sources.is_hidden(clean):
            continue
        is_dir = name.endswith("/") or (not marks_directories and tf.io.gfile.isdir(manifest.join(path, clean)))
        (dirs if is_dir else files).append(clean)
    return dirs, files


def _read_labels_file(path: str) -> list[sources.LabelRow]:
    if not FileSystems.exists(path):
        raise sources.SourceError(f"labels file {path} does not exist")
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        text = f.read().decode("utf-8-sig")
    return sources.parse_labels_csv(text)


def plan_source(config: PreprocessConfig) -> SourcePlan:
    """Resolves SOURCE into splits, classes and the directories or files to read."""
    spec = sources.SourceSpec.parse(config.source)
    if spec.kind == "folder":
        return _plan_folder(spec.location, config)
    if spec.kind == "tfds":
        return _plan_tfds(spec.location, config)
    return _plan_tfrecord(spec.location, config)


def _plan_folder(root: str, config: PreprocessConfig) -> SourcePlan:
    dirs, files = list_children(root)
    if dirs and all(d.lower() in sources.SPLIT_NAMES for d in dirs):
        split_dirs = [(d, manifest.join(root, d)) for d in dirs]
        if files:
            raise sources.SourceError(
                f"{root} holds split folders ({', '.join(dirs)}) and loose files ({files[0]}, ...): "
                "move the files into a split folder")
    else:
        split_dirs = [(config.split, root)]
    class_dirs, flat_dirs = [], []
    for split, directory in split_dirs:
        sub_dirs, sub_files = list_children(directory) if directory != root else (dirs, files)
        class_dirs += [(split, name, manifest.join(directory, name)) for name in sub_dirs]
        if sub_files:
            flat_dirs.append((split, directory))
    for _, name, directory in class_dirs:
        if not _is_utf8(name) or not _is_utf8(directory):
            raise sources.SourceError(
                f"the folder name {_printable(directory)} is not valid UTF-8; class and split names are stored as "
                "text in the records and the manifest: rename the folder")
    class_names = {name for _, name, _ in class_dirs}
    labels_split = None
    if config.labels_file:
        rows = _read_labels_file(config.labels_file)
        class_names |= {row.label for row in rows}
        splits = [s for s, _ in split_dirs]
        labels_split = config.labels_split or next(
            (s for s in ("validation", "val", "test") if s in splits), None) or (
            flat_dirs[0][0] if flat_dirs else splits[0])
        if labels_split not in splits:
            raise sources.SourceError(f"--labels-split {labels_split} is not one of the splits {splits}")
    if not class_names:
        raise sources.SourceError(
            f"no classes found in {root}: expected SOURCE/<split>/<class>/<file>, SOURCE/<class>/<file>, "
            "or images with --labels-file")
    return SourcePlan(
        kind="folder",
        splits=tuple(s for s, _ in split_dirs),
        classes=tuple(sources.sort_class_names(class_names)),
        class_dirs=tuple(class_dirs),
        flat_dirs=tuple(flat_dirs),
        labels_split=labels_split,
    )


def _plan_tfrecord(pattern: str, config: PreprocessConfig, classes=None, split_files=None) -> SourcePlan:
    if split_files is None:
        matched = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        if not matched:
            raise sources.SourceError(f"no files match {pattern}")
        split_files = [(sources.split_from_tfrecord_name(path) or config.split, path) for path in matched]
        classes = _class_names_beside(matched[0])
    splits = tuple(dict.fromkeys(split for split, _ in split_files))
    return SourcePlan(kind="tfrecord", splits=splits, classes=tuple(classes) if classes else None,
                      tfrecord_files=tuple(split_files))


def _class_names_beside(path: str) -> list[str] | None:
    """TFDS writes ``label.labels.txt`` (one class name per line) next to its TFRecords."""
    directory = path.rsplit("/", 1)[0]
    matches = FileSystems.match([manifest.join(directory, "*labels.txt")])[0].metadata_list
    if not matches:
        return None
    with FileSystems.open(sorted(m.path for m in matches)[0],
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        names = [line.strip() for line in f.read().decode("utf-8").splitlines() if line.strip()]
    return names or None


def _plan_tfds(name: str, config: PreprocessConfig) -> SourcePlan:
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=config.tfds_data_dir, try_gcs=False)
    except Exception as e:  # noqa: BLE001 - TFDS raises many kinds for unknown names and missing folders
        raise sources.SourceError(f"cannot load TFDS dataset {name!r} from {config.tfds_data_dir or 'the default data dir'}: {e}") from e
    if not builder.is_prepared():
        if not config.tfds_download:
            raise sources.SourceError(
                f"TFDS dataset {name} is not prepared in {builder.data_dir}; prepare it there (tfds build) or pass "
                "--tfds-download to download and prepare it now")
        builder.download_and_prepare()
    label_feature = builder.info.features[config.label_key] if config.label_key in builder.info.features else None
    classes = list(getattr(label_feature, "names", None) or []) or None
    split_files = [(split, str(path)) for split, info in builder.info.splits.items() for path in info.filepaths]
    if not split_files:
        raise sources.SourceError(f"TFDS dataset {name} has no prepared files in {builder.data_dir}")
    plan = _plan_tfrecord("", config, classes=classes, split_files=split_files)
    return dataclasses.replace(plan, kind="tfds")


# --- listing -----------------------------------------------------------------------------------------------
# Inputs are tuples (split, key, label, path, data): path for files, data for records read from TFRecords.
# Rejects are tuples (split, key, reason, detail).

REJECTS = "rejects"
# Inputs per element from the listing to the decode stage: few enough that the runner still spreads the work
# evenly over its workers, enough that it handles a few elements per 100 images instead of one per image.
INPUT_BATCH = 16
DEFAULT_MIN_DECODE_GROUPS = 64  # remote runners: workers come and go, keep enough groups to share out


def _relative_key(root: str, path: str) -> str:
    """A file's source key: its path relative to SOURCE."""
    return path[len(root):].lstrip("/") if path.startswith(root) else path


class ListClassDirectory(beam.DoFn):
    """Lists the image files of one class directory (one element per directory, so listing runs in parallel)."""

    def __init__(self, root: str, class_index: dict[str, int], progress_dir: str | None):
        self.root, self.class_index, self.progress_dir = root, class_index, progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, element):
        split, class_name, directory = element
        for path in _list_files(directory, recursive=True):  # nested folders belong to the class too
            self.progress.add()
            key = _relative_key(self.root, path)
            if not _is_utf8(path):
                yield _bad_file_name_reject(split, key)
            else:
                yield split, key, self.class_index[class_name], path, None

    def finish_bundle(self):
        self.progress.flush()


class ListFlatDirectory(beam.DoFn):
    """Lists images in a directory without class folders, keyed by file name for the labels-file join."""

    def __init__(self, root: str):
        self.root = root

    def process(self, element):
        split, directory = element
        for path in _list_files(directory):
            if not _is_utf8(path):
                yield _bad_file_name_reject(split, _relative_key(self.root, path))
            else:
                yield sources.labels_key(path), (split, _relative_key(self.root, path), path)


def _is_utf8(text: str) -> bool:
    """False for a name that the OS gave with undecodable bytes (Python's surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(name: str) -> str:
    """``name`` with the bytes that are not UTF-8 shown as backslash-x escapes (``b\\xff.jpg``)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _bad_file_name_reject(split: str, key: str):
    # Records, the runner's coders and rejects.jsonl all need text.
    return beam.pvalue.TaggedOutput(
        REJECTS, (split, _printable(key), "bad_file_name", "the file name is not valid UTF-8: rename the file"))


def _list_files(directory: str, recursive: bool = False) -> list[str]:
    """The input files in ``directory`` (and its sub-folders when ``recursive``), hidden names left out.

    Everything that is not a folder is listed, links to missing files and special files included: reading them
    turns them into "unreadable" rejects instead of letting them vanish unseen.
    """
    if _is_local(directory):
        found = []
        for folder, sub_dirs, files in os.walk(directory):
            sub_dirs[:] = sorted(d for d in sub_dirs if not sources.is_hidden(d)) if recursive else []
            found += [os.path.join(folder, name) for name in files if not sources.is_hidden(name)]
        return sorted(found)
    pattern = manifest.join(directory, "**" if recursive else "*")
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list
                  if not m.path.endswith("/")
                  and not any(sources.is_hidden(part) for part in m.path[len(directory):].split("/")))


class JoinLabels(beam.DoFn):
    """Pairs flat images with their labels-file rows; a file without a row, or a row without a file, is a reject."""

    def __init__(self, class_index: dict[str, int], labels_split: str, progress_dir: str | None):
        self.class_index, self.labels_split, self.progress_dir = class_index, labels_split, progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, element):
        name, (files, rows) = element
        labels = sorted({label for _, label in rows})
        for split, key, path in sorted(files):
            self.progress.add()
            if not labels:
                yield beam.pvalue.TaggedOutput(REJECTS, (split, key, "no_label", f"{name} is not in the labels file"))
            elif len(labels) > 1:
                yield beam.pvalue.TaggedOutput(
                    REJECTS, (split, key, "conflicting_labels", f"labels file gives {', '.join(labels)}"))
            else:
                yield split, key, self.class_index[labels[0]], path, None
        if not files:
            for filename, label in sorted(rows):
                self.progress.add()
                yield beam.pvalue.TaggedOutput(
                    REJECTS, (self.labels_split, f"labels-file:{filename}", "missing_file",
                              f"labels file row {filename},{label} names no image in the source folder"))

    def finish_bundle(self):
        self.progress.flush()


class ReadTFRecordFile(beam.DoFn):
    """Reads one TFRecord file of encoded images (one element per file); bad records become rejects."""

    def __init__(self, image_key: str, label_key: str, num_classes: int | None, progress_dir: str | None):
        self.image_key, self.label_key, self.num_classes = image_key, label_key, num_classes
        self.progress_dir = progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, element):
        split, path = element
        name = path.rsplit("/", 1)[-1]
        index = 0
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                for index, serialized in enumerate(tfrecord_io.read_records(stream)):
                    self.progress.add()
                    yield from self._record(split, f"{name}:{index}", serialized)
        except tfrecord_io.CorruptRecordError as e:
            # The framing is lost after a bad length, so the rest of the file is one reject.
            self.progress.add()
            yield beam.pvalue.TaggedOutput(
                REJECTS, (split, f"{name}:{e.index}", "corrupt_record", f"{e}; the rest of {name} is unreadable"))
        except OSError as e:
            yield beam.pvalue.TaggedOutput(REJECTS, (split, f"{name}:{index}", "unreadable", f"{type(e).__name__}: {e}"))

    def _record(self, split, key, serialized):
        try:
            features = record_format.parse_features(serialized)
        except record_format.RecordFormatError as e:
            yield beam.pvalue.TaggedOutput(REJECTS, (split, key, "bad_record", str(e)))
            return
        images, labels = features.get(self.image_key), features.get(self.label_key)
        if not images or not isinstance(images[0], bytes):
            yield beam.pvalue.TaggedOutput(REJECTS, (split, key, "bad_record", f"no bytes feature {self.image_key!r}"))
        elif not labels or not isinstance(labels[0], int):
            yield beam.pvalue.TaggedOutput(REJECTS, (split, key, "bad_record", f"no int64 feature {self.label_key!r}"))
        elif labels[0] < 0 or (self.num_classes is not None and labels[0] >= self.num_classes):
            yield beam.pvalue.TaggedOutput(
                REJECTS, (split, key, "label_out_of_range", f"label {labels[0]} not in 0..{(self.num_classes or 0) - 1}"))
        else:
            yield split, key, labels[0], None, images[0]

    def finish_bundle(self):
        self.progress.flush()


# --- per image ---------------------------------------------------------------------------------------------

class DecodeResizeEncode(beam.DoFn):
    """Turns inputs into stored records, a :class:`~preprocess.sharding.RecordSummary` per bundle (``summary``:
    counts, bytes, pixel sums) and rejects (``rejects``).

    Serialized records go to spill files under OUTPUT/.tmp/; the main output is
    :class:`~preprocess.record_pointers.RecordPointers`, noting every record's sort key and place in its file.
    Image bytes thus never travel through the runner's shuffle (on Beam's local runner, every element crossing
    costs a gRPC copy). Two modes:

    * ``grouped`` (files and folders): each element is one decode group, ``((split, group), input batches)``, a
      range of consecutive ranks of the seeded order. Its inputs are decoded in that order into a file of their own,
      hashed as it is written; when the group is exactly one shard, WriteShards renames that file into place, so
      the records are written once.
    * otherwise (TFRecord sources, decoded where their file is read): each element is a list of inputs; a bundle
      appends to one spill file, and WriteShards copies the records into their shards.

    A retried element or bundle writes a new file, and only the successful attempt's outputs are kept by the
    runner, so pointers always name complete data.
    """

    SUMMARY = "summary"

    def __init__(self, options: image_ops.ProcessOptions, seed: int, stats_split: str, output: str,
                 progress_dir: str | None, grouped: bool = False):
        self.options, self.seed, self.stats_split, self.output = options, seed, stats_split, output
        self.progress_dir, self.grouped = progress_dir, grouped

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "processed")

    def start_bundle(self):
        self.spill = None
        self.pointers: dict[str, record_pointers.RecordPointers] = {}
        self.summary = sharding.RecordSummary()

    def process(self, element, layouts):
        if not self.grouped:
            for item in element:
                record = self._decode(item)
                if isinstance(record, beam.pvalue.TaggedOutput):
                    yield record
                    continue
                split = item[0]
                if self.spill is None:
                    self.spill = SpillWriter(self.output)
                if split not in self.pointers:
                    self.pointers[split] = record_pointers.RecordPointers(split, self.spill.path)
                self._append(self.spill, self.pointers[split], split, record, layouts.get(split), shard_end=False)
            return
        (split, _), batches = element
        layout = layouts.get(split)
        keyed = sorted(((sharding.sort_key(self.seed, item[0], item[1]), item) for batch in batches for item in batch),
                       key=lambda pair: pair[0])
        spill = pointers = held = None
        for _, item in keyed:
            record = self._decode(item)
            if isinstance(record, beam.pvalue.TaggedOutput):
                yield record
                continue
            if spill is None:
                spill = SpillWriter(self.output, hashed=True)
                pointers = record_pointers.RecordPointers(split, spill.path)
            if held is not None:
                self._append(spill, pointers, split, held, layout, shard_end=False)
            held = record  # one record behind: the group's last one is written as a shard's end
        if spill is not None:
            self._append(spill, pointers, split, held, layout, shard_end=True)
            spill.close()
            pointers.file_info = (len(pointers), spill.offset, spill.sha256())
            yield pointers

    def _decode(self, item):
        """The input's ImageRecord, or its reject as a TaggedOutput."""
        split, key, label, path, data = item
        self.progress.add()
        try:
            if data is None:
                data = _read_file(path)
            image = image_ops.process_image(data, self.options)
        except image_ops.RejectError as e:
            return beam.pvalue.TaggedOutput(REJECTS, (split, key, e.reason, e.detail))
        if split == self.stats_split:
            self.summary.add_pixels((image.num_pixels,) + image.channel_sums + image.channel_square_sums)
        return record_format.ImageRecord(encoded=image.encoded, format=self.options.encoding, height=image.height,
                                         width=image.width, label=label, filename=key)

    def _append(self, spill, pointers, split, record, layout, shard_end):
        """Writes ``record`` to ``spill``: in the split's fixed layout if it has one (a group's last record as a
        shard's end, which a shard that is exactly this group needs; WriteShards re-pads records otherwise)."""
        if layout is not None:
            framed = layout.encode(record, shard_end)
        else:
            framed = tfrecord_io.frame(record_format.encode_example(record))
        offset, size = spill.append(framed)
        pointers.append(sharding.sort_key(self.seed, split, record.filename), offset, size)
        # A fixed-layout record counts as record_bytes whatever its end padding, as the shard count predicts.
        self.summary.add(split, record.label, layout.record_bytes if layout is not None else size)

    def finish_bundle(self):
        if self.spill is not None:
            self.spill.close()
            self.spill = None
        self.progress.flush()
        for split in sorted(self.pointers):
            yield GlobalWindows.windowed_value(self.pointers[split])
        yield beam.pvalue.TaggedOutput(self.SUMMARY, GlobalWindows.windowed_value(self.summary))


SPILL_DIR = storage.SPILL_DIR


class SpillWriter:
    """An append-only file of framed records under OUTPUT/.tmp/ (one per decode group, or per bundle)."""

    def __init__(self, output: str, hashed: bool = False):
        self.path = manifest.join(output, SPILL_DIR, f"spill-{uuid.uuid4().hex}.records")
        self.digest = hashlib.sha256() if hashed else None
        try:
            self.stream = FileSystems.create(self.path, mime_type="application/octet-stream",
                                             compression_type=CompressionTypes.UNCOMPRESSED)
        except Exception as e:
            raise PreprocessError(f"cannot write to {self.path}: {type(e).__name__}: {e}") from e
        self.offset = 0

    def append(self, framed: bytes) -> tuple[int, int]:
        try:
            self.stream.write(framed)
        except Exception as e:
            raise PreprocessError(f"writing {self.path} failed: {type(e).__name__}: {e}") from e
        if self.digest is not None:
            self.digest.update(framed)
        offset, self.offset = self.offset, self.offset + len(framed)
        return offset, len(framed)

    def sha256(self) -> str:
        return self.digest.hexdigest()

    def close(self) -> None:
        try:
            self.stream.close()
        except Exception as e:
            raise PreprocessError(f"writing {self.path} failed: {type(e).__name__}: {e}") from e


def remove_spill(output: str) -> None:
    """Deletes OUTPUT/.tmp/ once every shard is written (and before the manifest, which marks completion)."""
    spill_files = [m.path for m in FileSystems.match([manifest.join(output, SPILL_DIR, "*")])[0].metadata_list]
    if spill_files:
        FileSystems.delete(spill_files)
    spill_dir = manifest.join(output, SPILL_DIR)
    if _is_local(output) and os.path.isdir(spill_dir):
        os.rmdir(spill_dir)


SPILL_READ_THREADS = 8  # remote spill reads are latency-bound: overlap them
SPILL_READ_AHEAD = 32  # remote records in flight per shard writer: what it holds at most, besides the one it writes
_spill_readers = None  # created once per process, see _spill_read_pool
_spill_readers_lock = threading.Lock()


def _open_for_record_reads(path: str, largest_record: int):
    """A read stream whose buffering fits single-record reads.

    Beam's GCS reader otherwise fetches 16 MiB (its default buffer) for every read that misses its buffer; a
    shard writer's records are scattered through each spill file, so that would read ~80x the data.
    """
    if FileSystems.get_scheme(path) == "gs":
        gcs = FileSystems.get_filesystem(path)._gcsIO()  # noqa: SLF001 - the only way to set Beam's buffer size
        return gcs.open(path, "rb", read_buffer_size=max(largest_record, 64 * 1024))
    return FileSystems.open(path, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED)


def _spill_read_pool() -> ThreadPoolExecutor:
    # One pool for the process, not one per shard: glibc gives new threads their own malloc arenas and keeps what
    # they freed, so fresh threads for every shard left a worker holding about one shard per arena.
    global _spill_readers
    with _spill_readers_lock:
        if _spill_readers is None:
            _spill_readers = ThreadPoolExecutor(max_workers=SPILL_READ_THREADS, thread_name_prefix="spill-read")
    return _spill_readers


def iter_spilled(pointers):
    """The framed records at ``pointers`` ((spill file, offset, size), ...), one at a time, in the order given.

    A shard writer thus holds a few records, not its shard (up to ~200 MB by default). Local spill files are read
    with ``os.pread`` from the page cache; remote ones (gs://) with record-sized reads on the process's thread pool,
    at most SPILL_READ_AHEAD records ahead of the writer.
    """
    pointers = list(pointers)
    if not pointers:
        return
    if _is_local(pointers[0][0]):
        yield from _iter_local_spilled(pointers)
        return
    largest = {}
    for path, _, size in pointers:
        largest[path] = max(largest.get(path, 0), size)
    streams, streams_lock = {}, threading.Lock()  # one open stream per (thread, spill file), closed at the end

    def read(path: str, offset: int, size: int) -> bytes:
        stream_key = (threading.get_ident(), path)
        with streams_lock:
            stream = streams.get(stream_key)
        if stream is None:
            stream = _open_for_record_reads(path, largest[path])
            with streams_lock:
                streams[stream_key] = stream
        stream.seek(offset)
        data = stream.read(size)
        if len(data) != size:
            raise PreprocessError(f"spill file {path} is shorter than expected (offset {offset})")
        return data

    pool, pending = _spill_read_pool(), collections.deque()
    try:
        for pointer in pointers:
            pending.append(pool.submit(read, *pointer))
            if len(pending) >= SPILL_READ_AHEAD:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        for future in pending:
            with contextlib.suppress(Exception):
                future.result()
        for stream in streams.values():
            with contextlib.suppress(Exception):
                stream.close()


def _iter_local_spilled(pointers):
    descriptors = {}
    try:
        for path, offset, size in pointers:
            descriptor = descriptors.get(path)
            if descriptor is None:
                try:
                    descriptor = descriptors[path] = os.open(path, os.O_RDONLY)
                except OSError as e:
                    raise PreprocessError(f"cannot read spill file {path}: {e}") from e
            data = os.pread(descriptor, size, offset)
            if len(data) != size:
                raise PreprocessError(f"spill file {path} is shorter than expected (offset {offset})")
            yield data
    finally:
        for descriptor in descriptors.values():
            os.close(descriptor)


def _read_file(path: str) -> bytes:
    if _is_local(path) and os.path.exists(path) and not os.path.isfile(path):
        raise image_ops.RejectError("unreadable", "not a regular file (a pipe, socket or device)")
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return f.read()
    except (OSError, IOError) as e:
        raise image_ops.RejectError("unreadable", f"{type(e).__name__}: {e}") from None


# --- sharding ----------------------------------------------------------------------------------------------

def bucket_pointers(pointers: record_pointers.RecordPointers, sizes: dict):
    """((split, bucket), pointers of this element in that bucket) for every bucket its sort keys fall in."""
    for bucket, part in pointers.by_bucket(sharding.num_buckets(sizes[pointers.split])).items():
        yield (pointers.split, bucket), part


class FindShardBoundaries(beam.DoFn):
    """For one bucket of sort keys, emits the sort keys that start a part (a shard, or a decode group) and fall in
    this bucket.

    Buckets are hash ranges of about BUCKET_TARGET records, so no worker ever sorts more than one bucket of keys
    (sort keys only, not images) whatever the dataset size.
    """

    def __init__(self, metric_name: str):
        # Keys sorted per call: shows that this work stays about BUCKET_TARGET however large the dataset.
        self.bucket_keys = beam.metrics.Metrics.distribution(METRICS_NAMESPACE, metric_name)

    def process(self, element, sizes, parts, bucket_sizes):
        (split, bucket), chunks = element
        keys = record_pointers.sorted_sort_keys(chunks)
        self.bucket_keys.update(len(keys))
        first_rank = sum(n for (s, b), n in bucket_sizes.items() if s == split and b < bucket)
        for part, rank in enumerate(sharding.boundary_ranks(sizes[split], parts[split]), start=1):
            if first_rank <= rank < first_rank + len(keys):
                high, low = keys[rank - first_rank]
                yield split, (part, (int(high), int(low)))


class RankBoundaries(beam.PTransform):
    """{split: sort keys starting parts 1..P-1} (a singleton) for sort keys given as RecordPointers.

    ``sizes`` and ``parts`` are side inputs {split: records} and {split: parts}; part k of a split holds ranks r
    with r * P // N == k, so parts differ in size by at most one.
    """

    def __init__(self, sizes, parts, metric_name: str):
        super().__init__()
        self.sizes, self.parts, self.metric_name = sizes, parts, metric_name

    def expand(self, pointers):
        bucketed = pointers | "BucketSortKeys" >> beam.FlatMap(bucket_pointers, self.sizes)
        bucket_sizes = (bucketed
                        | "BucketSize" >> beam.Map(lambda kv: (kv[0], len(kv[1])))
                        | "CountBuckets" >> beam.CombinePerKey(sum))
        return (bucketed
                | "GroupBuckets" >> beam.GroupByKey()
                | "FindShardBoundaries" >> beam.ParDo(FindShardBoundaries(self.metric_name), self.sizes, self.parts,
                                                      beam.pvalue.AsDict(bucket_sizes))
                | "CollectBoundaries" >> beam.CombineGlobally(beam.combiners.ToListCombineFn()).without_defaults()
                | "BoundariesBySplit" >> beam.Map(sharding.collect_boundaries))


def assign_shards(pointers: record_pointers.RecordPointers, boundaries):
    """((split, shard), pointers of this element in that shard), given every split's sorted shard-start keys."""
    for shard, part in pointers.by_shard(boundaries.get(pointers.split, ())).items():
        yield (pointers.split, shard), part


def add_sort_keys(keys: dict, items, seed: int) -> dict:
    """Appends every input's sort key to ``keys[split]`` (RecordPointers; offset: the input's index in ``items``)."""
    for index, (split, key, _, _, _) in enumerate(items):
        if split not in keys:
            keys[split] = record_pointers.RecordPointers(split, "")
        keys[split].append(sharding.sort_key(seed, split, key), index, 0)
    return keys


class InputSortKeys(beam.DoFn):
    """The sort keys of the listed inputs, one RecordPointers per split and bundle (offsets unused)."""

    def __init__(self, seed: int):
        self.seed = seed

    def start_bundle(self):
        self.keys: dict[str, record_pointers.RecordPointers] = {}

    def process(self, batch: sources.InputBatch):
        add_sort_keys(self.keys, batch, self.seed)

    def finish_bundle(self):
        for split in sorted(self.keys):
            yield GlobalWindows.windowed_value(self.keys[split])


class AssignDecodeGroups(beam.DoFn):
    """((split, decode group), InputBatch of the bundle's inputs in that group), given every split's group-start
    sort keys: one element per group and bundle, whatever the number of inputs."""

    def __init__(self, seed: int):
        self.seed = seed

    def start_bundle(self):
        # Per group, the bundle's inputs as NUL-separated text (key, label, path): on the local runner a bundle is
        # a worker's whole share, and a tuple of strings per input would make its memory grow with the dataset.
        self.groups: dict[tuple[str, int], bytearray] = {}

    def process(self, batch: sources.InputBatch, boundaries):
        items = list(batch)
        for split, split_keys in add_sort_keys({}, items, self.seed).items():
            for group, part in split_keys.by_shard(boundaries.get(split, ())).items():
                packed = self.groups.setdefault((split, group), bytearray())
                for _, index, _ in part.pointers():
                    _, key, label, path, _ = items[index]
                    packed += f"{key}\0{label}\0{path or ''}\0".encode("utf-8")

    def finish_bundle(self):
        for split, group in sorted(self.groups):
            fields = self.groups.pop((split, group)).decode("utf-8").split("\0")[:-1]
            items = [(split, fields[i], int(fields[i + 1]), fields[i + 2] or None, None)
                     for i in range(0, len(fields), 3)]
            yield GlobalWindows.windowed_value(((split, group), sources.InputBatch(items)))


def uses_fixed_layout(config: PreprocessConfig) -> bool:
    """Raw centre crops are all S*S*3 bytes, so their records get one length (record_format.FixedLayout)."""
    return config.encoding == "raw" and config.crop == "center"


def record_key_bounds(item) -> tuple[str, tuple[int, int, int]]:
    """(split, (filename bytes, filename bytes, label)) of a listed input, combined into a split's layout bounds."""
    split, key, label, _, _ = item
    length = len(key.encode("utf-8"))
    return split, (length, length, label)


def merge_key_bounds(bounds) -> tuple[int, int, int]:
    """(shortest filename, longest filename, largest label), in bytes."""
    bounds = list(bounds)
    return min(b[0] for b in bounds), max(b[1] for b in bounds), max(b[2] for b in bounds)


def fixed_layout(split_bounds, side: int) -> tuple[str, record_format.FixedLayout]:
    split, (shortest, longest, max_label) = split_bounds
    return split, record_format.FixedLayout.for_records(side, side, (shortest, longest), max_label)


def tfrecord_layouts(config: PreprocessConfig, plan: SourcePlan) -> dict:
    """Fixed layouts of a TFRecord source's splits, from bounds known before reading: keys are ``FILE:INDEX``."""
    if not uses_fixed_layout(config):
        return {}
    max_label = len(plan.classes) - 1 if plan.classes else (1 << 63) - 1
    names: dict[str, list[int]] = {}
    for split, path in plan.tfrecord_files:
        names.setdefault(split, []).append(len(path.rsplit("/", 1)[-1].encode("utf-8")))
    index_digits = len(str((1 << 63) - 1))
    return {split: record_format.FixedLayout.for_records(
                config.shorter_side, config.shorter_side, (min(lengths) + 2, max(lengths) + 1 + index_digits), max_label)
            for split, lengths in names.items()}


def decode_group_counts(counted, layouts: dict, requested: int | None, min_groups: int):
    """(split, decode groups) from (split, inputs); a split with a fixed layout knows its bytes up front."""
    split, num_inputs = counted
    layout = layouts.get(split)
    predicted_bytes = num_inputs * layout.record_bytes if layout is not None else None
    return split, sharding.decode_groups(num_inputs, predicted_bytes, requested, min_groups)


class WriteShard(beam.DoFn):
    """Writes one shard: records sorted by their seeded key, under a temporary name, renamed when complete.

    A shard that is exactly one decode group's file (same records, already in seeded order and hashed) is that
    file, renamed into place (copied on remote storage, where the spill files are deleted later): written once.
    """

    def __init__(self, output: str, requested_shards: int | None):
        self.output, self.requested_shards = output, requested_shards
        self.adopted = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "shards_renamed_from_decode_groups")

    def process(self, element, summary, layouts):
        (split, shard), parts = element
        parts = list(parts)
        shards = sharding.num_shards_for(summary.examples[split], summary.bytes[split], self.requested_shards)
        if len(parts) == 1 and parts[0].is_whole_sorted_file():
            self.adopted.inc()
            yield adopt_spill_file(self.output, split, shard, shards, parts[0])
            return
        records = iter_spilled(record_pointers.merge_sorted_pointers(parts))
        layout = layouts.get(split)
        if layout is not None:
            records = layout.shard_records(records)  # only the shard's last record ends with the longer padding
        yield write_shard_file(self.output, split, shard, shards, records)


def adopt_spill_file(output: str, split: str, shard: int, shards: int, part: record_pointers.RecordPointers) -> dict:
    """Moves a decode group's file into place as a shard and returns its manifest entry (from the file's hash)."""
    relative = manifest.shard_path(split, shard, shards)
    final = manifest.join(output, relative)
    try:
        if _is_local(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            FileSystems.rename([part.spill_path], [final])
        else:  # a copy inside the bucket; a retried writer finds the spill file still there
            FileSystems.copy([part.spill_path], [final])
    except Exception as e:
        raise PreprocessError(f"writing shard {final} failed: {type(e).__name__}: {e}") from e
    num_examples, num_bytes, sha256 = part.file_info
    return {"split": split, "index": shard, "file": relative, "num_examples": num_examples,
            "num_bytes": num_bytes, "sha256": sha256}


def write_shard_file(output: str, split: str, shard: int, shards: int, framed_records) -> dict:
    """Writes already framed records (any iterable) as a shard via a temporary file; returns its manifest entry."""
    relative = manifest.shard_path(split, shard, shards)
    final = manifest.join(output, relative)
    temporary = manifest.join(output, split, f".tmp-{uuid.uuid4().hex}-{manifest.shard_name(split, shard, shards)}")
    digest, num_bytes, num_examples = hashlib.sha256(), 0, 0
    try:
        with FileSystems.create(temporary, mime_type="application/octet-stream",
                                compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for framed in framed_records:
                f.write(framed)
                digest.update(framed)
                num_bytes += len(framed)
                num_examples += 1
        FileSystems.rename([temporary], [final])
    except Exception as e:
        with contextlib.suppress(Exception):
            FileSystems.delete([temporary])
        raise PreprocessError(f"writing shard {final} failed: {type(e).__name__}: {e}") from e
    return {"split": split, "index": shard, "file": relative, "num_examples": num_examples,
            "num_bytes": num_bytes, "sha256": digest.hexdigest()}


# --- rejects and manifest ----------------------------------------------------------------------------------

def write_rejects(rejects: list, output: str) -> dict:
    """Writes OUTPUT/rejects.jsonl (sorted by split and key) and returns {split: {reason: count}}."""
    summary: dict[str, dict[str, int]] = {}
    lines = []
    for split, key, reason, detail in sorted(rejects):
        summary.setdefault(split, {}).setdefault(reason, 0)
        summary[split][reason] += 1
        lines.append(json.dumps({"key": key, "split": split, "reason": reason, "detail": detail}) + "\n")
    path = manifest.join(output, manifest.REJECTS_NAME)
    try:
        with FileSystems.create(path, mime_type="application/json",
                                compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write("".join(lines).encode("utf-8"))
    except Exception as e:
        raise PreprocessError(f"writing {path} failed: {type(e).__name__}: {e}") from e
    return summary


class WriteManifest(beam.DoFn):
    """Checks that every input is accounted for, then writes OUTPUT/manifest.json, the last file of the job."""

    def __init__(self, config: PreprocessConfig, plan: SourcePlan, runner: str):
        self.config, self.plan, self.runner = config, plan, runner

    def process(self, _, shard_entries, input_counts, summary, reject_summary, layouts):
        document = build_manifest(self.config, self.plan, self.runner, shard_entries, input_counts, summary,
                                  reject_summary, layouts)
        remove_spill(self.config.output)
        path = manifest.join(self.config.output, manifest.MANIFEST_NAME)
        # Written under a temporary name, then renamed: a failed write (a full disk) leaves no manifest at all,
        # never an empty or partial one where readers look for the mark of a complete dataset.
        temporary = manifest.join(self.config.output, f".tmp-{uuid.uuid4().hex}-{manifest.MANIFEST_NAME}")
        try:
            with FileSystems.create(temporary, mime_type="application/json",
                                    compression_type=CompressionTypes.UNCOMPRESSED) as f:
                f.write(manifest.to_json(document).encode("utf-8"))
            FileSystems.rename([temporary], [path])
        except Exception as e:
            with contextlib.suppress(Exception):
                FileSystems.delete([temporary])
            raise PreprocessError(f"writing {path} failed: {type(e).__name__}: {e}") from e
        yield document


def build_manifest(config: PreprocessConfig, plan: SourcePlan, runner: str, shard_entries, input_counts,
                   summary: sharding.RecordSummary, reject_summary, layouts: dict | None = None) -> dict:
    """The manifest document; raises PreprocessError if any input is unaccounted for or --strict saw rejects."""
    classes = list(plan.classes) if plan.classes is not None else [str(i) for i in range(summary.max_label + 1)]
    counts_by_split: dict[str, dict[int, int]] = {}
    for (split, label), n in summary.classes.items():
        counts_by_split.setdefault(split, {})[label] = n
    shards_by_split: dict[str, list[dict]] = {}
    for entry in shard_entries:
        shards_by_split.setdefault(entry["split"], []).append(entry)

    splits, problems = {}, []
    for split in plan.splits:
        label_counts = counts_by_split.get(split, {})
        num_examples = sum(label_counts.values())
        rejected = reject_summary.get(split, {})
        num_rejected = sum(rejected.values())
        num_inputs = input_counts.get(split, 0)
        if num_examples + num_rejected != num_inputs:
            problems.append(f"split {split}: {num_inputs} inputs but {num_examples} written + {num_rejected} rejected")
        entries = sorted(shards_by_split.get(split, []), key=lambda e: e["index"])
        if not entries:  # a split whose every input was rejected still gets its (empty) shard
            entries = [write_shard_file(config.output, split, 0, 1, [])]
        if sum(e["num_examples"] for e in entries) != num_examples:
            problems.append(f"split {split}: shards hold {sum(e['num_examples'] for e in entries)} records, "
                            f"expected {num_examples}")
        splits[split] = {
            "num_inputs": num_inputs,
            "num_examples": num_examples,
            "num_rejected": num_rejected,
            "rejected_by_reason": dict(sorted(rejected.items())),
            "class_counts": {name: label_counts.get(i, 0) for i, name in enumerate(classes)},
            "num_shards": len(entries),
            "shards": [{k: e[k] for k in ("file", "num_examples", "num_bytes", "sha256")} for e in entries],
        }
        if (layouts or {}).get(split) is not None:
            splits[split]["record_layout"] = layouts[split].to_json()
    extra_splits = set(reject_summary) - set(plan.splits)
    if extra_splits:
        problems.append(f"rejects for unknown splits {sorted(extra_splits)}")
    if problems:
        raise PreprocessError("inputs are not all accounted for, no manifest written: " + "; ".join(problems))
    total_rejected = sum(s["num_rejected"] for s in splits.values())
    if config.strict and total_rejected:
        reasons: dict[str, int] = {}
        for by_reason in reject_summary.values():
            for reason, n in by_reason.items():
                reasons[reason] = reasons.get(reason, 0) + n
        raise PreprocessError(
            f"--strict: {total_rejected} inputs rejected ({', '.join(f'{r}: {n}' for r, n in sorted(reasons.items()))}); "
            f"see {manifest.join(config.output, manifest.REJECTS_NAME)}. No manifest written.")

    mean, std = sharding.pixel_statistics(summary.pixel_sums)
    square = config.crop == "center"
    return {
        "format_version": manifest.FORMAT_VERSION,
        "tool": "shardprep",
        "tool_version": _tool_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "source": config.source,
        "source_kind": plan.kind,
        "options": {**dataclasses.asdict(config), "runner": runner},
        "classes": classes,
        "num_classes": len(classes),
        "encoding": config.encoding,
        "jpeg_quality": config.jpeg_quality if config.encoding == "jpeg" else None,
        "shorter_side": config.shorter_side,
        "crop": config.crop,
        "image_height": config.shorter_side if square else None,
        "image_width": config.shorter_side if square else None,
        "channels": record_format.CHANNELS,
        "seed": config.seed,
        "splits": splits,
        "num_inputs": sum(s["num_inputs"] for s in splits.values()),
        "num_examples": sum(s["num_examples"] for s in splits.values()),
        "num_rejected": total_rejected,
        "rejects_file": manifest.REJECTS_NAME,
        "stats_split": plan.stats_split,
        "mean_rgb": mean,
        "std_rgb": std,
    }


def _tool_version() -> str:
    from shardprep import __version__

    return __version__


# --- the graph ---------------------------------------------------------------------------------------------

def build_pipeline(p: beam.Pipeline, config: PreprocessConfig, plan: SourcePlan, runner: str = "",
                   progress_dir: str | None = None, min_decode_groups: int = DEFAULT_MIN_DECODE_GROUPS):
    """Adds the preprocess stages to ``p``; returns the PCollection holding the manifest document.

    ``min_decode_groups``: the fewest groups a split's inputs are decoded in (each group is decoded by one worker):
    local runs pass twice their worker count.
    """
    class_index = {name: i for i, name in enumerate(plan.classes)} if plan.classes is not None else None
    listed, listing_rejects = _list_inputs(p, config, plan, class_index, progress_dir)

    batches = listed | "BatchInputs" >> beam.BatchElements(min_batch_size=INPUT_BATCH, max_batch_size=INPUT_BATCH)
    input_counts = (
        (listed | "InputSplit" >> beam.Map(lambda item: item[0]),
         listing_rejects | "ListingRejectSplit" >> beam.Map(lambda item: item[0]))
        | "InputSplits" >> beam.Flatten()
        | "CountInputs" >> beam.combiners.Count.PerElement())
    grouped = plan.kind not in ("tfds", "tfrecord")
    if grouped:
        # Inputs are decoded in groups of consecutive ranks of the seeded order, found from their sort keys before
        # decoding (the order depends on the keys only). Groups are shards when the shard count is known up front.
        inputs = batches | "PackInputs" >> beam.Map(sources.InputBatch)
        if uses_fixed_layout(config):
            layouts = beam.pvalue.AsDict(
                listed
                | "RecordKeyBounds" >> beam.Map(record_key_bounds)
                | "MergeKeyBounds" >> beam.CombinePerKey(merge_key_bounds)
                | "FixedLayouts" >> beam.Map(fixed_layout, config.shorter_side))
        else:
            layouts = beam.pvalue.AsSingleton(p | "NoFixedLayouts" >> beam.Create([{}]))
        group_counts = input_counts | "DecodeGroupCounts" >> beam.Map(
            decode_group_counts, layouts, config.num_shards, min_decode_groups)
        group_starts = (
            inputs
            | "InputSortKeys" >> beam.ParDo(InputSortKeys(config.seed))
            | "DecodeGroupBoundaries" >> RankBoundaries(beam.pvalue.AsDict(input_counts),
                                                        beam.pvalue.AsDict(group_counts),
                                                        "decode_group_bucket_keys"))
        to_decode = (inputs
                     | "AssignDecodeGroups" >> beam.ParDo(
                         AssignDecodeGroups(config.seed), beam.pvalue.AsSingleton(group_starts, default_value={}))
                     | "GroupInputs" >> beam.GroupByKey())
    else:
        # TFRecord inputs carry their image bytes: they are decoded where their file is read (SpreadFiles spread
        # the files over the workers) instead of every encoded image crossing the runner's shuffle.
        to_decode = batches
        layouts = beam.pvalue.AsSingleton(p | "FixedLayouts" >> beam.Create([tfrecord_layouts(config, plan)]))
    processed = (
        to_decode
        | "DecodeResizeEncode" >> beam.ParDo(
            DecodeResizeEncode(config.process_options, config.seed, plan.stats_split, config.output, progress_dir,
                               grouped=grouped), layouts
        ).with_outputs(REJECTS, DecodeResizeEncode.SUMMARY, main="records"))
    records = processed.records  # RecordPointers: one per decode group, or per bundle and split
    rejects = (listing_rejects, processed[REJECTS]) | "AllRejects" >> beam.Flatten()

    summary = (processed[DecodeResizeEncode.SUMMARY]
               | "SumRecords" >> beam.CombineGlobally(sharding.RecordSummary.merge).without_defaults())
    # Defaults in the views, not in the combines: a combine's default costs the local runner two more stages.
    summary_view = beam.pvalue.AsSingleton(summary, default_value=sharding.RecordSummary())
    examples = summary | "ExamplesPerSplit" >> beam.FlatMap(lambda total: total.examples.items())
    shard_counts = summary | "ShardsPerSplit" >> beam.FlatMap(
        lambda total, requested: [(split, sharding.num_shards_for(n, total.bytes[split], requested))
                                  for split, n in total.examples.items()], config.num_shards)
    boundaries = records | "ShardBoundaries" >> RankBoundaries(
        beam.pvalue.AsDict(examples), beam.pvalue.AsDict(shard_counts), "boundary_bucket_keys")
    shard_entries = (
        records
        | "AssignShards" >> beam.FlatMap(assign_shards, beam.pvalue.AsSingleton(boundaries, default_value={}))
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(config.output, config.num_shards), summary_view, layouts))
    reject_summary = (rejects
                      | "CollectRejects" >> beam.combiners.ToList()
                      | "WriteRejects" >> beam.Map(write_rejects, config.output))
    return (
        p
        | "ManifestTrigger" >> beam.Create([None])
        | "WriteManifest" >> beam.ParDo(
            WriteManifest(config, plan, runner),
            beam.pvalue.AsList(shard_entries),
            beam.pvalue.AsDict(input_counts),
            summary_view,
            beam.pvalue.AsSingleton(reject_summary),
            layouts))


def _list_inputs(p, config: PreprocessConfig, plan: SourcePlan, class_index, progress_dir):
    """(inputs, rejects found while listing) for the planned source."""
    if plan.kind in ("tfds", "tfrecord"):
        read = (p
                | "TFRecordFiles" >> beam.Create(list(plan.tfrecord_files), reshuffle=False)
                | "SpreadFiles" >> beam.Reshuffle()
                | "ListInputs" >> beam.ParDo(ReadTFRecordFile(
                    config.image_key, config.label_key, len(plan.classes) if plan.classes else None, progress_dir)
                ).with_outputs(REJECTS, main="inputs"))
        return read.inputs, read[REJECTS]

    root = sources.SourceSpec.parse(config.source).location
    class_listing = (p
                     | "ClassDirectories" >> beam.Create(list(plan.class_dirs), reshuffle=False)
                     | "SpreadDirectories" >> beam.Reshuffle()
                     | "ListInputs" >> beam.ParDo(ListClassDirectory(root, class_index, progress_dir)
                                                  ).with_outputs(REJECTS, main="inputs"))
    listed = class_listing.inputs
    if not plan.flat_dirs and not config.labels_file:
        return listed, class_listing[REJECTS]
    flat_listing = (p
                    | "FlatDirectories" >> beam.Create(list(plan.flat_dirs))
                    | "ListFlatFiles" >> beam.ParDo(ListFlatDirectory(root)).with_outputs(REJECTS, main="files"))
    flat_files = flat_listing.files
    if config.labels_file:
        label_rows = (p
                      | "ReadLabelsFile" >> beam.io.ReadFromText(config.labels_file, coder=beam.coders.StrUtf8Coder())
                      | "LabelRows" >> beam.ParDo(ParseLabelRows()))
    else:
        label_rows = p | "NoLabelsFile" >> beam.Create([])
    joined = ({"files": flat_files, "rows": label_rows}
              | "JoinLabels" >> beam.CoGroupByKey()
              | "LabelFlatFiles" >> beam.Map(lambda kv: (kv[0], (list(kv[1]["files"]), list(kv[1]["rows"]))))
              | "CheckLabels" >> beam.ParDo(JoinLabels(class_index or {}, plan.labels_split or config.split,
                                                        progress_dir)).with_outputs(REJECTS, main="inputs"))
    inputs = (listed, joined.inputs) | "AllInputs" >> beam.Flatten()
    listing_rejects = ((class_listing[REJECTS], flat_listing[REJECTS], joined[REJECTS])
                       | "AllListingRejects" >> beam.Flatten())
    return inputs, listing_rejects


class ParseLabelRows(beam.DoFn):
    """(labels key, (filename as written, label)) per CSV line of the labels file."""

    def process(self, text):
        for row in sources.parse_labels_csv(text):
            yield sources.labels_key(row.filename), (row.filename, row.label)


# --- running -----------------------------------------------------------------------------------------------

def run_job(config: PreprocessConfig, beam_args: list[str], on_progress=None) -> dict:
    """Runs the preprocess job to completion and returns the manifest it wrote.

    ``on_progress(counts)`` is called about twice a second during a local run with the workers' running counts
    (``listed``, ``processed``); remote runs report progress in their runner's own UI.
    """
    # Before anything under OUTPUT is created or deleted: apart from every input, a folder, only shardprep's files.
    storage.check_apart(config.output, storage.inputs_of(config.source, config.labels_file, config.tfds_data_dir))
    if config.source.startswith("tfrecord:"):
        storage.check_apart_from_glob(config.output, config.source[len("tfrecord:"):])
    plan = plan_source(config)
    storage.check_apart_from_files(config.output, [path for _, path in plan.tfrecord_files], "input TFRecord file")
    storage.check_output_path(config.output)
    storage.check_replaceable(config.output, config.overwrite)
    with output_lock(config.output):
        prepare_output(config.output, config.overwrite)
        return _run_pipeline(config, plan, beam_args, on_progress)


def _run_pipeline(config: PreprocessConfig, plan: SourcePlan, beam_args: list[str], on_progress) -> dict:
    from pipelines import runner as runners

    local = runners.is_local(beam_args)
    with progress.watching(local and on_progress is not None, on_progress, "shardprep-progress-") as progress_dir:
        try:
            p = runners.make_pipeline(beam_args)
            min_groups = DEFAULT_MIN_DECODE_GROUPS
            if local:  # two groups per worker process: each gets work, a group as a shard where there are enough
                min_groups = 2 * runners.local_workers(beam_args)
            build_pipeline(p, config, plan, runner=runners.runner_name(beam_args) or "FnApiRunner",
                           progress_dir=progress_dir, min_decode_groups=min_groups)
            with runners.worker_stderr_held(runners.uses_worker_processes(beam_args)):
                result = p.run()
                result.wait_until_finish()
        except PreprocessError:
            raise
        except Exception as e:  # noqa: BLE001 - Beam wraps worker errors; surface the root cause readably
            raise PreprocessError(_root_cause(e)) from e
    template = runners.template_location(beam_args)
    if template:
        return {"template_location": template}  # Dataflow only wrote a template; nothing ran yet
    return manifest.load(config.output)


def _root_cause(error: Exception) -> str:
    """Beam reports a worker failure as a long chain; the user needs its last line, e.g. a PreprocessError's."""
    text = str(error)
    if any(sign in text for sign in ("Channel closed prematurely", "Socket closed", "Worker subprocess exited")):
        return ("a Beam worker process stopped unexpectedly (killed, or out of memory); the output has no "
                "manifest and is not a dataset: rerun with --overwrite")
    for marker in ("PreprocessError: ",):
        if marker in text:
            return text.rsplit(marker, 1)[1].split("\n", 1)[0].split(" [while running")[0].strip()
    last = [line.strip() for line in text.splitlines() if line.strip()]
    return last[-1].split(" [while running")[0] if last else type(error).__name__


def run(argv: list[str] | None = None) -> dict:
    """Entry point like Beam's examples: ``run(["SOURCE", "OUTPUT", "--shorter-side", "128", "--", ...])``."""
    from shardprep.commands.preprocess import command

    return command.main(args=list(argv or []), prog_name="shardprep preprocess", standalone_mode=False)
