"""The ``tfrecord:GLOB`` and ``tfds:NAME[/CONFIG]`` kinds: TFRecords of ``tf.train.Example`` with an encoded image
and an int64 label (TFDS style), one task per file, keys ``FILE:INDEX``. TFDS is imported only on the launcher and
downloads only with ``--tfds-download``."""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

from shardprep.pipelines.sources.kind import (ApartFrom, GlobKind, KeyBounds, RecordFiles, SourcePlan, Usage,
                                             bounds_by_split, is_local, label_out_of_range, open_file,
                                             prefixed_location, read_head)
from shardprep.preprocess.sources import labels, common as sources
from shardprep.preprocess.format import manifest, record_format, tfrecord_io
from shardprep.preprocess.checks import names
from shardprep.preprocess.format.elements import Input, Reject

_MAX_INDEX_DIGITS = len(str((1 << 63) - 1))  # a record's index in its file, in a key FILE:INDEX


@dataclasses.dataclass(frozen=True)
class FilesPlan(SourcePlan):
    files: tuple[tuple[str, str], ...] = ()  # (split, file), read one per task


class TFRecordSource(GlobKind):
    name, prefix, example, what = "tfrecord", "tfrecord:", "DIR/*-train.tfrecord*", "a glob of TFRecord files"
    usage = (Usage("tfrecord:GLOB", "TFRecords of encoded images, TFDS style (image bytes, label int64)"),)
    options: tuple[str, ...] = ("image_key", "label_key")
    files_name, glob_name = "input TFRecord file", "input TFRecords"
    validated_as_records = True

    def plan(self, location: str, config) -> FilesPlan:
        matched = self.matched(location)
        split_files = [(sources.split_from_tfrecord_name(path) or config.split, path) for path in matched]
        return self.files_plan(location, split_files, class_names_beside(matched[0]))

    def files_plan(self, location: str, split_files, classes) -> FilesPlan:
        for split, path in split_files:
            names.check(split, "split", f"the TFRecord file {path}")
        splits = tuple(dict.fromkeys(split for split, _ in split_files))
        return FilesPlan(kind=self, location=location, splits=splits, classes=tuple(classes) if classes else None,
                         files=tuple(split_files))

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        return RecordFiles([location], None)

    def planned_files(self, plan: FilesPlan) -> list[str]:
        return [path for _, path in plan.files]

    def read_tasks(self, plan: FilesPlan) -> list[tuple[str, str]]:
        return list(plan.files)

    def task_reader(self, config, plan: FilesPlan) -> TFRecordFileReader:
        return TFRecordFileReader(config.image_key, config.label_key, len(plan.classes) if plan.classes else None)

    def planned_key_bounds(self, plan: FilesPlan) -> dict[str, KeyBounds]:
        """Keys ``FILE:INDEX``: from a file name with ``:0`` to one with an int64 index."""
        named = ((split, len(path.rsplit("/", 1)[-1].encode("utf-8"))) for split, path in plan.files)
        return bounds_by_split((split, n + 2, n + 1 + _MAX_INDEX_DIGITS, self.max_label(plan)) for split, n in named)


class TFDSSource(TFRecordSource):
    name, prefix, example, what = "tfds", "tfds:", "imagenette/320px-v2", "a dataset name"
    usage = (Usage("tfds:NAME[/CONFIG]", "a prepared TFDS dataset (--tfds-data-dir); never downloads without "
                                         "--tfds-download"),)
    options = ("tfds_data_dir", "tfds_download", "image_key", "label_key")

    def location(self, source: str) -> str:
        return prefixed_location(source, self.prefix, self.example, self.what, strip="/")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        data_dir = config.tfds_data_dir or os.environ.get("TFDS_DATA_DIR") or "~/tensorflow_datasets"
        if is_local(data_dir):
            data_dir = os.path.expanduser(data_dir)  # as TFDS reads it
        return [ApartFrom("TFDS data dir", data_dir)]

    def plan(self, location: str, config) -> FilesPlan:
        builder = tfds_builder(location, config.tfds_data_dir)
        if not builder.is_prepared():
            if not config.tfds_download:
                raise sources.SourceError(
                    f"TFDS dataset {location} is not prepared in {builder.data_dir}; prepare it there (tfds build) "
                    "or pass --tfds-download to download and prepare it now")
            builder.download_and_prepare()
        return self.files_plan(location, _prepared_files(location, builder), label_names(builder, config.label_key))

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        builder = tfds_builder(location, tfds_data_dir)
        if not builder.is_prepared():
            raise sources.SourceError(
                f"TFDS dataset {location} is not prepared in {builder.data_dir} and validate never downloads: "
                f"prepare it there (tfds build, or shardprep preprocess tfds:{location} OUTPUT --tfds-download), or "
                "pass --tfds-data-dir where it is prepared")
        files = sorted(path for _, path in _prepared_files(location, builder))
        return RecordFiles(files, label_names(builder, label_key))


def _prepared_files(location: str, builder) -> list[tuple[str, str]]:
    """(split, file) of every prepared file; a SourceError for none."""
    found = [(split, str(path)) for split, info in builder.info.splits.items() for path in info.filepaths]
    if not found:
        raise sources.SourceError(f"TFDS dataset {location} has no prepared files in {builder.data_dir}")
    return found


def tfds_builder(name: str, data_dir: str | None):
    """TFDS's builder of ``name`` in ``data_dir``, never looking on GCS; else a one-line SourceError."""
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except Exception as e:  # noqa: BLE001 - TFDS raises many kinds for unknown names and missing folders
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise sources.SourceError(f"TFDS dataset {name!r} cannot be loaded from "
                                  f"{data_dir or 'the default TFDS data dir'}: {detail}") from None


def label_names(builder, label_key: str) -> list[str] | None:
    features = builder.info.features
    return class_label_names(features[label_key], label_key) if label_key in features else None


def class_label_names(feature, label_key: str) -> list[str] | None:
    """The class names of a ClassLabel ``feature`` (else None), at most ``labels.MAX_CLASSES``."""
    count = getattr(feature, "num_classes", None)
    if isinstance(count, int) and count > labels.MAX_CLASSES:
        raise sources.SourceError(f"the TFDS feature {label_key!r} has {count:,} classes, more than the "
                                  f"{labels.MAX_CLASSES:,} shardprep takes")
    return list(getattr(feature, "names", None) or []) or None


def class_names_beside(path: str) -> list[str] | None:
    """TFDS writes ``label.labels.txt`` (one class name per line) next to its TFRecords."""
    from apache_beam.io.filesystems import FileSystems

    matches = FileSystems.match([manifest.join(path.rsplit("/", 1)[0], "*labels.txt")])[0].metadata_list
    if not matches:
        return None
    path = sorted(m.path for m in matches)[0]
    return labels.class_names_txt(read_head(path, labels.MAX_NAMES_BYTES + 1), path)


class TFRecordFileReader:
    """(split, file) -> an Input per record, or a Reject; after a bad length the rest of the file is one reject."""

    def __init__(self, image_key: str, label_key: str, num_classes: int | None):
        self.image_key, self.label_key, self.num_classes = image_key, label_key, num_classes

    def __call__(self, task: tuple[str, str]) -> Iterator[Input | Reject]:
        split, path = task
        name = path.rsplit("/", 1)[-1]
        index = 0
        try:
            with open_file(path) as stream:
                for index, serialized in enumerate(tfrecord_io.read_records(stream)):
                    yield self.record(split, f"{name}:{index}", serialized)
        except tfrecord_io.CorruptRecordError as e:
            yield Reject(split, f"{name}:{e.index}", "corrupt_record", f"{e}; the rest of {name} is unreadable")
        except OSError as e:
            yield Reject(split, f"{name}:{index}", "unreadable", f"{type(e).__name__}: {e}")

    def record(self, split: str, key: str, serialized: bytes) -> Input | Reject:
        try:
            features = record_format.parse_features(serialized)
        except record_format.RecordFormatError as e:
            return Reject(split, key, "bad_record", str(e))
        images, found = features.get(self.image_key), features.get(self.label_key)
        if not images or not isinstance(images[0], bytes):
            return Reject(split, key, "bad_record", f"no bytes feature {self.image_key!r}")
        if not found or not isinstance(found[0], int):
            return Reject(split, key, "bad_record", f"no int64 feature {self.label_key!r}")
        label = found[0]
        return label_out_of_range(split, key, label, self.num_classes) or Input(split, key, label, None, images[0])


TFRECORD = TFRecordSource()
TFDS = TFDSSource()
