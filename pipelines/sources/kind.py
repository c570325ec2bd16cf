"""What every kind of SOURCE provides (``SourceKind``), what planning found (``SourcePlan``), and what the kinds
share. After SOURCE is parsed the job asks the plan's kind, never the text. Beam is imported where used (the CLI's
help imports every kind)."""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Iterable, NamedTuple

from shardprep.preprocess.format import accounting, fingerprint
from shardprep.preprocess.sources import labels, common as sources
from shardprep.preprocess.checks import names
from shardprep.preprocess.sources.archive_index import split_inner
from shardprep.preprocess.format.elements import Input, Reject

WILDCARDS = "*?["


class Usage(NamedTuple):
    """One line of SOURCE in ``shardprep preprocess --help``."""
    syntax: str  # "tfrecord:GLOB"
    meaning: str


class ApartFrom(NamedTuple):
    """An input that OUTPUT must not be, hold or lie inside (``storage.keep_apart``)."""
    what: str  # how the refusal names it: "SOURCE", "labels file", "TFDS data dir", "input TFRecord file"
    path: str
    glob: bool = False  # a glob: OUTPUT must not be or hold its folder, nor lie in it when the glob recurses (**)
    matched: bool = False  # a file a glob matched: only OUTPUT holding it is refused (beside it is fine)


class RecordFiles(NamedTuple):
    """What validate reads of a source of TFRecords."""
    patterns: list[str]  # globs, or the files themselves
    classes: list[str] | None  # None: a label.labels.txt beside the files


class ParsedSource(NamedTuple):
    kind: "SourceKind"
    location: str  # a folder, a glob, a TFDS name


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What the job reads, resolved before the pipeline starts (folders and files, never images)."""
    kind: "SourceKind"
    location: str
    splits: tuple[str, ...]
    classes: tuple[str, ...] | None  # None: unnamed int labels, class names become "0".."max"
    skipped: tuple[Reject, ...] = ()  # rejects planning found (hidden folders, looping links, unreadable files)
    not_used: tuple[accounting.NotUsed, ...] = ()  # what lies beside the inputs and is not one
    notes: tuple[str, ...] = ()  # told to the user after the run
    median_input_size: tuple[int, int] | None = None  # (width, height): the sampled inputs' median (input_sizes)

    @property
    def stats_split(self) -> str:
        return "train" if "train" in self.splits else self.splits[0]


KeyBounds = tuple[int, int, int]  # (shortest source key, longest source key, largest label), keys in UTF-8 bytes


class SourceKind:
    """One kind of SOURCE: set the class attributes, implement ``plan`` and ``read_tasks`` with ``task_reader``
    (the folder kind is listed its own way: ``listing.list_folder``)."""

    name = ""  # the manifest's source_kind
    prefix = ""  # SOURCE written as PREFIX + location claims this kind ("tfrecord:")
    example = ""  # a location shown when PREFIX stands alone
    what = ""  # what the location is, for that message
    usage: tuple[Usage, ...] = ()
    options: tuple[str, ...] = ()  # the KIND_OPTIONS fields this kind reads; others set are refused by name
    # True: the listing reads the images (Inputs carry ``data``), decoded per bundle where read; then
    # ``planned_key_bounds`` gives every split's bounds. False: Inputs name files, decoded in decode groups.
    decoded_where_read = False
    fans_out = False  # the read tasks' Inputs are spread over the workers again (one task holds a whole archive)
    validated_as_records = False  # validate reads such a DATA as TFRecords of encoded images (``record_files``)

    def claims(self, source: str) -> bool:
        """SOURCE is written as this kind (text only, no file access)."""
        return bool(self.prefix) and source.startswith(self.prefix)

    def location(self, source: str) -> str:
        """Where SOURCE points; ``sources.SourceError`` when it points nowhere."""
        if self.prefix:
            return prefixed_location(source, self.prefix, self.example, self.what)
        return source.rstrip("/") or "/"

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        return []  # the inputs OUTPUT must stay apart from, known before planning

    def plan(self, location: str, config) -> SourcePlan:
        raise NotImplementedError

    def planned_inputs(self, plan: SourcePlan) -> list[ApartFrom]:
        return []  # the inputs OUTPUT must stay apart from that planning found (a glob's files)

    def read_tasks(self, plan: SourcePlan) -> list:
        """Small, picklable pieces read one at a time (a file, a row group), each with its split."""
        raise NotImplementedError

    def task_reader(self, config, plan: SourcePlan) -> Callable[[object], Iterable[Input | Reject]]:
        """A picklable callable reading one of ``read_tasks`` into Inputs and Rejects, on a worker."""
        raise NotImplementedError

    def path_reader(self, plan: SourcePlan) -> Callable[[str], bytes] | None:
        """A picklable callable reading an Input's ``path`` into its bytes (else RejectError); None: a file."""
        return None

    def planned_key_bounds(self, plan: SourcePlan) -> dict[str, KeyBounds] | None:
        """{split: KeyBounds} known from the plan alone; None: found from the listed inputs."""
        return None

    def resume_refusal(self, plan: SourcePlan) -> str | None:
        """Why a local run of this source cannot be resumed; None when it can."""
        if self.decoded_where_read:
            return f"{self.name} sources are decoded per bundle, whose contents depend on the runner: no unit of " \
                   "work can be kept"
        return f"{self.name} sources list no fingerprint of their inputs, so a stopped run's work cannot be trusted"

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        """The TFRecord files validate reads, for kinds ``validated_as_records``; never downloads."""
        raise NotImplementedError

    def listed_entries(self, config, plan: SourcePlan) -> list:
        """Every entry read, rejected or not used, with each file's size and mtime: what ``--resume`` compares."""
        raise NotImplementedError

    def notes_after_run(self, plan: SourcePlan, document: dict) -> tuple[str, ...]:
        return ()  # told after a run besides the plan's notes, from the manifest written


class GlobKind(SourceKind):
    """``PREFIX:GLOB`` of files read where they land, one task per file or part of one."""

    decoded_where_read = True
    files_name, glob_name = "input file", "input files"  # how OUTPUT's refusal names one of them, and the glob

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        literal = [] if any(c in location for c in WILDCARDS) else [ApartFrom(self.files_name, location)]
        return literal + [ApartFrom(self.glob_name, location, glob=True)]

    def planned_inputs(self, plan: SourcePlan) -> list[ApartFrom]:
        return [ApartFrom(self.files_name, path, matched=True) for path in sorted(set(self.planned_files(plan)))]

    def planned_files(self, plan: SourcePlan) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def max_label(plan: SourcePlan) -> int:
        """The largest label a record may hold: the last class's, else int64's (records' padding: kept as it was)."""
        return len(plan.classes) - 1 if plan.classes else (1 << 63) - 1

    def matched(self, location: str) -> list[str]:
        """The files the glob matches, sorted; a SourceError for none."""
        from apache_beam.io.filesystems import FileSystems

        found = sorted(m.path for m in FileSystems.match([location])[0].metadata_list if not m.path.endswith("/"))
        if not found:
            raise sources.SourceError(f"no files match {location}")
        return found


# PreprocessConfig fields that some kinds read and others do not, with the option that sets each.
KIND_OPTIONS = {field: fingerprint.option_flag(field) for field in (
    "labels_file", "labels_split", "tfds_data_dir", "tfds_download", "image_key", "label_key", "classes_file")}


def classes_file_apart(config) -> list[ApartFrom]:
    return [ApartFrom("--classes file", config.classes_file)] if config.classes_file else []


def prefixed_location(source: str, prefix: str, example: str, what: str, strip: str = "") -> str:
    """What follows ``prefix`` in SOURCE (less ``strip``'s characters at its ends); a SourceError when nothing does."""
    rest = source[len(prefix):].strip(strip)
    if not rest.strip():
        raise sources.SourceError(f"{prefix} needs {what}, e.g. {prefix}{example}")
    return rest


def bounds_by_split(found: Iterable[tuple[str, int, int, int]]) -> dict[str, KeyBounds]:
    bounds: dict[str, KeyBounds] = {}
    for split, low, high, label in found:
        old = bounds.get(split, (low, high, label))
        bounds[split] = (min(old[0], low), max(old[1], high), max(old[2], label))
    return bounds


def label_out_of_range(split: str, key: str, label, num_classes: int | None) -> Reject | None:
    """A reject for a label that is no class index (without class names, at most ``labels.MAX_CLASSES``)."""
    limit = labels.MAX_CLASSES if num_classes is None else num_classes
    if isinstance(label, int) and 0 <= label < limit:
        return None
    shown = f"{label:,}" if isinstance(label, int) else str(label)
    return Reject(split, key, "label_out_of_range", f"label {shown} not in 0..{limit - 1:,}"
                  + (" (no class names)" if num_classes is None else ""))


def open_file(path: str):
    """A binary file of ``path``, local or a URL, never decompressed by its name."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_head(path: str, at_most: int) -> bytes:
    """At most ``at_most`` bytes of ``path``; a local one only if a regular file. Else a SourceError."""
    from shardprep.preprocess.checks import untrusted

    try:
        opened = (os.fdopen(untrusted.open_regular_file(path.removeprefix("file://")), "rb") if is_local(path)
                  else open_file(path))
        with opened as f:
            return f.read(at_most)
    except OSError as e:  # BeamIOError is one
        raise sources.SourceError(f"cannot read {path}: {e}") from None


def file_stamp(path: str) -> tuple[int, int] | None:
    """(size, mtime in ns) of a local or remote file; None when it is not there."""
    if "://" not in path:
        try:
            info = os.stat(path)
        except OSError:
            return None
        return info.st_size, info.st_mtime_ns
    from apache_beam.io.filesystems import FileSystems

    found = FileSystems.match([path])[0].metadata_list
    return (found[0].size_in_bytes, int(found[0].last_updated_in_seconds * 1e9)) if found else None


def file_entry(key: str, path: str) -> fingerprint.ListedEntry:
    return fingerprint.ListedEntry(key, *(file_stamp(path) or (-1, 0)))


def planned_entries(plan: SourcePlan) -> list[fingerprint.ListedEntry]:
    return ([fingerprint.ListedEntry(reject.key, -1, 0, reject.reason) for reject in plan.skipped]
            + [fingerprint.ListedEntry(entry.path, -1, 0, "not_used") for entry in plan.not_used])


def labels_file_entries(config) -> list[fingerprint.ListedEntry]:
    return [file_entry(f"--labels-file {config.labels_file}", config.labels_file)] if config.labels_file else []


def is_local(path: str) -> bool:
    from shardprep.pipelines.runtime.storage import is_local as local

    return local(path)


def exists(path: str) -> bool:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems.exists(path)


MAX_LABELS_FILE_BYTES = 256 << 20  # read whole, once: ImageNet's validation labels are 2 MB


def ordered_classes(stored, where: str, config) -> list[str]:
    """The classes' label order: the stored names by code point, or ``--classes FILE``'s."""
    if config.classes_file is None:
        return names.class_order(stored, where)
    return names.class_order(stored, where, read_classes_file(config.classes_file), f"--classes {config.classes_file}")


def read_classes_file(path: str) -> list[str]:
    data = _read_bounded(path, f"--classes {path}", names.MAX_CLASS_LIST_BYTES, "does not exist: give a text file of "
                         "class names, one a line", "is not a file: give a text file of class names, one a line",
                         f"is over {names.MAX_CLASS_LIST_BYTES >> 20} MiB: it should hold class names, one a line")
    found = labels.class_names_txt(data, f"--classes {path}")
    if not found:
        raise sources.SourceError(f"--classes {path} names no class: give class names, one a line")
    return found


def read_labels_file_rows(path: str, file_exists) -> list[labels.LabelRow]:
    """The labels file's rows (``file_exists(name)``: is there a flat image of that name)."""
    archive, inner = split_inner(path)
    if inner and not exists(path) and exists(archive):
        raise sources.SourceError(f"labels file {path} is inside the archive {archive}: a labels file is read "
                                  "from inside an archive only with that archive as SOURCE; extract it and give its "
                                  "path")
    data = _read_bounded(path, f"labels file {path}", MAX_LABELS_FILE_BYTES, "does not exist",
                         "is not a file (a folder?): give the CSV of filename,label",
                         f"is over {MAX_LABELS_FILE_BYTES:,} bytes, more than a CSV of filename,label rows for any "
                         "dataset shardprep reads (ImageNet's is 2 MB)")
    return labels.csv_rows(data, path, file_exists)


def _read_bounded(path: str, what: str, limit: int, missing: str, not_file: str, too_big: str) -> bytes:
    """At most ``limit`` bytes of the file ``what`` names; a SourceError ``what missing`` etc. otherwise."""
    if not exists(path):
        raise sources.SourceError(f"{what} {missing}")
    if is_local(path) and not os.path.isfile(path):
        raise sources.SourceError(f"{what} {not_file}")
    try:
        with open_file(path) as f:
            data = f.read(limit + 1)
    except Exception as e:  # noqa: BLE001 - unreadable for any reason: one line for the user
        raise sources.SourceError(f"cannot read {what}: {type(e).__name__}: {e}") from None
    if len(data) > limit:
        raise sources.SourceError(f"{what} {too_big}")
    return data
