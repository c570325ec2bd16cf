"""The ``parquet:GLOB`` kind: Parquet files as the Hugging Face Hub holds image datasets (an image struct
``{bytes, path}`` and an integer label), one task per row group, keys ``FILE:ROW``. Planning reads only the footers
(and the Hub's features); a split whose labels are all -1 or missing (the Hub's ``test``) is not used."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, NamedTuple, cast

from shardprep.pipelines.sources.kind import (GlobKind, KeyBounds, SourcePlan, Usage, bounds_by_split, exists,
                                             label_out_of_range, open_file, read_head)
from shardprep.preprocess.format import accounting, manifest
from shardprep.preprocess.sources import hub_features, labels, common as sources
from shardprep.preprocess.checks import names
from shardprep.preprocess.format.elements import Input, Reject

_BATCH_ROWS = 1024  # rows read at a time, so that no row group is held whole
# train-00000-of-00004.parquet, train-00000-of-00004-2a3b4c5d.parquet (older uploads), train.parquet
_HUB_FILE_SPLIT = re.compile(r"^(?P<split>[^/]+?)(-\d+-of-\d+(-[0-9a-zA-Z]+)?)?\.parquet$")
_NUMBERED_FILE = re.compile(r"^\d+\.parquet$")  # the Hub's converted layout: CONFIG/SPLIT/0000.parquet
UNLABELLED = "a split without labels (every label -1 or no label column), as the Hub's test splits are: not read"
NOT_PARQUET = "not a Parquet file, matched by the glob: not read"


class RowGroupTask(NamedTuple):
    split: str
    path: str
    name: str  # the file relative to the glob's folder: keys are NAME:ROW
    row_group: int
    first_row: int
    num_rows: int


@dataclasses.dataclass(frozen=True)
class ParquetPlan(SourcePlan):
    row_groups: tuple[RowGroupTask, ...] = ()
    image_column: str = ""
    label_column: str = ""


class _FileFooter(NamedTuple):
    path: str
    columns: dict  # column -> Arrow type
    row_groups: tuple[int, ...]  # rows per row group
    maxima: dict  # integer column -> its largest value by the footer's statistics (None: not known)
    features: hub_features.Features  # from the file's huggingface metadata
    error: str | None = None


class ParquetSource(GlobKind):
    name, prefix, example, what = "parquet", "parquet:", "DIR/data/*.parquet", "a glob of Parquet files"
    usage = (Usage("parquet:GLOB", "Parquet files as on the Hugging Face Hub (image struct, int label)"),)
    options = ("image_key", "label_key")
    files_name, glob_name = "input Parquet file", "input Parquet files"

    def planned_files(self, plan: SourcePlan) -> list[str]:
        return [task.path for task in cast(ParquetPlan, plan).row_groups]

    def plan(self, location: str, config) -> ParquetPlan:
        base = glob_folder(location)
        with ThreadPoolExecutor(max_workers=8) as pool:  # footers a few at a time: each a round trip on gs://
            footers = list(pool.map(read_footer, self.matched(location)))
        readable = [f for f in footers if f.error is None]
        not_used = [accounting.NotUsed(relative(base, f.path), NOT_PARQUET) for f in footers
                    if f.error is not None and not f.path.endswith(".parquet")]
        skipped = [Reject(split_of(f.path, config.split), relative(base, f.path), "unreadable", f.error)
                   for f in footers if f.error is not None and f.path.endswith(".parquet")]
        if not readable:
            first = footers[0]
            raise sources.SourceError(f"no readable Parquet file matches {location}: {first.path}: {first.error}")
        widest = max(readable, key=lambda footer: len(footer.columns))  # the first by name may lack labels (test)
        features, origin = dataset_features(base, widest)
        image_column, label_column = find_columns(widest, features, config)
        classes, notes = class_names(features, label_column, origin)
        tasks, unlabelled = [], []
        for footer in readable:
            split = names.check(split_of(footer.path, config.split), "split", f"the Parquet file {footer.path}")
            largest = label_max(footer, label_column) if label_column in footer.columns else -1
            if image_column not in footer.columns:
                skipped.append(Reject(split, relative(base, footer.path), "bad_record", f"no column {image_column!r}"))
            elif largest < 0:
                unlabelled.append((split, footer))
            else:
                if classes is None and largest >= labels.MAX_CLASSES:  # refused before anything is written
                    raise sources.SourceError(
                        f"the label column {label_column!r} of {relative(base, footer.path)} holds the label "
                        f"{largest:,}, beyond the {labels.MAX_CLASSES:,} classes shardprep takes without class names "
                        f"(labels 0 to {labels.MAX_CLASSES - 1:,}): name the classes in the dataset card "
                        "(dataset_info.features) or dataset_info.json, or leave that file out of the glob")
                tasks += row_group_tasks(split, footer, relative(base, footer.path))
        labelled = {task.split for task in tasks}
        not_used += [accounting.NotUsed(relative(base, f.path), UNLABELLED) for s, f in unlabelled if s not in labelled]
        tasks += [t for s, f in unlabelled if s in labelled for t in row_group_tasks(s, f, relative(base, f.path))]
        if not tasks:
            raise sources.SourceError(f"no labelled rows in the Parquet files matching {location}")
        splits = tuple(dict.fromkeys(t.split for t in tasks))
        for reject in skipped:  # its split has no rows to count it in
            if reject.split not in splits:
                raise sources.SourceError(f"{reject.key} cannot be read ({reject.detail}), and no other file of "
                                          f"split {reject.split} can: download it again, or leave it out of the glob")
        return ParquetPlan(kind=self, location=location, splits=splits, classes=classes, skipped=tuple(skipped),
                           not_used=tuple(sorted(not_used)), notes=tuple(notes),
                           row_groups=tuple(tasks), image_column=image_column, label_column=label_column)

    def read_tasks(self, plan: SourcePlan) -> list[RowGroupTask]:
        return list(cast(ParquetPlan, plan).row_groups)

    def task_reader(self, config, plan: SourcePlan) -> Callable[[Any], Iterable[Input | Reject]]:
        planned = cast(ParquetPlan, plan)
        return RowGroupReader(planned.image_column, planned.label_column,
                              len(planned.classes) if planned.classes else None)

    def planned_key_bounds(self, plan: SourcePlan) -> dict[str, KeyBounds]:
        """Keys are ``NAME:ROW``: bounds from the names and the files' row counts."""
        return bounds_by_split((task.split, len(task.name.encode("utf-8")) + 2, len(task.name.encode("utf-8")) + 1
                                + len(str(task.first_row + task.num_rows - 1)), self.max_label(plan))
                               for task in cast(ParquetPlan, plan).row_groups)


def class_names(features: hub_features.Features, label_column: str, origin: str) -> tuple[tuple[str, ...] | None,
                                                                                      list[str]]:
    """(the label column's class names, or None; the notes to show about them)."""
    classes = features[label_column].names if label_column in features else None
    if not classes:
        return None, [f"labels named by their integers: no class names found for {label_column!r}"]
    checked = [names.check(name, "class", origin) for name in classes]
    counts = Counter(checked)  # a repeated name is told apart by its label, as ``crane (134)``
    unique = tuple(f"{name} ({label})" if counts[name] > 1 else name for label, name in enumerate(checked))
    if len(set(unique)) != len(unique):
        raise sources.SourceError(f"the class names in {origin} repeat even when told apart by their label")
    repeated = [name for name, given in zip(unique, checked) if counts[given] > 1]
    return unique, ["repeated class names told apart by label: " + ", ".join(repeated)] if repeated else []


def glob_folder(location: str) -> str:
    """The folder of the glob's fixed part (``d/data/*.parquet``: ``d/data``): keys name files from there."""
    fixed = re.split(r"[*?\[]", location, maxsplit=1)[0]
    return fixed.rsplit("/", 1)[0] if "/" in fixed else ""


def relative(base: str, path: str) -> str:
    return sources.source_key(base, path) if base else path


def split_of(path: str, default: str) -> str:
    """The split in a Hub file name, or in its folder's name for the Hub's numbered files, else ``default``."""
    parts = path.rsplit("/", 2)
    if _NUMBERED_FILE.match(parts[-1]) and len(parts) > 1:
        return parts[-2]
    match = _HUB_FILE_SPLIT.match(parts[-1])
    return match.group("split") if match and match.group(2) else default


def row_group_tasks(split: str, footer: _FileFooter, name: str) -> list[RowGroupTask]:
    firsts = itertools.accumulate(footer.row_groups, initial=0)
    return [RowGroupTask(split, footer.path, name, index, first, rows)
            for index, (first, rows) in enumerate(zip(firsts, footer.row_groups)) if rows]


def read_footer(path: str) -> _FileFooter:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        with open_file(path) as stream:
            metadata = pq.ParquetFile(stream).metadata
    except (pa.ArrowException, OSError, ValueError) as e:
        return _FileFooter(path, {}, (), {}, {}, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    schema = metadata.schema.to_arrow_schema()
    hub = (schema.metadata or {}).get(b"huggingface")
    features = hub_features.from_info(hub, f"the huggingface metadata of {path}") if hub else {}
    columns = {field.name: field.type for field in schema}
    groups = tuple(metadata.row_group(i).num_rows for i in range(metadata.num_row_groups))
    maxima = {metadata.schema.column(i).path: _column_max(metadata, i) for i in range(metadata.num_columns)}
    return _FileFooter(path, columns, groups, maxima, features)


def _column_max(metadata, index: int) -> int | None:
    stats = [metadata.row_group(group).column(index).statistics for group in range(metadata.num_row_groups)]
    if any(s is None or not s.has_min_max or not isinstance(s.max, int) for s in stats):
        return None
    return max((s.max for s in stats), default=None)


def label_max(footer: _FileFooter, column: str) -> int:
    """The file's largest label: by the footer's statistics, else read (that column only); 0 for none."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    found = footer.maxima.get(column)
    if found is not None or not sum(footer.row_groups):
        return found or 0
    largest = None
    try:  # batch by batch: a few kilobytes of Parquet can hold a billion labels
        with open_file(footer.path) as stream:
            for batch in pq.ParquetFile(stream).iter_batches(batch_size=_BATCH_ROWS, columns=[column]):
                found = pc.max(batch.column(0)).as_py()
                if isinstance(found, int):
                    largest = found if largest is None else max(largest, found)
    except (pa.ArrowException, OSError):  # damaged pages: its row groups are read, and rejected, row by row
        pass
    return 0 if largest is None else largest


def dataset_features(base: str, footer: _FileFooter) -> tuple[hub_features.Features, str]:
    """(the features of the dataset card or ``dataset_info.json`` in the glob's folder or its parent, else of
    ``footer``'s file; the file they come from)."""
    for folder in [base] + ([base.rsplit("/", 1)[0]] if "/" in base.strip("/") else []):
        for name, parse in (("README.md", hub_features.from_card), ("dataset_info.json", hub_features.from_info)):
            path = manifest.join(folder, name) if folder else name
            if not exists(path):
                continue
            features = parse(read_head(path, hub_features.MAX_FEATURES_BYTES + 1), path)
            if hub_features.column_of(features, hub_features.CLASS_LABEL):
                return features, path
    return footer.features, footer.path


def find_columns(footer: _FileFooter, features: hub_features.Features, config) -> tuple[str, str]:
    """(image column, label column): ``--image-key``/``--label-key``, else the features', else by type."""
    import pyarrow as pa
    from shardprep.preprocess.format.config import default

    for key, flag in ((config.image_key, "--image-key"), (config.label_key, "--label-key")):
        if key != default(flag[2:].replace("-", "_")) and key not in footer.columns:
            raise sources.SourceError(f"no column {key!r} ({flag}) in {footer.path} (columns: "
                                      f"{', '.join(footer.columns)})")

    def image_like(kind) -> bool:
        return pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or (
            pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0)

    image = next((c for c in (config.image_key, hub_features.column_of(features, hub_features.IMAGE))
                  if c in footer.columns), None) or next(
        (c for c, kind in footer.columns.items() if image_like(kind)), None)
    label = next((c for c in (config.label_key, hub_features.column_of(features, hub_features.CLASS_LABEL))
                  if c in footer.columns), None) or hub_features.column_of(features, hub_features.CLASS_LABEL)
    if image is None or not image_like(footer.columns[image]):
        raise sources.SourceError(f"no image column in {footer.path} (columns: {', '.join(footer.columns)}): "
                                  "name it with --image-key")
    if label is None:
        raise sources.SourceError(f"no label column {config.label_key!r} in {footer.path} (columns: "
                                  f"{', '.join(footer.columns)}): name it with --label-key")
    if not pa.types.is_integer(footer.columns.get(label, pa.int64())):
        raise sources.SourceError(f"the label column {label!r} of {footer.path} holds {footer.columns[label]}, not "
                                  "integer class indices: name another with --label-key")
    return image, label


class RowGroupReader:
    """A RowGroupTask -> an Input or a Reject per row."""

    def __init__(self, image_column: str, label_column: str, num_classes: int | None):
        self.image_column, self.label_column, self.num_classes = image_column, label_column, num_classes

    def __call__(self, task: RowGroupTask) -> Iterator[Input | Reject]:
        import pyarrow.parquet as pq

        done = 0  # rows given so far: should reading fail, the rest are rejects
        try:  # _BATCH_ROWS rows at a time: a few kilobytes can hold millions of rows
            with open_file(task.path) as stream:
                for batch in pq.ParquetFile(stream).iter_batches(batch_size=_BATCH_ROWS, row_groups=[task.row_group],
                                                                 columns=[self.image_column, self.label_column]):
                    for image, label in zip(batch.column(self.image_column).to_pylist(),
                                            batch.column(self.label_column).to_pylist()):
                        yield self.row(task.split, f"{task.name}:{task.first_row + done}", image, label)
                        done += 1
        except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds for damaged files
            cause = (str(e).splitlines() or [""])[0][:300]
            detail = f"row group {task.row_group} of {task.name}: {type(e).__name__}: {cause}"
            for row in range(task.first_row + done, task.first_row + task.num_rows):
                yield Reject(task.split, f"{task.name}:{row}", "unreadable", detail)

    def row(self, split: str, key: str, image, label) -> Input | Reject:
        data = image.get("bytes") if isinstance(image, dict) else image
        if not isinstance(data, bytes) or not data:
            return Reject(split, key, "no_image", f"no image bytes in column {self.image_column!r}")
        if label is None or label == -1:
            return Reject(split, key, "no_label", f"no label in column {self.label_column!r}")
        return label_out_of_range(split, key, label, self.num_classes) or Input(split, key, label, None, data)


PARQUET = ParquetSource()
