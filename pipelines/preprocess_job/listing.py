"""Listing: the planned source into an ``Input`` per image and a ``Reject`` per entry that gives none: ``ReadTasks``
(read tasks spread over the workers) or ``list_folder`` (class folders spread, flat files joined with the labels
file's rows). ``GivenValues``/``SpreadValues`` start a graph in as few ParDos as Beam allows."""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from shardprep.pipelines.runtime import progress
from shardprep.pipelines.runtime.storage import is_local
from shardprep.pipelines.sources.folder import FolderPlan
from shardprep.preprocess.format import accounting, manifest
from shardprep.preprocess.sources import labels, common as sources
from shardprep.preprocess.checks import names
from shardprep.preprocess.format.elements import REJECTS, Input, Reject


@beam.ptransform_fn
def ListInputs(pbegin, config, plan, progress_dir: str | None = None):
    """The pipeline's start -> {"inputs": Input, "rejects": Reject}: the planned source, each input once."""
    if isinstance(plan, FolderPlan):
        return list_folder(pbegin, config, plan, progress_dir)
    kind = plan.kind
    read = pbegin | "ReadTasks" >> ReadTasks(kind.read_tasks(plan), kind.task_reader(config, plan), progress_dir)
    found = listed(pbegin, plan, [read["inputs"]], [read["rejects"]])
    return found | {"inputs": found["inputs"] | "FanOut" >> beam.Reshuffle()} if kind.fans_out else found


def listed(pbegin, plan, inputs: list, rejects: list) -> dict:
    """{"inputs": Input, "rejects": Reject} of a listing's parts, with the rejects planning found."""
    if plan.skipped:
        rejects = rejects + [pbegin | "SkippedEntries" >> GivenValues(plan.skipped)]
    return {"inputs": inputs[0] if len(inputs) == 1 else inputs | "AllInputs" >> beam.Flatten(),
            "rejects": rejects[0] if len(rejects) == 1 else rejects | "AllListingRejects" >> beam.Flatten()}


def list_folder(pbegin, config, plan, progress_dir: str | None) -> dict:
    class_index = {name: i for i, name in enumerate(plan.classes)}
    found = pbegin | "ClassFolders" >> ReadTasks(plan.class_dirs, ClassDirectoryReader(plan.location, class_index),
                                                 progress_dir)
    inputs, rejects = [found["inputs"]], [found["rejects"]]
    if plan.flat_dirs or config.labels_file:
        labelled = pbegin | "FlatFiles" >> ListLabelledFiles(config, plan, class_index, progress_dir)
        inputs.append(labelled["inputs"])
        rejects.append(labelled["rejects"])
    return listed(pbegin, plan, inputs, rejects)


@beam.ptransform_fn
def ReadTasks(pbegin, tasks, reader, progress_dir: str | None):
    """``tasks`` spread over the workers, each read where it lands by ``reader``."""
    read = (pbegin
            | "SpreadTasks" >> SpreadValues(tasks)
            # Output types declared: Beam would infer them from the DoFn's bytecode, at start-up
            | "ListTask" >> beam.ParDo(TaskLister(reader, progress_dir)).with_output_types(beam.typehints.Any)
            .with_outputs(REJECTS, main="inputs"))
    return {"inputs": read.inputs, "rejects": read[REJECTS]}


class TaskLister(beam.DoFn):
    """A read task -> what ``reader`` makes of it: Inputs and Rejects, each counted as listed."""

    def __init__(self, reader, progress_dir: str | None):
        self.reader, self.progress_dir = reader, progress_dir

    def setup(self):
        self.progress = progress.ProgressReporter(self.progress_dir, "listed")

    def process(self, task):
        for item in self.reader(task):
            self.progress.add()
            yield beam.pvalue.TaggedOutput(REJECTS, item) if isinstance(item, Reject) else item

    def finish_bundle(self):
        self.progress.flush()


@beam.ptransform_fn
def ListLabelledFiles(pbegin, config, plan, class_index: dict[str, int], progress_dir: str | None):
    """The plan's flat files joined by case-folded file name with the labels file's rows; mismatches are rejects."""
    not_used = frozenset(entry.path for entry in plan.not_used)
    flat = (pbegin
            | "Directories" >> GivenValues(plan.flat_dirs)  # (split, directory)
            | "ListFlatFiles" >> beam.ParDo(FlatDirectoryLister(plan.location, not_used)).with_outputs(
                REJECTS, main="files"))
    # Pickled in one DoFn: beam.Create would infer a type from each row (4.3 s for ImageNet's 50,000, not 0.1).
    rows = pbegin | "LabelRows" >> GivenValues(plan.label_rows, LABEL_ROW)
    joiner = JoinLabels(class_index, plan.labels_split or names.canonical(config.split), config.labels_file is not None)
    joined = ({"files": flat.files, "rows": rows}
              | "JoinLabels" >> beam.CoGroupByKey()
              | "LabelFlatFiles" >> beam.Map(lambda kv: (kv[0], (list(kv[1]["files"]), list(kv[1]["rows"]))))
              | "CheckLabels" >> beam.ParDo(TaskLister(joiner, progress_dir)).with_outputs(REJECTS, main="inputs"))
    return {"inputs": joined.inputs, "rejects": (flat[REJECTS], joined[REJECTS]) | "FlatFileRejects" >> beam.Flatten()}


LABEL_ROW = beam.typehints.Tuple[str, beam.typehints.Tuple[str, str]]  # (labels.match_key, (filename, label))


class ClassDirectoryReader:
    """A read task (split, class name, directory) -> an Input per file in it or its sub-folders, or a Reject."""

    def __init__(self, root: str, class_index: dict[str, int]):
        self.root, self.class_index = root, class_index

    def __call__(self, element):
        split, class_name, directory = element
        source_root = os.path.realpath(self.root) if is_local(self.root) else None
        paths, skipped = list_files(directory, recursive=True, source_root=source_root)
        for path, reason in skipped:
            yield accounting.skipped_reject(split, sources.printable_key(sources.source_key(self.root, path)), reason)
        for path in paths:
            key = sources.source_key(self.root, path)
            yield (Input(split, key, self.class_index[class_name], path, None) if sources.is_utf8(path)
                   else _bad_file_name(split, key))


class FlatDirectoryLister(beam.DoFn):
    """(split, directory) -> (``labels.match_key``, (split, source key, path)) per file not in ``not_used``."""

    def __init__(self, root: str, not_used: frozenset[str] = frozenset()):
        self.root, self.not_used = root, not_used

    def process(self, element):
        split, directory = element
        for path in list_files(directory)[0]:  # hidden entries here were listed when planning
            key = sources.source_key(self.root, path)
            if key in self.not_used:
                continue
            # Grouped with rows by case-folded name, so that names differing only in case are told apart.
            yield ((labels.match_key(path), (split, key, path)) if sources.is_utf8(path)
                   else beam.pvalue.TaggedOutput(REJECTS, _bad_file_name(split, key)))


class JoinLabels:
    """(case-folded name, ([(split, key, path)], [(filename, label)])) -> an Input per file with one label, else a
    Reject (a TaskLister's reader)."""

    def __init__(self, class_index: dict[str, int], labels_split: str, labels_file_given: bool = True):
        self.class_index, self.labels_split = class_index, labels_split
        self.labels_file_given = labels_file_given  # without one, a flat file's reject says that one is needed

    def __call__(self, element):
        _, (files, rows) = element  # keyed by the case-folded file name
        for kind, *fields in labels.join(files, rows, self.labels_split, self.labels_file_given):
            if kind == "reject":
                yield fields[0]
            else:
                split, key, label, path = fields
                yield Input(split, key, self.class_index[label], path, None)


def _bad_file_name(split: str, key: str) -> Reject:
    # Records, the runner's coders and rejects.jsonl all need text.
    return Reject(split, sources.printable_key(key), "bad_file_name",
                  "the file name is not valid UTF-8: rename the file")


def list_files(directory: str, recursive: bool = False,
               source_root: str | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """(the files in ``directory``, [(path, reject reason)] of hidden entries and links not followed). Links to
    missing files and special files are listed: reading them makes "unreadable" rejects."""
    if is_local(directory):
        return accounting.walk_local(directory, recursive, source_root)
    pattern = manifest.join(directory, "**" if recursive else "*")
    paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list if not m.path.endswith("/")]
    hidden = {path for path in paths if any(sources.is_hidden(part) for part in path[len(directory):].split("/"))}
    return sorted(set(paths) - hidden), sorted((path, accounting.HIDDEN_FILE) for path in hidden)


@beam.ptransform_fn
def GivenValues(pbegin, values, output_type=beam.typehints.Any):
    """The pipeline's start -> each of ``values``: ``beam.Create`` in one ParDo instead of two."""
    return pbegin | "Start" >> beam.Impulse() | "Values" >> beam.FlatMap(
        lambda _, given: given, list(values)).with_output_types(output_type)


@beam.ptransform_fn
def SpreadValues(pbegin, values):
    """The pipeline's start -> each of ``values``, spread over the workers (``Reshuffle`` in two ParDos, not six)."""
    return (pbegin
            | "Start" >> beam.Impulse()
            | "KeyedByIndex" >> beam.FlatMap(lambda _, given: enumerate(given), list(values)).with_output_types(
                beam.typehints.KV[int, beam.typehints.Any])
            | "Spread" >> beam.GroupByKey()
            | "Values" >> beam.FlatMap(lambda keyed: keyed[1]).with_output_types(beam.typehints.Any))
