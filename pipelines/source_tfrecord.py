"""The ``tfrecord:GLOB`` kind: TFRecords of ``tf.train.Example`` with an encoded image and an int64 label (TFDS style).

Planning matches the glob; each file's split comes from its TFDS-style name (``sources.split_from_tfrecord_name``,
else ``--split``), the class names from a ``label.labels.txt`` beside the files. The listing reads one file per task
where it lands (``TFRecordFileReader``): its records become Inputs carrying the image bytes, decoded there too, and
its bad records Rejects. Keys are ``FILE:INDEX``, so their bounds are known from the file names alone.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

from shardprep.pipelines.source_kind import (ApartFrom, KeyBounds, RecordFiles, SourceKind, SourcePlan, Usage,
                                             prefixed_location)
from shardprep.preprocess import labels, manifest, names, record_format, sources, tfrecord_io
from shardprep.preprocess.elements import Input, Reject

_WILDCARDS = "*?["
_MAX_INDEX_DIGITS = len(str((1 << 63) - 1))  # a record's index in its file, in a key FILE:INDEX
_MAX_LABEL = (1 << 63) - 1  # an int64 label, when no class names bound it


@dataclasses.dataclass(frozen=True)
class FilesPlan(SourcePlan):
    """A plan of files read one per task: ``files`` are (split, file) pairs."""

    files: tuple[tuple[str, str], ...] = ()


class TFRecordSource(SourceKind):
    name = "tfrecord"
    prefix = "tfrecord:"
    usage = (Usage("tfrecord:GLOB", "TFRecords of encoded images, TFDS style (image bytes, label int64)"),)
    options = ("image_key", "label_key")
    decoded_where_read = True
    validated_as_records = True

    def claims(self, source: str) -> bool:
        return source.startswith(self.prefix)

    def location(self, source: str) -> str:
        return prefixed_location(source, self.prefix, "DIR/*-train.tfrecord*", "a glob of TFRecord files")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        literal = [] if any(c in location for c in _WILDCARDS) else [ApartFrom("input TFRecord file", location)]
        return literal + [ApartFrom("input TFRecords", location, glob=True)]

    def plan(self, location: str, config) -> FilesPlan:
        from apache_beam.io.filesystems import FileSystems

        matched = sorted(m.path for m in FileSystems.match([location])[0].metadata_list)
        if not matched:
            raise sources.SourceError(f"no files match {location}")
        split_files = [(sources.split_from_tfrecord_name(path) or config.split, path) for path in matched]
        return self.files_plan(location, split_files, class_names_beside(matched[0]))

    def files_plan(self, location: str, split_files, classes) -> FilesPlan:
        """The plan of ``split_files`` ((split, file) pairs) whose labels are indices into ``classes`` (or None)."""
        for split, path in split_files:
            names.check(split, "split", f"the TFRecord file {path}")
        splits = tuple(dict.fromkeys(split for split, _ in split_files))
        return FilesPlan(kind=self, location=location, splits=splits, classes=tuple(classes) if classes else None,
                         files=tuple(split_files))

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        return RecordFiles([location], None)

    def resume_refusal(self, plan: SourcePlan) -> str | None:
        return f"{self.name} sources are decoded per bundle, whose contents depend on the runner: no unit of work " \
               "can be kept"

    def planned_inputs(self, plan: FilesPlan) -> list[ApartFrom]:
        return [ApartFrom("input TFRecord file", path, matched=True) for _, path in plan.files]

    def read_tasks(self, plan: FilesPlan) -> list[tuple[str, str]]:
        return list(plan.files)

    def task_reader(self, config, plan: FilesPlan) -> TFRecordFileReader:
        return TFRecordFileReader(config.image_key, config.label_key, len(plan.classes) if plan.classes else None)

    def planned_key_bounds(self, plan: FilesPlan) -> dict[str, KeyBounds]:
        """Keys ``FILE:INDEX``: from the shortest file name with ``:0`` to the longest with an int64 index."""
        max_label = len(plan.classes) - 1 if plan.classes else _MAX_LABEL
        lengths: dict[str, list[int]] = {}
        for split, path in plan.files:
            lengths.setdefault(split, []).append(len(path.rsplit("/", 1)[-1].encode("utf-8")))
        return {split: (min(found) + 2, max(found) + 1 + _MAX_INDEX_DIGITS, max_label)
                for split, found in lengths.items()}


def class_names_beside(path: str) -> list[str] | None:
    """TFDS writes ``label.labels.txt`` (one class name per line) next to its TFRecords."""
    from apache_beam.io.filesystems import FileSystems

    directory = path.rsplit("/", 1)[0]
    matches = FileSystems.match([manifest.join(directory, "*labels.txt")])[0].metadata_list
    if not matches:
        return None
    path = sorted(m.path for m in matches)[0]
    return labels.class_names_txt(read_head(path, labels.MAX_NAMES_BYTES + 1), path)


def read_head(path: str, at_most: int) -> bytes:
    """At most ``at_most`` bytes from the start of the small text file ``path`` (local or a URL): a local one only
    if it is a regular file (a FIFO would block, ``/dev/zero`` never end). ``sources.SourceError`` naming the file
    when it cannot be read."""
    import os

    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from shardprep.pipelines.storage import is_local
    from shardprep.preprocess import untrusted

    try:
        if is_local(path):
            with os.fdopen(untrusted.open_regular_file(path.removeprefix("file://")), "rb") as f:
                return f.read(at_most)
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            return f.read(at_most)
    except OSError as e:  # BeamIOError is one
        raise sources.SourceError(f"cannot read {path}: {e}") from None


class TFRecordFileReader:
    """(split, file) -> an Input per record of encoded image and int label; bad records become Rejects. The framing
    is lost after a bad length, so the rest of that file is one reject."""

    def __init__(self, image_key: str, label_key: str, num_classes: int | None):
        self.image_key, self.label_key, self.num_classes = image_key, label_key, num_classes

    def __call__(self, task: tuple[str, str]) -> Iterator[Input | Reject]:
        from apache_beam.io.filesystem import CompressionTypes
        from apache_beam.io.filesystems import FileSystems

        split, path = task
        name = path.rsplit("/", 1)[-1]
        index = 0
        try:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as stream:
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
        # Without class names the labels are the classes: at most labels.MAX_CLASSES of them.
        limit = self.num_classes if self.num_classes is not None else labels.MAX_CLASSES
        if not 0 <= found[0] < limit:
            return Reject(split, key, "label_out_of_range", f"label {found[0]} not in 0..{limit - 1}"
                          + ("" if self.num_classes is not None else " (no class names)"))
        return Input(split, key, found[0], None, images[0])


TFRECORD = TFRecordSource()
