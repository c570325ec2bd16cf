"""Every input accounted for: what the listing skips becomes a reject, layouts that match none of the documented ones
are refused, and a run that would write nothing fails with a hint. Pure functions, no Beam."""

from __future__ import annotations

import os

from shardprep.preprocess.elements import Reject
from shardprep.preprocess.sources import SPLIT_NAMES, SourceError, is_hidden

# Reject reasons of entries the listing does not read.
HIDDEN_FILE = "hidden_file"
HIDDEN_FOLDER = "hidden_folder"
SYMLINKED_FOLDER = "symlinked_folder"
CASE_MISMATCH = "case_mismatch"

_SKIPPED_DETAIL = {
    HIDDEN_FILE: "a hidden file (its name starts with '.'): not read; rename it to use it",
    HIDDEN_FOLDER: "a hidden folder (its name starts with '.'): nothing in it is read; rename it to use it",
    SYMLINKED_FOLDER: "a link to a folder inside a class folder: not followed (links can loop or leave SOURCE); "
                      "copy or move the folder there to use it",
}


def skipped_reject(split: str, key: str, reason: str, where: str = "") -> Reject:
    """The Reject of an entry the listing skipped."""
    return Reject(split, key, reason, _SKIPPED_DETAIL[reason] + where)


def mixed_layout_error(root: str, splits: list[str], others: list[str]) -> SourceError:
    """SOURCE holds split folders with class folders inside beside folders not named like a split."""
    return SourceError(
        f"{root} mixes split folders holding class folders ({', '.join(splits)}) with folders not named like a split "
        f"({', '.join(_few(others))}): expected SOURCE/<split>/<class>/<file> (split names: {', '.join(SPLIT_NAMES)}) "
        f"or SOURCE/<class>/<file>; move {', '.join(_few(others))} into a split folder, or point SOURCE at one split")


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


def empty_run_message(problems: list[str], rejects_path: str) -> str:
    return "; ".join(problems) + f". See {rejects_path}; no manifest written."


def walk_local(directory: str, recursive: bool) -> tuple[list[str], list[tuple[str, str]]]:
    """(files in a local ``directory``, and in its sub-folders when ``recursive``; (path, reject reason) of what is
    not read: hidden files and folders, and, when ``recursive``, links to folders, which are not followed)."""
    found, skipped = [], []
    for folder, sub_dirs, files in os.walk(directory):
        if recursive:
            for name in sub_dirs:
                path = os.path.join(folder, name)
                if is_hidden(name):
                    skipped.append((path, HIDDEN_FOLDER))
                elif os.path.islink(path):
                    skipped.append((path, SYMLINKED_FOLDER))
            sub_dirs[:] = sorted(d for d in sub_dirs if not is_hidden(d))
        else:
            sub_dirs[:] = []
        found += [os.path.join(folder, name) for name in files if not is_hidden(name)]
        skipped += [(os.path.join(folder, name), HIDDEN_FILE) for name in files if is_hidden(name)]
    return sorted(found), sorted(skipped)
