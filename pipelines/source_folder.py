"""The folder kind: a path, local or ``gs://``, to ``DIR/<split>/<class>/<file>`` or ``DIR/<class>/<file>``; flat images
take their labels from ``--labels-file``. Planned by ``planning``, listed by ``listing.list_folder``; a local
folder's run keeps a journal, so ``--resume`` works.
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING, Callable

from shardprep.pipelines.source_kind import (ApartFrom, SourceKind, Usage, classes_file_apart, file_entry,
                                             labels_file_entries, planned_entries)
from shardprep.preprocess import accounting, fingerprint, sources, text

if TYPE_CHECKING:
    from shardprep.pipelines.planning import FolderPlan


class FolderSource(SourceKind):
    name = "folder"
    usage = (Usage("DIR", "class folders: DIR/<split>/<class>/<file> or DIR/<class>/<file> (ImageFolder)"),
             Usage("DIR --labels-file F", "images labelled by a CSV of filename,label"))
    options = ("labels_file", "labels_split", "classes_file")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        return [ApartFrom("SOURCE", location)] + ([ApartFrom("labels file", config.labels_file)]
                                                   if config.labels_file else []) + classes_file_apart(config)

    def plan(self, location: str, config) -> FolderPlan:
        from shardprep.pipelines.planning import plan_folder

        return plan_folder(self, location, config)

    def list_inputs(self, pbegin, config, plan: FolderPlan, progress_dir: str | None) -> dict:
        from shardprep.pipelines.listing import list_folder

        return list_folder(pbegin, config, plan, progress_dir)

    def notes_after_run(self, plan: FolderPlan, document: dict) -> tuple[str, ...]:
        from shardprep.pipelines.listing import list_files

        source_root = os.path.realpath(plan.location) if _is_local(plan.location) else None
        return empty_class_notes(plan, document, lambda folder: list_files(folder, True, source_root))

    def resume_refusal(self, plan: FolderPlan) -> str | None:
        from shardprep.pipelines.storage import is_local

        if is_local(plan.location):
            return None
        return f"the SOURCE {plan.location} is not on this machine, and only a local folder's files are fingerprinted"

    def listed_entries(self, config, plan: FolderPlan) -> list[fingerprint.ListedEntry]:
        """The plan's entries, then every file of the class and flat folders by source key, then the labels file."""
        root = plan.location
        source_root = os.path.realpath(root)
        entries = planned_entries(plan)
        not_used = {entry.path for entry in plan.not_used}
        folders = [(directory, True) for _, _, directory in plan.class_dirs] + [(d, False) for _, d in plan.flat_dirs]
        for directory, recursive in folders:
            paths, skipped = accounting.walk_local(directory, recursive, source_root if recursive else None)
            entries += [fingerprint.ListedEntry(sources.printable_key(sources.source_key(root, path)), -1, 0, reason)
                        for path, reason in skipped]
            entries += [file_entry(sources.printable_key(sources.source_key(root, path)), path) for path in paths
                        if sources.source_key(root, path) not in not_used]
        return entries + labels_file_entries(config)


def empty_class_notes(plan: FolderPlan, document: dict, listed: Callable) -> tuple[str, ...]:
    """A note per class whose folders hold no file at all (``listed(directory)``: its files and skipped entries),
    for the folders whose class got no record in their split (others are not listed again); a folder whose files
    were all rejected is in rejects.jsonl instead. The class stays a class, as classes are the class folders' names
    (its label, and every other label, as they were); a class without an image in any split is said to be one."""
    counts = {split: info.get("class_counts", {}) for split, info in document.get("splits", {}).items()}
    empty: dict[str, list[str]] = {}
    for split, class_name, directory in plan.class_dirs:
        if counts.get(split, {}).get(class_name, 0) == 0 and listed(directory) == ([], []):
            empty.setdefault(class_name, []).append(sources.printable_key(sources.source_key(plan.location,
                                                                                               directory)))
    notes = []
    for class_name, folders in empty.items():
        one = len(folders) == 1
        named = text.series(folders)
        said = f"class folder{'' if one else 's'} {named} hold{'s' if one else ''} no images"
        classes = document.get("classes", [])
        if class_name in classes and not any(split_counts.get(class_name, 0) for split_counts in counts.values()):
            said += (f"; {class_name} has none in any split, yet it is class {classes.index(class_name)} of the "
                     "dataset (a model trained on it has an output nothing trains): remove the "
                     f"folder{'' if one else 's'} and rerun to leave it out")
        notes.append(textwrap.fill(said, width=74, subsequent_indent="  ", break_long_words=False,
                                   break_on_hyphens=False))
    return tuple(notes)


def _is_local(path: str) -> bool:
    from shardprep.pipelines.storage import is_local

    return is_local(path)


FOLDER = FolderSource()
