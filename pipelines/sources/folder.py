"""The folder kind: a path, local or ``gs://``, to ``DIR/<split>/<class>/<file>`` or ``DIR/<class>/<file>``; flat
images take their labels from ``--labels-file``. Planning lists SOURCE and its split folders one level at a time on
the launcher; the class folders are listed on the workers."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from typing import NamedTuple

from shardprep.pipelines.sources.kind import (ApartFrom, SourceKind, SourcePlan, Usage, classes_file_apart, exists,
                                             file_entry, is_local, labels_file_entries, ordered_classes,
                                             planned_entries, read_labels_file_rows)
from shardprep.preprocess.format import accounting, fingerprint, manifest
from shardprep.preprocess.sources import labels, common as sources
from shardprep.preprocess.checks import names, text
from shardprep.preprocess.format.elements import Reject


@dataclasses.dataclass(frozen=True)
class FolderPlan(SourcePlan):
    class_dirs: tuple[tuple[str, str, str], ...] = ()  # (split, class name, directory)
    flat_dirs: tuple[tuple[str, str], ...] = ()  # (split, directory) of images labelled by the labels file
    labels_split: str | None = None
    label_rows: tuple[tuple[str, tuple[str, str]], ...] = ()  # (labels.match_key of the file, (filename, label))


class Children(NamedTuple):
    """What one folder holds, one level down, each list sorted by name."""
    dirs: list[str]  # folders (and links to folders outside SOURCE), hidden ones apart
    files: list[str]  # everything else that is not hidden
    hidden: list[tuple[str, bool]]  # (name, is a folder) of names starting with '.'
    looping: list[str]  # links to folders back into SOURCE or to a folder holding it (local only)
    litter: list[tuple[str, bool]]  # (name, is a folder) of what an OS left (``accounting.is_os_litter``)


def list_children(path: str, source_root: str | None = None) -> Children:
    """What is directly inside ``path``; links to folders looping back into ``source_root`` set apart."""
    found: list[tuple[str, bool, os.DirEntry | None]]  # (name, is a folder as listed, the local entry)
    if is_local(path):
        if not os.path.isdir(path):
            raise sources.SourceError(f"{path} is not a directory")
        found = [(e.name, accounting.is_folder(e), e) for e in sorted(os.scandir(path), key=lambda e: e.name)]
    else:  # object stores have no directories; TensorFlow's file system lists one level with a delimiter query
        import tensorflow as tf

        try:
            listed = tf.io.gfile.listdir(path)
        except tf.errors.NotFoundError:  # what listdir says for every failure of its first probe: ask which it was
            raise _unlistable(path, tf) from None
        except tf.errors.OpError as e:
            raise sources.SourceError(listing_failure(path, e, tf)) from None
        # On gs:// sub-directories come back with a trailing "/": no probe (a request) per file is needed.
        probe = not path.startswith("gs://")
        found = [(name.rstrip("/"), name.endswith("/"), None) for name in sorted(listed)]
    children = Children([], [], [], [], [])
    for name, is_dir, entry in found:
        if accounting.is_os_litter(name, is_dir):
            children.litter.append((name, is_dir))
        elif sources.is_hidden(name):
            children.hidden.append((name, is_dir))
        elif not (is_dir or (entry is None and probe and tf.io.gfile.isdir(manifest.join(path, name)))):
            children.files.append(name)
        elif source_root and entry is not None and entry.is_symlink() and accounting.links_into(entry.path,
                                                                                                   source_root):
            children.looping.append(name)
        else:
            children.dirs.append(name)
    return children


def _unlistable(path: str, tf) -> sources.SourceError:
    """Why a remote ``path`` could not be listed (``listdir`` says "not a directory" for every failure)."""
    try:
        is_directory = tf.io.gfile.stat(path).is_directory
    except tf.errors.NotFoundError:
        return sources.SourceError(f"{path} does not exist" + _missing_bucket(path, tf))
    except tf.errors.OpError as e:
        return sources.SourceError(listing_failure(path, e, tf))
    return sources.SourceError(f"{path} could not be listed" if is_directory else
                               f"{path} is not a directory (it is a file)")


def _missing_bucket(path: str, tf) -> str:
    scheme, rest = path.split("://", 1)
    bucket = f"{scheme}://{rest.split('/', 1)[0]}"
    if bucket != path:
        try:
            tf.io.gfile.stat(bucket)
        except tf.errors.NotFoundError:
            return f": the bucket {bucket} does not exist"
        except tf.errors.OpError:
            pass
    return ""


def listing_failure(path: str, error: Exception, tf) -> str:
    """One line for a store that refused a listing or could not be reached."""
    detail = (getattr(error, "message", "") or str(error)).strip().splitlines()
    detail = f" ({detail[0][:300]})" if detail else ""
    if isinstance(error, (tf.errors.PermissionDeniedError, tf.errors.UnauthenticatedError)):
        return (f"cannot list {path}: access denied{detail}; check the credentials (gcloud auth application-default "
                "login, or GOOGLE_APPLICATION_CREDENTIALS) and their permission on the bucket")
    if isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError)):
        return f"cannot list {path}: the storage service could not be reached{detail}; check the network"
    return f"cannot list {path}: {type(error).__name__}{detail}"


class _FolderListing(NamedTuple):
    """What planning found at SOURCE's two top levels."""
    splits: list[str]
    class_dirs: list[tuple[str, str, str]]  # (split, class name in NFC, directory)
    flat_dirs: list[tuple[str, str]]  # (split, directory) of images read with the labels file
    skipped: list[Reject]  # hidden folders where classes are, links looping back into SOURCE
    not_used: list[accounting.NotUsed]  # beside the folders: not images, hidden, unlabelled splits


def _flat_files(split_dirs, children) -> list[tuple[str, str, list[str]]]:
    """(split, directory, file names) read with the labels file: beside class folders only images."""
    flat = []
    for split, directory in split_dirs:
        found = children[directory]
        files = [name for name in found.files if accounting.is_image_name(name)] if found.dirs else found.files
        if files:
            flat.append((split, directory, files))
    return flat


def _unlabelled_splits(root: str, flat, row_keys: set[str], children) -> dict[str, accounting.NotUsed]:
    """{split: NotUsed} of flat split folders no labels-file row names, when others are named."""
    named = {directory: any(labels.match_key(name) in row_keys for name in files) for _, directory, files in flat}
    if not any(named.values()):
        return {}  # the labels file names none of them: its rejects say why (case, missing files)
    return {split: accounting.NotUsed(sources.source_key(root, directory) + "/", accounting.unlabelled_reason(
                len(files)))
            for split, directory, files in flat
            if not named[directory] and directory != root and not children[directory].dirs}


def _refuse_flat_splits_beside_classes(root: str, flat, children) -> None:
    """Without a labels file, flat split folders beside splits of class folders are refused: all ``no_label``."""
    if not any(children[directory].dirs for directory in children if directory != root):
        return
    found = [(split, len(files)) for split, directory, files in flat if directory != root
             and not children[directory].dirs]
    if found:
        raise sources.SourceError(accounting.flat_split_error(found))


def _list_levels(root: str, split_dirs, top: Children, children, flat) -> _FolderListing:
    beside_splits = split_dirs[0][1] != root
    splits = [split for split, _ in split_dirs]
    top_split = "train" if beside_splits and "train" in splits else splits[0]
    listing = _FolderListing(splits, [], [], [], [])
    _list_level(root, root, top_split, top, listing, classes_here=not beside_splits)
    kept = {directory for _, directory in split_dirs}
    for split, directory in split_dirs:
        if directory != root:
            _list_level(root, directory, split, children[directory], listing, classes_here=True)
        for name in children[directory].dirs:
            where = f"the folder {names.printable(manifest.join(directory, name))}"
            if not sources.is_utf8(name) or not sources.is_utf8(directory):
                raise sources.SourceError(
                    f"the folder name {sources.printable_key(manifest.join(directory, name))} is not valid UTF-8; "
                    "class and split names are stored as text in the records and the manifest: rename the folder")
            listing.class_dirs.append((split, names.check(name, "class", where, "rename the folder"),
                                       manifest.join(directory, name)))
    listing.flat_dirs.extend((split, directory) for split, directory, _ in flat if directory in kept)
    return listing


def _list_level(root: str, directory: str, split: str, found: Children, listing: _FolderListing,
                classes_here: bool) -> None:
    """One level's rejects (hidden class folders, looping links) and what is not used."""
    def key(name: str) -> str:
        return sources.printable_key(sources.source_key(root, manifest.join(directory, name)))

    listing.not_used.extend(accounting.NotUsed(key(name) + ("/" if is_dir else ""), accounting.OS_LITTER)
                            for name, is_dir in found.litter)
    for name, is_dir in found.hidden:
        if is_dir and classes_here:
            listing.skipped.append(accounting.skipped_reject(split, key(name), accounting.HIDDEN_FOLDER))
        else:
            listing.not_used.append(accounting.NotUsed(key(name) + ("/" if is_dir else ""), accounting.HIDDEN_BESIDE))
    listing.skipped.extend(accounting.skipped_reject(split, key(name), accounting.LOOPING_LINK)
                           for name in found.looping)
    if found.dirs or found.looping or not classes_here:
        listing.not_used.extend(accounting.NotUsed(key(name), accounting.NOT_AN_IMAGE)
                                for name in found.files if not accounting.is_image_name(name))


def _split_dirs(root: str, top: Children, split: str) -> list[tuple[str, str]]:
    """(split, directory): the split folders when every folder has a split name, else SOURCE as ``split``."""
    dirs = top.dirs
    split_named = [d for d in dirs if d.lower() in sources.SPLIT_NAMES]
    if dirs and len(split_named) == len(dirs):
        if loose := [name for name in top.files if accounting.is_image_name(name)]:
            one = len(loose) == 1
            raise sources.SourceError(
                f"{root} holds split folders ({', '.join(dirs)}) and {'a loose image' if one else 'loose images'} "
                f"({', '.join(loose[:3])}{', ...' if len(loose) > 3 else ''}), which {'is' if one else 'are'} in no "
                f"split: move {'it' if one else 'them'} into a split's class folder "
                "(files that are not images, such as a README or a CSV, may stay: they are listed as not used)")
        return [(names.check(d, "split", f"the folder {names.printable(manifest.join(root, d))}", "rename the folder"),
                 manifest.join(root, d)) for d in dirs]
    nested = [d for d in split_named if list_children(manifest.join(root, d)).dirs]
    if nested:  # train/<class>/ beside cat/: neither layout; refused rather than made classes "train" and "cat"
        raise accounting.mixed_layout_error(root, nested, [d for d in dirs if d not in split_named])
    if len(dirs) == 1:  # the folder a download was extracted into: its one folder would be one class of everything
        inner = list_children(manifest.join(root, dirs[0])).dirs
        if inner and all(d.lower() in sources.SPLIT_NAMES for d in inner):
            raise accounting.holder_folder_error(root, dirs[0], inner)
    return [(split, root)]


def _labels_split(requested: str | None, listing: _FolderListing) -> str:
    splits = listing.splits
    labels_split = requested or next((s for s in ("validation", "val", "test") if s in splits), None) or (
        listing.flat_dirs[0][0] if listing.flat_dirs else splits[0])
    if labels_split not in splits:
        raise sources.SourceError(f"--labels-split {labels_split} is not one of the splits {splits}")
    return labels_split


class FolderSource(SourceKind):
    name = "folder"
    usage = (Usage("DIR", "class folders: DIR/<split>/<class>/<file> or DIR/<class>/<file> (ImageFolder)"),
             Usage("DIR --labels-file F", "images labelled by a CSV of filename,label"))
    options = ("labels_file", "labels_split", "classes_file")

    def apart_from(self, location: str, config) -> list[ApartFrom]:
        return [ApartFrom("SOURCE", location)] + ([ApartFrom("labels file", config.labels_file)]
                                                   if config.labels_file else []) + classes_file_apart(config)

    def plan(self, root: str, config) -> FolderPlan:
        source_root = os.path.realpath(root) if is_local(root) else None
        top = list_children(root, source_root)
        split_dirs = _split_dirs(root, top, config.split)
        children = {directory: top if directory == root else list_children(directory, source_root)
                    for _, directory in split_dirs}
        flat = _flat_files(split_dirs, children)
        rows, unlabelled = [], {}
        label_rows: tuple[tuple[str, tuple[str, str]], ...] = ()
        if config.labels_file:
            rows = read_labels_file_rows(config.labels_file,  # the pipeline gets these rows, not the file
                                         lambda name: any(exists(manifest.join(d, name)) for _, d, _ in flat))
            label_rows = tuple((labels.match_key(row.filename), (row.filename, row.label)) for row in rows)
            unlabelled = _unlabelled_splits(root, flat, {key for key, _ in label_rows}, children)
        else:
            _refuse_flat_splits_beside_classes(root, flat, children)
        listing = _list_levels(root, [(s, d) for s, d in split_dirs if s not in unlabelled], top, children, flat)
        stored = [posixpath.basename(directory) for _, _, directory in listing.class_dirs] + [row.label for row in rows]
        if not stored:
            raise sources.SourceError(
                f"no classes found in {root}: expected SOURCE/<split>/<class>/<file>, SOURCE/<class>/<file>, or "
                "images with --labels-file" + (" (its images are not in class folders: did you forget "
                                               "--labels-file?)" if listing.flat_dirs else ""))
        return FolderPlan(
            kind=self, location=root, splits=tuple(listing.splits),
            classes=tuple(ordered_classes(stored, f"the folder {names.printable(root)}", config)),
            class_dirs=tuple(listing.class_dirs), flat_dirs=tuple(listing.flat_dirs), label_rows=label_rows,
            labels_split=_labels_split(config.labels_split, listing) if config.labels_file else None,
            skipped=tuple(listing.skipped),
            not_used=tuple(sorted(listing.not_used + list(unlabelled.values()))))

    def notes_after_run(self, plan: FolderPlan, document: dict) -> tuple[str, ...]:
        """A note per class whose folders hold no file at all; only folders whose class got no record in their
        split are listed again."""
        from shardprep.pipelines.preprocess_job.listing import list_files

        source_root = os.path.realpath(plan.location) if is_local(plan.location) else None
        counts = {split: info.get("class_counts", {}) for split, info in document.get("splits", {}).items()}
        empty: dict[str, list[str]] = {}
        for split, class_name, directory in plan.class_dirs:
            if not counts.get(split, {}).get(class_name, 0) and list_files(directory, True, source_root) == ([], []):
                empty.setdefault(class_name, []).append(sources.printable_key(sources.source_key(plan.location,
                                                                                                   directory)))
        notes = []
        for class_name, folders in empty.items():
            one = len(folders) == 1
            said = f"class folder{'' if one else 's'} {text.series(folders)} hold{'s' if one else ''} no images"
            classes = document.get("classes", [])
            if class_name in classes and not any(split_counts.get(class_name, 0) for split_counts in counts.values()):
                said += (f"; {class_name} has none in any split, yet it is class {classes.index(class_name)} of the "
                         "dataset (a model trained on it has an output nothing trains): remove the "
                         f"folder{'' if one else 's'} and rerun to leave it out")
            notes.append(text.wrap(said, 74))
        return tuple(notes)

    def resume_refusal(self, plan: FolderPlan) -> str | None:
        if is_local(plan.location):
            return None
        return f"the SOURCE {plan.location} is not on this machine, and only a local folder's files are fingerprinted"

    def listed_entries(self, config, plan: FolderPlan) -> list[fingerprint.ListedEntry]:
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


FOLDER = FolderSource()
