"""Planning: SOURCE resolved into splits, classes and the directories or files to read, on the launching machine
before the pipeline starts (directories and files, never images), and options that cannot work refused.

``plan_source(config) -> SourcePlan``. A folder is listed one level at a time (``list_children``): SOURCE, then its
split folders; class folders are listed by the pipeline (``shardprep.pipelines.listing``). The labels file is read
and checked here, once. ``tfrecord:`` globs are matched here; ``tfds:`` names are resolved through TFDS. Launcher
only: ``list_children`` imports TensorFlow for ``gs://``, ``_plan_tfds`` imports TFDS.
"""

from __future__ import annotations

import dataclasses
import os

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.storage import is_local
from shardprep.preprocess import accounting, labels, limits, manifest, names, sources
from shardprep.preprocess.config import PreprocessConfig
from shardprep.preprocess.elements import Reject


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
    skipped: tuple[Reject, ...] = ()  # rejects of entries the planning skipped (hidden ones)
    label_rows: tuple[tuple[str, tuple[str, str]], ...] = ()  # (casefolded file name, (filename, label)) per row

    @property
    def stats_split(self) -> str:
        return "train" if "train" in self.splits else self.splits[0]


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


# --- folders -------------------------------------------------------------------------------------------------------

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

    try:
        listed = tf.io.gfile.listdir(path)
    except tf.errors.NotFoundError:  # what listdir says for every failure of its first probe: ask which it was
        raise _unlistable(path, tf) from None
    except tf.errors.OpError as e:
        raise sources.SourceError(listing_failure(path, e, tf)) from None
    # On gs:// every sub-directory (a common prefix) comes back with a trailing "/", so no entry needs a probe; a
    # probe per file would be a request per file (50,000 for ImageNet's flat val/ folder) before the job starts.
    marks_directories = FileSystems.get_scheme(path) == "gs"
    dirs, files, hidden = [], [], []
    for name in sorted(listed):
        clean = name.rstrip("/")
        if sources.is_hidden(clean):
            hidden.append((clean, name.endswith("/")))
            continue
        is_dir = name.endswith("/") or (not marks_directories and tf.io.gfile.isdir(manifest.join(path, clean)))
        (dirs if is_dir else files).append(clean)
    return dirs, files, hidden


def _unlistable(path: str, tf) -> sources.SourceError:
    """Why a remote ``path`` could not be listed: it is missing (or its bucket is), a file, or the store refused or
    could not be reached. ``tf.io.gfile.listdir`` and ``isdir`` turn every failure into "not a directory"; ``stat``
    keeps the store's answer."""
    try:
        is_directory = tf.io.gfile.stat(path).is_directory
    except tf.errors.NotFoundError:
        return sources.SourceError(f"{path} does not exist" + _missing_bucket(path, tf))
    except tf.errors.OpError as e:
        return sources.SourceError(listing_failure(path, e, tf))
    if not is_directory:
        return sources.SourceError(f"{path} is not a directory (it is a file)")
    return sources.SourceError(f"{path} could not be listed")


def _missing_bucket(path: str, tf) -> str:
    scheme, rest = path.split("://", 1)
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    if bucket == path:
        return ""
    try:
        tf.io.gfile.stat(bucket)
    except tf.errors.NotFoundError:
        return f": the bucket {bucket} does not exist"
    except tf.errors.OpError:
        pass
    return ""


def listing_failure(path: str, error: Exception, tf) -> str:
    """One line for a store that refused a listing or could not be reached (``error`` a ``tf.errors.OpError``)."""
    detail = (getattr(error, "message", "") or str(error)).strip().splitlines()
    detail = f" ({detail[0][:300]})" if detail else ""
    if isinstance(error, (tf.errors.PermissionDeniedError, tf.errors.UnauthenticatedError)):
        return (f"cannot list {path}: access denied{detail}; check the credentials (gcloud auth application-default "
                "login, or GOOGLE_APPLICATION_CREDENTIALS) and their permission on the bucket")
    if isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
        return f"cannot list {path}: the storage service could not be reached{detail}; check the network"
    return f"cannot list {path}: {type(error).__name__}{detail}"


def _plan_folder(root: str, config: PreprocessConfig) -> SourcePlan:
    dirs, files, hidden = list_children(root)
    split_dirs = _split_dirs(root, dirs, files, config.split)
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
    _check_class_dirs(class_dirs)
    class_names = {name for _, name, _ in class_dirs}
    labels_split, label_rows = None, ()
    if config.labels_file:
        rows = _read_labels_file(config.labels_file, flat_dirs)
        class_names |= {row.label for row in rows}
        label_rows = tuple((sources.labels_key(row.filename).casefold(), (row.filename, row.label)) for row in rows)
        labels_split = _labels_split(config.labels_split, [s for s, _ in split_dirs], flat_dirs)
    if not class_names:
        raise sources.SourceError(
            f"no classes found in {root}: expected SOURCE/<split>/<class>/<file>, SOURCE/<class>/<file>, "
            "or images with --labels-file" + (" (its images are not in class folders: did you forget --labels-file?)"
                                              if flat_dirs else ""))
    return SourcePlan(kind="folder", splits=tuple(s for s, _ in split_dirs),
                      classes=tuple(sources.sort_class_names(class_names)), class_dirs=tuple(class_dirs),
                      flat_dirs=tuple(flat_dirs), labels_split=labels_split, skipped=tuple(skipped),
                      label_rows=label_rows)


def _split_dirs(root: str, dirs: list[str], files: list[str], split: str) -> list[tuple[str, str]]:
    """(split, directory) of SOURCE: its split folders when every folder has a split name, else SOURCE as ``split``."""
    split_named = [d for d in dirs if d.lower() in sources.SPLIT_NAMES]
    if dirs and len(split_named) == len(dirs):
        if files:
            raise sources.SourceError(
                f"{root} holds split folders ({', '.join(dirs)}) and loose files ({files[0]}, ...): "
                "move the files into a split folder")
        return [(d, manifest.join(root, d)) for d in dirs]
    nested = [d for d in split_named if list_children(manifest.join(root, d))[0]]
    if nested:  # train/<class>/ beside cat/: neither layout; refused rather than made classes "train" and "cat"
        raise accounting.mixed_layout_error(root, nested, [d for d in dirs if d not in split_named])
    return [(split, root)]


def _check_class_dirs(class_dirs) -> None:
    """Class names become text in the records and the manifest: refuses folder names that cannot."""
    for _, name, directory in class_dirs:
        if not sources.is_utf8(name) or not sources.is_utf8(directory):
            raise sources.SourceError(
                f"the folder name {sources.printable_key(directory)} is not valid UTF-8; class and split names are "
                "stored as text in the records and the manifest: rename the folder")
        names.check(name, "class", f"the folder {names.printable(directory)}", "rename the folder")


def _labels_split(requested: str | None, splits: list[str], flat_dirs) -> str:
    """The split that labels-file rows naming no file are counted in."""
    labels_split = requested or next((s for s in ("validation", "val", "test") if s in splits), None) or (
        flat_dirs[0][0] if flat_dirs else splits[0])
    if labels_split not in splits:
        raise sources.SourceError(f"--labels-split {labels_split} is not one of the splits {splits}")
    return labels_split


def _skipped(root: str, split: str, path: str, is_dir: bool) -> Reject:
    reason = accounting.HIDDEN_FOLDER if is_dir else accounting.HIDDEN_FILE
    return accounting.skipped_reject(split, sources.printable_key(sources.source_key(root, path)), reason)


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
    return labels.csv_rows(data, path,
                           lambda name: any(FileSystems.exists(manifest.join(d, name)) for _, d in flat_dirs))


# --- TFRecord files and TFDS datasets --------------------------------------------------------------------------------

def _plan_tfrecord(pattern: str, config: PreprocessConfig, classes=None, split_files=None) -> SourcePlan:
    if split_files is None:
        matched = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
        if not matched:
            raise sources.SourceError(f"no files match {pattern}")
        split_files = [(sources.split_from_tfrecord_name(path) or config.split, path) for path in matched]
        classes = class_names_beside(matched[0])
    for split, path in split_files:
        names.check(split, "split", f"the TFRecord file {path}")
    splits = tuple(dict.fromkeys(split for split, _ in split_files))
    return SourcePlan(kind="tfrecord", splits=splits, classes=tuple(classes) if classes else None,
                      tfrecord_files=tuple(split_files))


def class_names_beside(path: str) -> list[str] | None:
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
        raise sources.SourceError(
            f"cannot load TFDS dataset {name!r} from {config.tfds_data_dir or 'the default data dir'}: {e}") from e
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
