"""The ``tfds:NAME[/CONFIG]`` kind: the TFRecords of a prepared TFDS dataset, found through TFDS (``--tfds-data-dir``,
else TFDS's own default), read as ``tfrecord:`` files are, with the class names of its label feature. It downloads
and prepares the dataset only with ``--tfds-download``; validate never does. TFDS is imported only in
``tfds_builder``, on the launching machine.
"""

from __future__ import annotations

import os

from shardprep.pipelines.source_kind import ApartFrom, RecordFiles, Usage, prefixed_location
from shardprep.pipelines.source_tfrecord import FilesPlan, TFRecordSource
from shardprep.preprocess import labels, sources


class TFDSSource(TFRecordSource):
    name = "tfds"
    prefix = "tfds:"
    usage = (Usage("tfds:NAME[/CONFIG]", "a prepared TFDS dataset (--tfds-data-dir); never downloads without "
                                         "--tfds-download"),)
    options = ("tfds_data_dir", "tfds_download", "image_key", "label_key")

    def location(self, source: str) -> str:
        return prefixed_location(source, self.prefix, "imagenette/320px-v2", "a dataset name", strip="/")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        from shardprep.pipelines.storage import is_local

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
        split_files = [(split, str(path)) for split, info in builder.info.splits.items() for path in info.filepaths]
        if not split_files:
            raise sources.SourceError(f"TFDS dataset {location} has no prepared files in {builder.data_dir}")
        return self.files_plan(location, split_files, label_names(builder, config.label_key))

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        """Every split's files of the prepared dataset, and its label feature's class names; a dataset that is
        not prepared is refused, saying how to prepare it."""
        builder = tfds_builder(location, tfds_data_dir)
        if not builder.is_prepared():
            raise sources.SourceError(
                f"TFDS dataset {location} is not prepared in {builder.data_dir} and validate never downloads: "
                f"prepare it there (tfds build, or shardprep preprocess tfds:{location} OUTPUT --tfds-download), or "
                "pass --tfds-data-dir where it is prepared")
        files = sorted(str(path) for info in builder.info.splits.values() for path in info.filepaths)
        if not files:
            raise sources.SourceError(f"TFDS dataset {location} has no prepared files in {builder.data_dir}")
        return RecordFiles(files, label_names(builder, label_key))


def tfds_builder(name: str, data_dir: str | None):
    """TFDS's builder of the dataset ``name`` in ``data_dir`` (None: TFDS's default), never looking on GCS; a
    SourceError (one line) for a name TFDS does not know or a folder it cannot use."""
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except Exception as e:  # noqa: BLE001 - TFDS raises many kinds for unknown names and missing folders
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise sources.SourceError(f"TFDS dataset {name!r} cannot be loaded from "
                                  f"{data_dir or 'the default TFDS data dir'}: {detail}") from None


def label_names(builder, label_key: str) -> list[str] | None:
    """The class names of the dataset's ``label_key`` feature (a ClassLabel), or None."""
    return class_label_names(builder.info.features[label_key], label_key) if label_key in builder.info.features \
        else None


def class_label_names(feature, label_key: str) -> list[str] | None:
    """The class names of ``feature`` (None unless a ClassLabel), at most ``labels.MAX_CLASSES``: counted before
    TFDS is asked for them, as a ClassLabel without names makes one per class ("0", "1", ...)."""
    count = getattr(feature, "num_classes", None)
    if isinstance(count, int) and count > labels.MAX_CLASSES:
        raise sources.SourceError(f"the TFDS feature {label_key!r} has {count:,} classes, more than the "
                                  f"{labels.MAX_CLASSES:,} shardprep takes")
    return list(getattr(feature, "names", None) or []) or None


TFDS = TFDSSource()
