"""What a source kind is: the questions the job asks of every kind of SOURCE, and ``SourcePlan``, what planning found.

A kind is one module (``pipelines/source_<name>.py``) holding a ``SourceKind`` subclass, registered once in
``shardprep.pipelines.source_registry``. SOURCE is parsed once (``source_registry.parse``); from then on the job
asks the plan's kind, never the SOURCE text: what OUTPUT must stay apart from, the plan, the pipeline's listing
stage, whether the inputs are decoded where they are read, the key bounds known before reading, and whether a run
of it can be resumed. ``shardprep preprocess --help`` lists each kind's ``usage`` lines.

Kind modules import no Beam, TensorFlow or reader library at module level (the CLI's help imports the registry):
what needs one imports it inside the function that uses it, as workers and the launcher run them.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, NamedTuple

from shardprep.preprocess import accounting, sources
from shardprep.preprocess.elements import Input, Reject


class Usage(NamedTuple):
    """One line of SOURCE in ``shardprep preprocess --help``: how it is written and what it is."""

    syntax: str  # "tfrecord:GLOB"
    meaning: str  # "TFRecords of encoded images, TFDS style (image bytes, label int64)"


class ApartFrom(NamedTuple):
    """An input that OUTPUT must not be, hold or lie inside (``storage.keep_apart``)."""

    what: str  # how the refusal names it: "SOURCE", "labels file", "TFDS data dir", "input TFRecord file"
    path: str
    glob: bool = False  # a glob: OUTPUT must not be or hold its folder, nor lie in it when the glob recurses (**)
    matched: bool = False  # a file a glob matched: only OUTPUT holding it is refused (beside it is fine)


class RecordFiles(NamedTuple):
    """What validate reads of a source that is TFRecords of encoded images (``SourceKind.record_files``)."""

    patterns: list[str]  # globs, or the files themselves
    classes: list[str] | None  # the names the source gives its labels; None: a label.labels.txt beside the files


class ParsedSource(NamedTuple):
    """SOURCE parsed once: the kind that claimed it and where it points (a folder, a glob, a TFDS name)."""

    kind: "SourceKind"
    location: str


@dataclasses.dataclass(frozen=True)
class SourcePlan:
    """What the job reads, resolved before the pipeline starts (small: folders and files, never images). A kind
    with more to say subclasses it (``planning.FolderPlan``, ``source_tfrecord.FilesPlan``)."""

    kind: "SourceKind"
    location: str  # SOURCE as its kind parsed it
    splits: tuple[str, ...]
    classes: tuple[str, ...] | None  # None: unnamed int labels, class names become "0".."max"
    skipped: tuple[Reject, ...] = ()  # rejects of entries the planning skipped (hidden folders, looping links)
    not_used: tuple[accounting.NotUsed, ...] = ()  # what lies beside the inputs and is not one
    notes: tuple[str, ...] = ()  # what the user is told after the run (labels named by their integers)
    median_input_size: tuple[int, int] | None = None  # (width, height): the sampled inputs' median (input_sizes)

    @property
    def stats_split(self) -> str:
        return "train" if "train" in self.splits else self.splits[0]


KeyBounds = tuple[int, int, int]  # (shortest source key, longest source key, largest label), keys in UTF-8 bytes


class SourceKind:
    """One kind of SOURCE. Subclasses set the class attributes and implement ``location`` and ``plan``, and either
    ``read_tasks`` with ``task_reader`` (the default listing stage) or ``list_inputs``."""

    name = ""  # the manifest's source_kind
    usage: tuple[Usage, ...] = ()
    # The PreprocessConfig fields only this kind reads (among those that belong to some kinds: KIND_OPTIONS); the
    # others, given with this kind, are refused by name instead of ignored.
    options: tuple[str, ...] = ()
    # True: the listing reads the images themselves (Inputs carry ``data``), and they are decoded where they were
    # read, per bundle (``decode.BundleDecoder``), while the listing goes on; ``planned_key_bounds`` must then give
    # every split's bounds. False: Inputs name files (``path``), decoded in decode groups once all are listed.
    decoded_where_read = False
    # True: ``shardprep validate`` takes such a DATA as TFRecords of encoded images (``record_files``); other kinds'
    # DATA are read as prepared datasets.
    validated_as_records = False

    def notes_after_run(self, plan: SourcePlan, document: dict) -> tuple[str, ...]:
        """What the user is told after a run, besides the plan's ``notes``, from what it wrote (``document``: the
        manifest), e.g. a class folder that held nothing."""
        return ()

    def claims(self, source: str) -> bool:
        """True when SOURCE is written as this kind (its prefix, its file name's suffix); cheap, no file access."""
        return False

    def location(self, source: str) -> str:
        """Where SOURCE points, from its text alone; ``sources.SourceError`` when it points nowhere."""
        raise NotImplementedError

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        """The inputs OUTPUT must stay apart from, known before planning."""
        return []

    def plan(self, location: str, config) -> SourcePlan:
        """The splits, classes and what to read, found on the launching machine; ``sources.SourceError`` for a
        source that cannot be used."""
        raise NotImplementedError

    def planned_inputs(self, plan: SourcePlan) -> list[ApartFrom]:
        """The inputs OUTPUT must stay apart from that planning found (a glob's files)."""
        return []

    def list_inputs(self, pbegin, config, plan: SourcePlan, progress_dir: str | None) -> dict:
        """The pipeline's start -> {"inputs": Input, "rejects": Reject}: everything ``plan`` holds, each input
        once. By default the plan's read tasks spread over the workers, each read where it lands by
        ``task_reader`` (``listing.ReadTasks``)."""
        from shardprep.pipelines.listing import ReadTasks

        return pbegin | "ReadTasks" >> ReadTasks(self.read_tasks(plan), self.task_reader(config, plan), progress_dir)

    def read_tasks(self, plan: SourcePlan) -> list:
        """The pieces the listing reads one at a time (a file, a row group): small, picklable, with their split."""
        raise NotImplementedError

    def task_reader(self, config, plan: SourcePlan) -> Callable[[object], Iterable[Input | Reject]]:
        """A picklable callable reading one of ``read_tasks`` into Inputs and Rejects, on a worker."""
        raise NotImplementedError

    def path_reader(self, plan: SourcePlan) -> Callable[[str], bytes] | None:
        """A picklable callable reading an Input's ``path`` into its bytes on a worker (an archive member's range;
        ``image_ops.RejectError`` when it cannot); None: the path is a file, read whole (``decode.read_file``)."""
        return None

    def planned_key_bounds(self, plan: SourcePlan) -> dict[str, KeyBounds] | None:
        """{split: KeyBounds} known from the plan alone; None: they are found from the listed inputs."""
        return None

    def resume_refusal(self, plan: SourcePlan) -> str | None:
        """Why a local run of this source keeps no journal and so cannot be resumed; None when it can (its inputs
        are files decoded in decode groups, and ``listed_entries`` fingerprints them)."""
        return f"{self.name} sources list no fingerprint of their inputs, so a stopped run's work cannot be trusted"

    def record_files(self, location: str, tfds_data_dir: str | None, label_key: str) -> RecordFiles:
        """The TFRecord files validate reads, for kinds ``validated_as_records``; never downloads."""
        raise NotImplementedError

    def listed_entries(self, config, plan: SourcePlan) -> list:
        """Every entry the job reads, rejects or does not use, with each file's size and mtime
        (``fingerprint.ListedEntry``): what ``--resume`` compares. Only for kinds that can be resumed."""
        raise NotImplementedError


# PreprocessConfig fields that some kinds read and others do not, with the option that sets each.
KIND_OPTIONS = {"labels_file": "--labels-file", "labels_split": "--labels-split", "tfds_data_dir": "--tfds-data-dir",
                "tfds_download": "--tfds-download", "image_key": "--image-key", "label_key": "--label-key", "classes_file": "--classes"}


def classes_file_apart(config) -> list[ApartFrom]:
    """``--classes FILE``, read when planning: OUTPUT must not be it nor hold it."""
    return [ApartFrom("--classes file", config.classes_file)] if config.classes_file else []


def prefixed_location(source: str, prefix: str, example: str, what: str, strip: str | None = None) -> str:
    """What follows ``prefix`` in SOURCE (without the ``strip`` characters at its ends, when given); a SourceError
    saying what is missing when nothing does."""
    rest = source[len(prefix):]
    rest = rest.strip(strip) if strip else rest
    if not rest.strip():
        raise sources.SourceError(f"{prefix} needs {what}, e.g. {prefix}{example}")
    return rest
