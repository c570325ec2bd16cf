"""Every input accounted for: what the listing skips becomes a reject, what lies beside the folders is listed as not
used, undocumented layouts are refused, and a run that would write nothing fails with a hint. Pure, no Beam."""

from __future__ import annotations

import os
from typing import NamedTuple

from shardprep.preprocess.format.elements import Reject
from shardprep.preprocess.format.manifest import IMAGE_SUFFIXES
from shardprep.preprocess.sources.common import SPLIT_NAMES, SourceError, is_hidden

HIDDEN_FILE = "hidden_file"
HIDDEN_FOLDER = "hidden_folder"
SYMLINKED_FOLDER = "symlinked_folder"
LOOPING_LINK = "looping_link"
CASE_MISMATCH = "case_mismatch"
EXCLUDED = "excluded"  # a key the --exclude file lists: read, but left out as asked

_SKIPPED_DETAIL = {
    HIDDEN_FILE: "a hidden file (its name starts with '.'): not read; rename it to use it",
    HIDDEN_FOLDER: "a hidden folder (its name starts with '.'): nothing in it is read; rename it to use it",
    SYMLINKED_FOLDER: "a link to a folder inside a class folder: not followed (links can loop or leave SOURCE); "
                      "copy or move the folder there to use it",
    LOOPING_LINK: "a link back into SOURCE, or to a folder holding it: not followed (it would read those images "
                  "again, or forever); remove the link, or copy what it points to",
}

# Why an entry beside the split or class folders is not used (the manifest's not_used).
NOT_AN_IMAGE = "not an image (by its name), beside the folders: not read"
HIDDEN_BESIDE = "hidden (its name starts with '.'), beside the folders: not read"
OS_LITTER = ("left by an operating system (macOS's __MACOSX/, ._ files and .DS_Store; Windows's Thumbs.db and "
             "desktop.ini), not part of the dataset: not read")

_LITTER_FOLDERS = ("__MACOSX",)  # what macOS's "Compress" adds beside the folders it zips
_LITTER_FILES = (".ds_store", "thumbs.db", "desktop.ini")  # Finder's and Explorer's folder settings, in any case


class NotUsed(NamedTuple):
    """An entry beside the split or class folders that is not an input: its path (a folder's ends with '/') and why."""
    path: str
    reason: str

    def to_json(self) -> dict:
        return {"path": self.path, "reason": self.reason}


def is_image_name(name: str) -> bool:
    """True for a file named like an image: beside folders only these are inputs."""
    return name.lower().endswith(IMAGE_SUFFIXES)


def is_os_litter(name: str, is_dir: bool = False) -> bool:
    """True for what an OS leaves in folders (``__MACOSX/``, ``._*``, ``.DS_Store``, ...): never an input."""
    return name in _LITTER_FOLDERS if is_dir else name.startswith("._") or name.casefold() in _LITTER_FILES


def unlabelled_reason(count: int) -> str:
    return (f"no --labels-file row names any of its {count:,} file{'s' if count != 1 else ''} (an unlabelled split, "
            "such as a test set without labels): not read")


def flat_split_error(found: list[tuple[str, int]]) -> str:
    splits = ", ".join(f"{split} ({count:,} file{'s' if count != 1 else ''})" for split, count in found)
    return (f"split {splits} holds images not in class folders, and no --labels-file names their classes: did you "
            "forget --labels-file? (a split it names none of, such as an unlabelled test set, is then not used; or "
            "move the folder out of SOURCE)")


def skipped_reject(split: str, key: str, reason: str) -> Reject:
    return Reject(split, key, reason, _SKIPPED_DETAIL[reason])


def mixed_layout_error(root: str, splits: list[str], others: list[str]) -> SourceError:
    return SourceError(
        f"{root} mixes split folders holding class folders ({', '.join(splits)}) with folders not named like a split "
        f"({', '.join(_few(others))}): expected SOURCE/<split>/<class>/<file> (split names: {', '.join(SPLIT_NAMES)}) "
        f"or SOURCE/<class>/<file>; move {', '.join(_few(others))} into a split folder, or point SOURCE at one split")


def holder_folder_error(root: str, folder: str, splits: list[str]) -> SourceError:
    """SOURCE holds one folder, which holds split folders: the dataset is that folder."""
    return SourceError(
        f"{root} holds one folder, {folder}, which holds split folders ({', '.join(_few(sorted(splits)))}): give "
        f"{root.rstrip('/')}/{folder} as SOURCE (as given, {folder} would be one class holding every split's images)")


def _few(names: list[str], shown: int = 5) -> list[str]:
    return names[:shown] + ([f"... ({len(names)} in all)"] if len(names) > shown else [])


def empty_run_problem(split: str, num_inputs: int, rejected: dict[str, int], labels_file: str | None,
                      max_pixels: int) -> str | None:
    """Why a split with inputs writes no example (every input rejected), with a hint; None when it writes some."""
    if num_inputs == 0 or sum(rejected.values()) < num_inputs:
        return None
    reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(rejected.items(), key=lambda kv: (-kv[1], kv[0])))
    if rejected.get(CASE_MISMATCH):
        hint = ("file names and labels-file names differ only in case (names must match exactly): rename the files "
                "or fix the labels file")
    elif rejected.get("no_label") and not labels_file:
        hint = "its images are not in class folders: did you forget --labels-file?"
    elif rejected.get("no_label") or rejected.get("missing_file"):
        hint = "no labels-file row names one of its files (rows match files by file name)"
    elif rejected.get("corrupt_record") or rejected.get("bad_record"):
        hint = ("its files are not TFRecords of encoded images with the --image-key/--label-key features (does the "
                "tfrecord: pattern match image files?)")
    elif set(rejected) <= {HIDDEN_FILE, HIDDEN_FOLDER, SYMLINKED_FOLDER}:
        hint = "it holds only hidden entries (names starting with '.') or links to folders, which are not read"
    elif rejected.get("too_many_pixels"):
        hint = f"check --max-pixels ({max_pixels:,}) and --shorter-side"
    else:
        hint = "every input was bad"
    return f"split {split}: all {num_inputs} inputs were rejected ({reasons}), nothing would be written: {hint}"


def walk_local(directory: str, recursive: bool,
               source_root: str | None = None) -> tuple[list[str], list[tuple[str, str]]]:
    """(files in ``directory``, and below when ``recursive``; (path, reject reason) of what is not read: hidden
    entries, links to folders, and links into ``source_root``). ``scandir`` tells links apart without a stat per
    file."""
    found, skipped = [], []
    folders = [directory]
    while folders:
        folder = folders.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            continue  # as os.walk: a folder that cannot be listed lists nothing (its reads would fail the same way)
        for entry in entries:
            path = os.path.join(folder, entry.name)
            if is_folder(entry):
                if not recursive:
                    continue
                if is_hidden(entry.name):
                    skipped.append((path, HIDDEN_FOLDER))
                elif entry.is_symlink():
                    skipped.append((path, SYMLINKED_FOLDER))
                else:
                    folders.append(path)
            elif is_hidden(entry.name):
                skipped.append((path, HIDDEN_FILE))
            elif (source_root is not None and entry.is_symlink() and os.path.exists(path)
                  and links_into(path, source_root)):
                skipped.append((path, LOOPING_LINK))  # a dangling link is read, and rejected as unreadable
            else:
                found.append(path)
    return sorted(found), sorted(skipped)


def is_folder(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def links_into(link: str, source_root: str) -> bool:
    """True when ``link`` resolves to ``source_root`` (a real path), into it, or to a folder holding it."""
    target = os.path.realpath(link)
    return (target == source_root or target.startswith(source_root.rstrip("/") + "/")
            or source_root.startswith(target.rstrip("/") + "/"))
