"""The preprocess job: decode, convert, resize and re-shard a source of images into uniform TFRecord shards.

This module holds the graph (``build_pipeline``, read it top to bottom), the planning and listing that precede it
and ``run_job``. Each stage of the graph is a composite transform in a module of its own (labels as in the Beam
graph; element types in ``shardprep.preprocess.elements``, ``shardprep.preprocess.record_pointers``, ``shardprep.preprocess.sharding``)::

    ListInputs            listing here (class directories, labels file), or read_tfrecords (ReadTFRecordFile) ->
                          Input, Reject
    CountInputs           manifest_writer: (Input, Reject) -> (split, inputs); the accounting check's other half
    BatchInputs           Input -> [Input], so the runner handles one element per batch, not per image
    FixedLayouts          layouts: raw centre crops: Input -> (split, record_format.FixedLayout), the one record
                          length fitting every listed key and label; it makes the split's bytes known before decoding
    DecodeGroups          decode_groups: [Input] -> ((split, group), [InputBatch]); the inputs' SortKeys ranked
                          (DecodeGroupBoundaries, as ShardBoundaries below) into decode groups: the shards when their
                          count is known before decoding (--num-shards, or raw centre crops), else pieces of them, at
                          least two groups per local worker. Files only: TFRecord inputs are decoded where their file
                          was read, the files having been spread
    DecodeResizeEncode    decode: preprocess.image_ops.process_image, a group's inputs in seeded order; records go to
                          the group's file under OUTPUT/.tmp/ (spill, hashed as written), and only pointers go on (one
                          RecordPointers per group), with the bundles' RecordSummary summed (SumRecords: per split
                          examples, bytes, class counts; mean/std sums); bad inputs become Rejects
    ShardBoundaries       boundaries: RecordPointers -> {split: shard-start sort keys}, exact rank boundaries of the
                          seeded order from sort keys grouped in bounded hash-range buckets
    WriteShards           shards: RecordPointers -> shard entries. AssignShards cuts each group's pointers by the
                          shard their rank falls in (uniform: sizes differ by at most one); one worker per shard: a
                          shard that is exactly one group's file is that file, renamed (written once); any other is
                          streamed from its groups' files in seeded order (fixed-layout records re-padded so that only
                          its last is a shard's end), written under a temporary name and renamed
    WriteRejects          manifest_writer: Reject -> OUTPUT/rejects.jsonl, {split: {reason: count}}
    WriteManifest         manifest_writer: OUTPUT/manifest.json (build_manifest here), last, only when every input is
                          accounted for

Order and sharding depend only on the inputs, the options and ``--seed`` (a record's sort key is a hash of the seed,
its split and its source key), so shards are byte-identical whatever the number or speed of workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines import progress, storage
from shardprep.pipelines.storage import is_local, output_lock, prepare_output
from shardprep.pipelines.boundaries import ShardBoundaries
from shardprep.pipelines.common import METRICS_NAMESPACE, PreprocessError  # noqa: F401 - part of this module's interface
from shardprep.pipelines.decode import DecodeBundle, DecodeGroup, DecodeResizeEncode
from shardprep.pipelines.decode_groups import DecodeGroups
from shardprep.pipelines.layouts import FixedLayouts, tfrecord_layouts, uses_fixed_layout
from shardprep.pipelines.manifest_writer import CountInputs, WriteManifest, WriteRejects
from shardprep.pipelines.read_tfrecords import ReadTFRecordFile
from shardprep.pipelines.shards import WriteShards, write_shard_file
from shardprep.preprocess import accounting, image_ops, labels, limits, manifest, names, record_format, sharding, sources


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
    skipped: tuple[tuple[str, str, str, str], ...] = ()  # rejects of entries the planning skipped (hidden ones)
    label_rows: tuple[tuple[str, tuple[str, str]], ...] = ()  # (casefolded file name, (filename, label)) per row

    @property
    def stats_split(self) -> str:
        return "train" if "train" in self.splits else self.splits[0]


# --- planning (runs on the launching machine) --------------------------------------------------------------

def list_children(path: str) -> tuple[list[str], list[str], list[tuple[str, bool]]]:
    """(sub-directory names, file names, (hidden name, is a directory)) directly inside ``path``, sorted."""
    if is_local(path):
        if not os.path.isdir(path):
            raise sources.SourceError(f"{path} is not a directory")
        entries = sorted(os.scandir(path), key=lambda e: e.name)
        dirs = [e.name for e in entries if e.is_dir() and not sources.is_hidden(e.name)]
        files = [e.name for e in entries if not e.is_dir() and not sources.is_hidden(e.name)]
        return dirs, files, [(e.name, e.is_dir()) for e in entries if sources.is_hidden(e.name)]
    # Object stores have no directories; TensorFlow's file system lists one level with a delimiter query.
    import tensorflow as tf

    if not tf.io.gfile.isdir(path):
        raise sources.SourceError(f"{path} is not a directory")
    # On gs:// every sub-directory (a common prefix) comes back with a trailing "/", so no entry needs a probe; a
    # probe per file would be a request per file (50,000 for ImageNet's flat val/ folder) before the job starts.
    marks_directories = FileSystems.get_scheme(path) == "gs"
    dirs, files, hidden = [], [], []
    for name in sorted(tf.io.gfile.listdir(path)):
        clean = name.rstrip("/")
        if sources.is_hidden(clean):
            hidden.append((clean, name.endswith("/")))
            continue
        is_dir = name.endswith("/") or (not marks_directories and tf.io.gfile.isdir(manifest.join(path, clean)))
        (dirs if is_dir else files).append(clean)
    return dirs, files, hidden


def _read_labels_file(path: str, flat_dirs) -> list[sources.LabelRow]:
    """The labels file's rows, decoded and checked here, once: the pipeline gets these rows, not the file."""
    if not FileSystems.exists(path):
        raise sources.SourceError(f"labels file {path} does not exist")
    if is_local(path) and not os.path.isfile(path):
        raise sources.SourceError(f"labels file {path} is not a file (a folder?): give the CSV of filename,label")
    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            data = f.read()
    except Exception as e:  # noqa: BLE001 - unreadable for any reason: one line for the user
        raise sources.SourceError(f"cannot read labels file {path}: {type(e).__name__}: {e}") from None
    return labels.csv_rows(data, path, lambda name: any(FileSystems.exists(manifest.join(d, name)) for _, d in flat_dirs))


def plan_source(config: PreprocessConfig) -> SourcePlan:
    """Resolves SOURCE into splits, classes and the directories or files to read; refuses options that cannot work."""
    names.check(config.split, "split", "--split")
    if config.labels_split is not None:
        names.check(config.labels_split, "split", "--labels-split")
    limits.check_options(config.shorter_side, config.crop, config.encoding, config.max_pixels)
    spec = sources.SourceSpec.parse(config.source)
    if spec.kind == "folder":
        return _plan_folder(spec.location, config)
    if spec.kind == "tfds":
        return _plan_tfds(spec.location, config)
    return _plan_tfrecord(spec.location, config)


def _plan_folder(root: str, config: PreprocessConfig) -> SourcePlan:
    dirs, files, hidden = list_children(root)
    split_named = [d for d in dirs if d.lower() in sources.SPLIT_NAMES]
    if dirs and len(split_named) == len(dirs):
        split_dirs = [(d, manifest.join(root, d)) for d in dirs]
        if files:
            raise sources.SourceError(
                f"{root} holds split folders ({', '.join(dirs)}) and loose files ({files[0]}, ...): "
                "move the files into a split folder")
    else:
        nested = [d for d in split_named if list_children(manifest.join(root, d))[0]]
        if nested:  # train/<class>/ beside cat/: neither layout; refused rather than made classes "train" and "cat"
            raise accounting.mixed_layout_error(root, nested, [d for d in dirs if d not in split_named])
        split_dirs = [(config.split, root)]
    # Hidden entries at the top level go to the split they are in, or (beside split folders) to the first split.
    top_split = split_dirs[0][0] if split_dirs[0][1] == root else (
        "train" if "train" in dirs else split_dirs[0][0])
    skipped = [_skipped(root, top_split, manifest.join(root, name), is_dir) for name, is_dir in hidden]
    class_dirs, flat_dirs = [], []
    for split, directory in split_dirs:
        if directory != root:
            sub_dirs, sub_files, sub_hidden = list_children(directory)
            skipped += [_skipped(root, split, manifest.join(directory, name), is_dir) for name, is_dir in sub_hidden]
        else:
            sub_dirs, sub_files = dirs, files
        class_dirs += [(split, name, manifest.join(directory, name)) for name in sub_dirs]
        if sub_files:
            flat_dirs.append((split, directory))
    for _, name, directory in class_dirs:
        if not _is_utf8(name) or not _is_utf8(directory):
            raise sources.SourceError(
                f"the folder name {_printable(directory)} is not valid UTF-8; class and split names are stored as "
                "text in the records and the manifest: rename the folder")
        names.check(name, "class", f"the folder {names.printable(directory)}", "rename the folder")
    class_names = {name for _, name, _ in class_dirs}
    labels_split, label_rows = None, ()
    if config.labels_file:
        rows = _read_labels_file(config.labels_file, flat_dirs)
        class_names |= {row.label for row in rows}
        label_rows = tuple((sources.labels_key(row.filename).casefold(), (row.filename, row.label)) for row in rows)
        splits = [s for s, _ in split_dirs]
        labels_split = config.labels_split or next(
            (s for s in ("validation", "val", "test") if s in splits), None) or (
            flat_dirs[0][0] if flat_dirs else splits[0])
        if labels_split not in splits:
            raise sources.SourceError(f"--labels-split {labels_split} is not one of the splits {splits}")
    if not class_names:
        raise sources.SourceError(
            f"no classes found in {root}: expected SOURCE/<split>/<class>/<file>, SOURCE/<class>/<file>, "
            "or images with --labels-file" + (" (its images are not in class folders: did you forget --labels-file?)"
                                              if flat_dirs else ""))
    return SourcePlan(
        kind="folder",
        splits=tuple(s for s, _ in split_dirs),
        classes=tuple(sources.sort_class_names(class_names)),
        class_dirs=tuple(class_dirs),
        flat_dirs=tuple(flat_dirs),
        labels_split=labels_split,
        skipped=tuple(skipped),
        label_rows=label_rows,
    )


def _skipped(root: str, split: str, path: str, is_dir: bool) -> tuple[str, str, str, str]:
    reason = accounting.HIDDEN_FOLDER if is_dir else accounting.HIDDEN_FILE
    return accounting.skipped_reject(split, _printable(_relative_key(root, path)), reason)


def _plan_tfrecord(pattern: str, config: PreprocessConfig, classes=None, split_files=None) -> SourcePlan:
    if split_files is None:
        matched = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        if not matched:
            raise sources.SourceError(f"no files match {pattern}")
        split_files = [(sources.split_from_tfrecord_name(path) or config.split, path) for path in matched]
        classes = _class_names_beside(matched[0])
    for split, path in split_files:
        names.check(split, "split", f"the TFRecord file {path}")
    splits = tuple(dict.fromkeys(split for split, _ in split_files))
    return SourcePlan(kind="tfrecord", splits=splits, classes=tuple(classes) if classes else None,
                      tfrecord_files=tuple(split_files))


def _class_names_beside(path: str) -> list[str] | None:
    """TFDS writes ``label.labels.txt`` (one class name per line) next to its TFRecords."""
    directory = path.rsplit("/", 1)[0]
    matches = FileSystems.match([manifest.join(directory, "*labels.txt")])[0].metadata_list
    if not matches:
        return None
    path = sorted(m.path for m in matches)[0]
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        data = f.read()
    return labels.class_names_txt(data, path)


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
        paths, skipped = _list_files(directory, recursive=True)  # nested folders belong to the class too
        for path, reason in skipped:
            self.progress.add()
            yield beam.pvalue.TaggedOutput(
                REJECTS, accounting.skipped_reject(split, _printable(_relative_key(self.root, path)), reason))
        for path in paths:
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
        for path in _list_files(directory)[0]:  # hidden entries here became rejects when planning
            if not _is_utf8(path):
                yield _bad_file_name_reject(split, _relative_key(self.root, path))
            else:  # grouped with rows by case-folded name, so that names differing only in case are told apart
                yield sources.labels_key(path).casefold(), (split, _relative_key(self.root, path), path)


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


def _list_files(directory: str, recursive: bool = False) -> tuple[list[str], list[tuple[str, str]]]:
    """(the input files in ``directory`` and, when ``recursive``, its sub-folders; (path, reject reason) of what is
    not read: hidden files and folders, and links to folders inside it).

    Everything else that is not a folder is listed, links to missing files and special files included: reading them
    turns them into "unreadable" rejects instead of letting them vanish unseen.
    """
    if is_local(directory):
        return accounting.walk_local(directory, recursive)
    pattern = manifest.join(directory, "**" if recursive else "*")
    paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list if not m.path.endswith("/")]
    hidden = {path for path in paths if any(sources.is_hidden(part) for part in path[len(directory):].split("/"))}
    return sorted(set(paths) - hidden), sorted((path, accounting.HIDDEN_FILE) for path in hidden)


class JoinLabels(beam.DoFn):
    """Pairs flat images with their labels-file rows; a file without a row, or a row without a file, is a reject."""

    def __init__(self, class_index: dict[str, int], labels_split: str, progress_dir: str | None):
        self.class_index, self.labels_split, self.progress_dir = class_index, labels_split, progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, element):
        _, (files, rows) = element  # keyed by the case-folded file name
        for kind, *fields in labels.join(files, rows, self.labels_split):
            self.progress.add()
            if kind == "reject":
                yield beam.pvalue.TaggedOutput(REJECTS, fields[0])
            else:
                split, key, label, path = fields
                yield split, key, self.class_index[label], path, None

    def finish_bundle(self):
        self.progress.flush()


# --- the manifest document (pipelines.manifest_writer.WriteManifest writes it) -----------------------------


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

    empty = [problem for split in plan.splits if (problem := accounting.empty_run_problem(
        split, input_counts.get(split, 0), reject_summary.get(split, {}), config.labels_file, config.max_pixels))]
    if not empty and not sum(input_counts.values()):
        empty = [f"found no inputs in {config.source} (empty class folders, or TFRecords without records)"]
    if empty:
        raise PreprocessError(accounting.empty_run_message(empty, manifest.join(config.output, manifest.REJECTS_NAME)))
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
    # -> Input, Reject: class folders and the labels file listed, or TFRecord files read
    listed, listing_rejects = _list_inputs(p, config, plan, class_index, progress_dir)
    # (Input, Reject) -> (split, number of inputs): the accounting check's other half
    input_counts = (listed, listing_rejects) | "CountInputs" >> CountInputs()
    # Input -> [Input]: the runner handles one element per batch, not per image
    batches = listed | "BatchInputs" >> beam.BatchElements(min_batch_size=INPUT_BATCH, max_batch_size=INPUT_BATCH)
    # -> {split: FixedLayout} (side input; empty unless raw centre crops)
    layouts = _fixed_layouts(p, config, plan, listed)
    decoder_args = (config.process_options, config.seed, plan.stats_split, config.output, progress_dir)
    if plan.kind in ("tfds", "tfrecord"):
        # TFRecord inputs carry their image bytes: they are decoded where their file is read (SpreadFiles spread
        # the files over the workers) instead of every encoded image crossing the runner's shuffle.
        to_decode, decoder = batches, DecodeBundle(*decoder_args)
    else:
        # [Input] -> ((split, group), [InputBatch]): groups of consecutive ranks of the seeded order, found from the
        # inputs' sort keys before decoding; the shards themselves when the shard count is known up front.
        to_decode = batches | "DecodeGroups" >> DecodeGroups(config.seed, input_counts, layouts, config.num_shards,
                                                             min_decode_groups)
        decoder = DecodeGroup(*decoder_args)
    # -> {records: RecordPointers into spill files, rejects: Reject, summary: one RecordSummary}
    decoded = to_decode | "DecodeResizeEncode" >> DecodeResizeEncode(decoder, layouts)
    records = decoded["records"]
    # Defaults in the views, not in the combines: a combine's default costs the local runner two more stages.
    summary = beam.pvalue.AsSingleton(decoded["summary"], default_value=sharding.RecordSummary())
    # RecordPointers -> {split: sort keys starting shards 1..S-1}
    boundaries = records | "ShardBoundaries" >> ShardBoundaries(decoded["summary"], config.num_shards)
    # RecordPointers -> shard entries {split, index, file, num_examples, num_bytes, sha256}
    shard_entries = records | "WriteShards" >> WriteShards(config.output, config.num_shards, boundaries, summary,
                                                           layouts)
    # Reject -> {split: {reason: count}}, after OUTPUT/rejects.jsonl is written
    reject_summary = ((listing_rejects, decoded["rejects"])
                      | "AllRejects" >> beam.Flatten()
                      | "WriteRejects" >> WriteRejects(config.output))
    # -> the manifest document, OUTPUT/manifest.json written last
    return p | "WriteManifest" >> WriteManifest(
        config.output, functools.partial(build_manifest, config, plan, runner), beam.pvalue.AsList(shard_entries),
        beam.pvalue.AsDict(input_counts), summary, beam.pvalue.AsSingleton(reject_summary), layouts)


def _fixed_layouts(p, config: PreprocessConfig, plan: SourcePlan, listed):
    """{split: FixedLayout} as a side input: a folder's from its listed keys, a TFRecord source's from its file
    names; empty unless the records are raw centre crops."""
    if plan.kind in ("tfds", "tfrecord"):
        return beam.pvalue.AsSingleton(p | "FixedLayouts" >> beam.Create([tfrecord_layouts(config, plan)]))
    if uses_fixed_layout(config):
        return beam.pvalue.AsDict(listed | "FixedLayouts" >> FixedLayouts(config.shorter_side))
    return beam.pvalue.AsSingleton(p | "NoFixedLayouts" >> beam.Create([{}]))


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
    listed, class_rejects = class_listing.inputs, class_listing[REJECTS]
    if plan.skipped:  # hidden entries seen when planning
        class_rejects = ((class_rejects, p | "SkippedEntries" >> beam.Create(list(plan.skipped)))
                         | "ListingAndSkipped" >> beam.Flatten())
    if not plan.flat_dirs and not config.labels_file:
        return listed, class_rejects
    flat_listing = (p
                    | "FlatDirectories" >> beam.Create(list(plan.flat_dirs))
                    | "ListFlatFiles" >> beam.ParDo(ListFlatDirectory(root)).with_outputs(REJECTS, main="files"))
    flat_files = flat_listing.files
    # The rows decoded and checked when planning: the pipeline never reads the file a second, different way.
    label_rows = p | "LabelRows" >> beam.Create(list(plan.label_rows))
    joined = ({"files": flat_files, "rows": label_rows}
              | "JoinLabels" >> beam.CoGroupByKey()
              | "LabelFlatFiles" >> beam.Map(lambda kv: (kv[0], (list(kv[1]["files"]), list(kv[1]["rows"]))))
              | "CheckLabels" >> beam.ParDo(JoinLabels(class_index or {}, plan.labels_split or config.split,
                                                        progress_dir)).with_outputs(REJECTS, main="inputs"))
    inputs = (listed, joined.inputs) | "AllInputs" >> beam.Flatten()
    listing_rejects = ((class_rejects, flat_listing[REJECTS], joined[REJECTS])
                       | "AllListingRejects" >> beam.Flatten())
    return inputs, listing_rejects


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
    from shardprep.pipelines import runner as runners

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
