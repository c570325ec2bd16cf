"""Validate's ``tfds:NAME[/CONFIG]`` input, spelled as preprocess takes it: the TFRecords of an already prepared TFDS
dataset, found through TFDS (``--tfds-data-dir``, else TFDS's own default) and then validated as ``tfrecord:``
input, with the class names of the dataset's label feature. Validate never downloads: a dataset that is not
prepared is refused, saying how to prepare it. Imports TFDS only when called."""

from __future__ import annotations

TFDS_PREFIX = "tfds:"


def prepared_files(name: str, data_dir: str | None, label_key: str) -> tuple[list[str], list[str] | None]:
    """(the prepared dataset's TFRecord files, every split's, its label feature's class names or None); a
    ``ValueError`` (one line) for a name TFDS does not know or a dataset not prepared in ``data_dir``."""
    import tensorflow_datasets as tfds

    where = data_dir or "the default TFDS data dir"
    if not name:
        raise ValueError("tfds: needs a dataset name, e.g. tfds:imagenette/320px-v2")
    try:
        builder = tfds.builder(name, data_dir=data_dir, try_gcs=False)
    except Exception as e:  # noqa: BLE001 - TFDS raises many kinds for unknown names and missing folders
        detail = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(f"TFDS dataset {name!r} cannot be loaded from {where}: {detail}") from None
    if not builder.is_prepared():
        raise ValueError(f"TFDS dataset {name} is not prepared in {builder.data_dir} and validate never downloads: "
                         f"prepare it there (tfds build, or shardprep preprocess tfds:{name} OUTPUT --tfds-download),"
                         " or pass --tfds-data-dir where it is prepared")
    files = [str(path) for info in builder.info.splits.values() for path in info.filepaths]
    if not files:
        raise ValueError(f"TFDS dataset {name} has no prepared files in {builder.data_dir}")
    feature = builder.info.features[label_key] if label_key in builder.info.features else None
    return sorted(files), list(getattr(feature, "names", None) or []) or None
