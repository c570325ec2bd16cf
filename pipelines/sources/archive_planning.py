"""Planning an archive SOURCE on the launcher: each archive indexed once, the folder rules applied
(``archive_layout``), labels joined, and the workers' read tasks made."""

from __future__ import annotations

import dataclasses
import os
from typing import NamedTuple

from shardprep.pipelines.sources.kind import (SourceKind, SourcePlan, file_stamp, open_file, ordered_classes,
                                             read_labels_file_rows)
from shardprep.preprocess.format import accounting
from shardprep.preprocess.sources import archive_index, archive_layout, labels, common as sources
from shardprep.preprocess.checks import names
from shardprep.preprocess.sources.archive_index import Member, MemberRef
from shardprep.preprocess.format.elements import Reject

MEMBERS_PER_TASK = 2000  # members named by one read task: a few tasks per worker even for a small archive
SPLIT_WORDS = (("train", "train"), ("val", "validation"), ("test", "test"))  # an archive's split, by its file name
ANNOTATION_WORDS = ("bbox", "annotation")  # image-net.org's ILSVRC2012_bbox_train_v2.tar.gz: a split's boxes


class MembersTask(NamedTuple):
    """Members of a seekable archive, already labelled: (source key, label, ``MemberRef`` text) each."""
    split: str
    entries: tuple[tuple[str, int, str], ...]


class NestedTask(NamedTuple):
    """A tar inside a tar, one class: a worker indexes its headers and names its members by range."""
    split: str
    archive: str
    key_prefix: str  # "n01440764/": the class folder its members would be extracted to
    label: int
    offset: int
    size: int


class StreamTask(NamedTuple):
    """A compressed tar read once front to back: ``wanted`` are (member name, occurrence, split, key, label)."""
    archive: str
    wanted: tuple[tuple[str, int, str, str, int], ...]


class ArchiveFile(NamedTuple):
    path: str
    type: str  # "tar", "tgz", "zip"
    split: str | None  # the split a folder of archives names it by; None: split folders inside, else --split
    size: int
    mtime_ns: int
    inner: str = ""  # the folder inside it that is SOURCE (ARCHIVE/PATH); "": all of it


@dataclasses.dataclass(frozen=True)
class ArchivePlan(SourcePlan):
    archives: tuple[ArchiveFile, ...] = ()
    tasks: tuple[MembersTask | NestedTask | StreamTask, ...] = ()


class _Found(NamedTuple):
    archive: ArchiveFile
    layout: archive_layout.ArchiveLayout
    stored: dict[int, tuple[str, int]]  # id of a member -> (its name as stored, its occurrence of that name)


RANGE_READ_CHUNK = 64 * 1024  # gs:// reads by range fetch at least this much (Beam's default: 16 MiB per seek)


def open_archive(path: str, sequential: bool = False):
    """A seekable file of an archive; on ``gs://`` reads by ``RANGE_READ_CHUNK`` unless ``sequential``."""
    if "://" not in path:
        return open(path, "rb")
    if path.startswith("gs://") and not sequential:
        from apache_beam.io.gcp import gcsio

        return gcsio.GcsIO().open(path, "rb", read_buffer_size=RANGE_READ_CHUNK)
    return open_file(path)


def plan_archives(kind: SourceKind, location: str, config) -> ArchivePlan:
    archives, not_used = _archive_files(location, config.split)
    found = [_index(archive, config.split) for archive in archives]
    layouts = [f.layout for f in found]
    flat = [item for layout in layouts for item in layout.flat]
    label_of, label_names = _flat_labels(config.labels_file, flat)
    unlabelled = _unlabelled(found, label_of)
    stored = [c for layout in layouts for c in layout.stored_classes]
    for name in stored:
        names.check(name, "class", f"the archive {location}", "rename it")
    class_names = ordered_classes(stored + sorted(label_names), f"the archive {location}", config)
    if not class_names:
        raise sources.SourceError(
            f"no classes found in {location}: expected <split>/<class>/<file>, <class>/<file>, a tar per class, or "
            "flat images with --labels-file" + (" (its images are not in class folders: did you forget "
                                                "--labels-file?)" if flat else ""))
    class_index = {name: i for i, name in enumerate(class_names)}
    class_index.update({name: class_index[names.canonical(name)] for name in stored})  # as stored: NFD too
    tasks, skipped = [], []
    for item in found:
        not_used += item.layout.not_used
        skipped_splits = {split for path, split in unlabelled if path == item.archive.path}
        not_used += [unlabelled[(item.archive.path, split)] for split in sorted(skipped_splits)]
        made, rejected = _tasks(item, class_index, label_of, config.labels_file is not None, skipped_splits)
        tasks += made
        skipped += rejected
    splits = sorted({task.split for task in tasks if not isinstance(task, StreamTask)}
                    | {w[2] for task in tasks if isinstance(task, StreamTask) for w in task.wanted}
                    | {reject.split for reject in skipped})
    if not splits:
        raise sources.SourceError(f"{location} holds no images to read")
    for split in splits:
        names.check(split, "split", f"the archive {location}")
    return ArchivePlan(kind=kind, location=location, splits=tuple(splits), classes=tuple(class_names),
                       skipped=tuple(sorted(skipped)), not_used=tuple(sorted(not_used)),
                       archives=tuple(archives), tasks=tuple(tasks))


def _archive_files(location: str, split: str) -> tuple[list[ArchiveFile], list[accounting.NotUsed]]:
    archive, inner = archive_index.split_inner(location)
    if archive_index.archive_type(archive):
        return [_archive_file(archive, None)._replace(inner=inner)], []
    archives: list[ArchiveFile] = []
    not_used: list[accounting.NotUsed] = []
    by_split: dict[str, str] = {}
    if "://" not in location:
        names = sorted(entry.name for entry in os.scandir(location) if not entry.is_dir())
    else:
        names = sorted(name for name in remote_names(location) if "/" not in name.rstrip("/"))
    for name in names:
        named = next((s for word, s in SPLIT_WORDS if word in name.lower()), None)
        if sources.is_hidden(name):
            not_used.append(accounting.NotUsed(name, accounting.HIDDEN_BESIDE))
        elif not archive_index.archive_type(name):
            not_used.append(accounting.NotUsed(name, "not an archive, beside the archives: not read"))
        elif named is None:
            not_used.append(accounting.NotUsed(name, "an archive whose name says no split (train, val, test): not "
                                                     "read"))
        elif any(word in name.lower() for word in ANNOTATION_WORDS):
            not_used.append(accounting.NotUsed(name, "an archive of annotations (bounding boxes, by its name), not "
                                                     "of images: not read"))
        elif named in by_split:
            raise sources.SourceError(f"{location} holds two archives of the split {named} ({by_split[named]}, "
                                      f"{name}): keep one")
        else:
            by_split[named] = name
            archives.append(_archive_file(location.rstrip("/") + "/" + name, named))
    if not archives:
        raise sources.SourceError(f"{location} holds no archive of a split (train, val or test in its name)")
    return archives, not_used


def remote_names(location: str) -> list[str]:
    """The names (paths below it) a remote folder's ``*`` matches."""
    from apache_beam.io.filesystems import FileSystems

    prefix = location.rstrip("/") + "/"
    return [m.path[len(prefix):] for m in FileSystems.match([prefix + "*"])[0].metadata_list]


def _archive_file(path: str, split: str | None) -> ArchiveFile:
    if "://" not in path and os.path.exists(path) and not os.path.isfile(path):
        raise sources.SourceError(f"{path} is not a file: an archive SOURCE is a .tar, .tar.gz, .tgz or .zip")
    stamp = file_stamp(path)
    if stamp is None:
        raise sources.SourceError(f"{path} does not exist")
    return ArchiveFile(path, archive_index.archive_type(path), split, *stamp)


def _index(archive: ArchiveFile, default_split: str) -> _Found:
    index, occurrences = _read_index(archive)
    nested_refused = {"zip": "a tar inside a zip is not read: extract it",
                      "tgz": "a tar inside a compressed tar is not read: extract it"}.get(archive.type)
    pairs = [(m if not nested_refused or archive_index.archive_type(m.name) != "tar" or m.problem else
              m._replace(problem=archive_index.NOT_A_FILE, detail=nested_refused), (m.name, occurrence))
             for m, occurrence in zip(index.members, occurrences)]
    if archive.inner:  # SOURCE is a folder inside: what lies outside it is not SOURCE's
        inner = archive.inner + "/"
        pairs = [(m._replace(name=m.name[len(inner):]), stored) for m, stored in pairs if m.name.startswith(inner)]
        if not pairs:
            raise sources.SourceError(f"{archive.path} holds nothing under {archive.inner}/")
    layout = archive_layout.arrange([m for m, _ in pairs], archive.split or default_split,
                                    key_prefix=f"{archive.split}/" if archive.split else "",
                                    fixed_split=archive.split is not None, where=archive.path)
    return _Found(archive, layout, {id(m): stored for m, stored in pairs})


def _read_index(archive: ArchiveFile) -> tuple[archive_index.ArchiveIndex, list[int]]:
    """(the archive's index, each member's occurrence of its name: 0, 1, ...); else SourceError."""
    try:
        with open_archive(archive.path, sequential=archive.type == "tgz") as raw:
            if archive.type == "tgz":
                members = [streamed.member for streamed in archive_index.stream_tar(raw, with_data=False)]
                index = archive_index.ArchiveIndex(members)
            else:
                index = (archive_index.index_zip if archive.type == "zip" else archive_index.index_tar)(raw)
    except archive_index.MemberError as e:
        raise sources.SourceError(f"cannot read the archive {archive.path}: {e}") from None
    except OSError as e:
        raise sources.SourceError(f"cannot read the archive {archive.path}: {type(e).__name__}: {e}") from None
    if index.damage:
        raise sources.SourceError(f"cannot read the archive {archive.path}: {index.damage}")
    seen: dict[str, int] = {}
    occurrences = []
    for member in index.members:
        seen[member.name] = seen.get(member.name, -1) + 1
        occurrences.append(seen[member.name])
    return index, occurrences


def _flat_labels(labels_file: str | None, flat) -> tuple[dict[str, str], set[str]]:
    """({file name: class} for flat images, every class): ``--labels-file``, else TFDS's ImageNet val labels."""
    if labels_file:
        present = {labels.file_name(key) for _, key, _ in flat}
        rows = _labels_rows(labels_file, lambda name: labels.file_name(name) in present)
        return {labels.file_name(row.filename): row.label for row in rows}, {row.label for row in rows}
    if any(labels.IMAGENET_VALIDATION_NAME.match(key.rsplit("/", 1)[-1]) for _, key, _ in flat):
        table = labels.imagenet_validation_labels()
        return table, set(table.values())
    return {}, set()


def _labels_rows(labels_file: str, file_exists) -> list[labels.LabelRow]:
    archive, inner = archive_index.split_inner(labels_file)
    if not inner:
        return read_labels_file_rows(labels_file, file_exists)
    try:
        with open_archive(archive, sequential=True) as raw:
            data = archive_index.read_named(raw, archive_index.archive_type(archive), inner)
    except (archive_index.MemberError, OSError) as e:
        raise sources.SourceError(f"cannot read labels file {labels_file}: {e}") from None
    return labels.csv_rows(data, labels_file, file_exists)


def _unlabelled(found: list[_Found], label_of: dict[str, str]) -> dict[tuple[str, str], accounting.NotUsed]:
    """{(archive path, split): NotUsed} of unlabelled flat splits, when another split gives inputs."""
    unlabelled, splits = {}, set()
    for item in found:
        layout = item.layout
        by_split: dict[str, list[str]] = {}
        for split, key, _ in layout.flat:
            by_split.setdefault(split, []).append(key)
        classed = {s for s, *_ in layout.images} | {s for s, *_ in layout.nested}
        splits |= {(item.archive.path, split) for split in set(by_split) | classed}
        for split, keys in by_split.items():
            if split in classed or any(labels.file_name(key) in label_of for key in keys):
                continue
            where = (item.archive.path.rsplit("/", 1)[-1] if item.archive.split or "/" not in keys[0]
                     else keys[0].rsplit("/", 1)[0] + "/")
            unlabelled[(item.archive.path, split)] = accounting.NotUsed(where, (
                f"no label names any of its {len(keys):,} image{'s' if len(keys) != 1 else ''} (an unlabelled split, "
                "such as a test set without labels): not read"))
    return unlabelled if len(unlabelled) < len(splits) else {}


def _tasks(item: _Found, class_index: dict[str, int], label_of: dict[str, str], labels_file_given: bool,
           unlabelled_splits: set[str]) -> tuple[list, list[Reject]]:
    """One archive's read tasks, and the rejects its names alone give."""
    layout, archive = item.layout, item.archive
    rejects = list(layout.rejects)
    labelled: list[tuple[str, str, int, Member]] = [(s, key, class_index[c], m) for s, key, c, m in layout.images]
    for split, key, member in layout.flat:
        if split in unlabelled_splits:
            continue
        found = label_of.get(labels.file_name(key))
        if found is None:
            rejects.append(Reject(split, sources.printable_key(key), "no_label", labels.NO_LABELS_FILE_DETAIL
                                  if not labels_file_given else "no row of the labels file names it"))
        else:
            labelled.append((split, key, class_index[found], member))
    kept = []
    for again, (split, key, label, member) in zip(stored_again([key for _, key, _, _ in labelled]), labelled):
        if reject := name_reject(split, key, again, "the archive", "not valid UTF-8"):
            rejects.append(reject)
        else:
            kept.append((split, key, label, member))
    nested = [NestedTask(split, archive.path, prefix, class_index[c], m.offset, m.size)
              for split, c, prefix, m in layout.nested]
    if archive.type == "tgz":
        wanted = tuple((*item.stored[id(m)], split, key, label) for split, key, label, m in kept)
        return ([StreamTask(archive.path, wanted)] if wanted else []) + nested, rejects
    tasks = []
    for split in sorted({s for s, *_ in kept}):
        entries = [(key, label, MemberRef.of(archive.path, m).text()) for s, key, label, m in kept if s == split]
        tasks += [MembersTask(split, tuple(entries[i:i + MEMBERS_PER_TASK]))
                  for i in range(0, len(entries), MEMBERS_PER_TASK)]
    return tasks + nested, rejects


def stored_again(keys: list[str]) -> list[bool]:
    """Per key: whether the archive stores it again later (then the last copy is read, as extraction does)."""
    last = {key: i for i, key in enumerate(keys)}
    return [last[key] != i for i, key in enumerate(keys)]


def name_reject(split: str, key: str, again: bool, holder: str, not_utf8: str,
                problem: Reject | None = None) -> Reject | None:
    """The reject of a member by its name (stored again later; ``problem``; not UTF-8), else None."""
    if again:
        return Reject(split, sources.printable_key(key), "duplicate_member",
                      f"{holder} holds this name again later; the last copy is read, as tar does")
    if problem is None and not sources.is_utf8(key):
        return Reject(split, sources.printable_key(key), "bad_file_name", f"the member name is {not_utf8}")
    return problem
