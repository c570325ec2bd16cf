"""Labels files, read one way wherever they are used: the labels CSV (``filename,label``, or Kaggle's
``ImageId,PredictionString``) and TFDS's ``label.labels.txt`` (one class name a line), and the join of CSV rows with
flat image files. Pure, no Beam. File names and labels are compared in NFC (``names.canonical``)."""

from __future__ import annotations

import dataclasses

from shardprep.preprocess import accounting, names, sources
from shardprep.preprocess.elements import Reject

# The most classes a source may have: its class names, or without names its largest label + 1 (the manifest then
# names each by its integer). Bounds what a hostile label (10**12) can make us write or hold.
MAX_CLASSES = 100_000
MAX_NAMES_BYTES = 4 << 20  # a file of class names, one a line: 100,000 names of 40 bytes


def csv_rows(data: bytes, path: str, file_exists) -> list[sources.LabelRow]:
    """The rows of a labels CSV's bytes; SourceError for an encoding, a row or a label that cannot be used, and for a
    first row that looks like a header shardprep does not know (``file_exists(name)``: is it a flat image's name)."""
    rows = sources.parse_labels_csv(sources.decode_labels_csv(data, path), f"labels file {path}")
    if not rows:
        raise sources.SourceError(f"labels file {path} has no rows; expected lines of filename,label")
    first = rows[0]
    if not sources.has_file_extension(first.filename) and not file_exists(sources.labels_key(first.filename)):
        raise sources.unknown_header_error(f"labels file {path}", first)
    return [dataclasses.replace(row, label=names.check(row.label, "class", f"labels file {path} line {row.line}",
                                                       "fix the label")) for row in rows]


def match_key(filename: str) -> str:
    """How a labels-file row and an image file are grouped for the join: the file name, in NFC, case-folded (so
    that names differing only in case meet, and are told apart as ``case_mismatch`` rejects)."""
    return names.canonical(sources.labels_key(filename)).casefold()


def file_name(filename: str) -> str:
    """The file name a row and a file are matched by exactly: the part after the last '/', in NFC."""
    return names.canonical(sources.labels_key(filename))


def class_names_txt(data: bytes, path: str) -> list[str] | None:
    """Class names, one a line (blank lines skipped), from a ``label.labels.txt``; None when it names none. At most
    MAX_NAMES_BYTES and MAX_CLASSES of them (``data`` may be the file's first MAX_NAMES_BYTES + 1 bytes)."""
    if len(data) > MAX_NAMES_BYTES:
        raise sources.SourceError(f"{path} is more than {MAX_NAMES_BYTES:,} bytes: class names are one a line, at "
                                  f"most {MAX_CLASSES:,} of them")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise sources.SourceError(f"{path} line {line} is not valid UTF-8: class names are one a line in UTF-8") from None
    # Lines end at "\n" only ("\r\n" too): str.splitlines would also cut a name at U+0085 or U+2028, shifting every
    # label after it by one; such a character is refused by the rule for names instead.
    lines = [(number, line.strip()) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if len(lines) > MAX_CLASSES:
        raise sources.SourceError(f"{path} names {len(lines):,} classes, more than the {MAX_CLASSES:,} shardprep takes")
    for number, name in lines:
        names.check(name, "class", f"{path} line {number}", "fix that line")
    return [name for _, name in lines] or None


NO_LABELS_FILE_DETAIL = ("not in a class folder, and no --labels-file was given: images outside class folders need one "
                         "(a CSV of filename,label)")


def join(files, rows, labels_split: str, labels_file_given: bool = True):
    """Flat image files ``(split, key, path)`` and labels-file rows ``(filename, label)`` whose file names are equal
    once case-folded: yields ``("input", split, key, label, path)`` per labelled file and ``("reject", Reject)`` per
    file without one label and per row without its file. Names must match exactly: a pair that differs only in case
    is two ``case_mismatch`` rejects. Without a labels file (``labels_file_given`` false) a flat file's
    ``no_label`` reject says that one is needed, not that the file lacks its row."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for filename, label in rows:
        by_name.setdefault(file_name(filename), []).append((filename, label))
    file_names = {file_name(path) for _, _, path in files}
    for split, key, path in sorted(files):
        name = file_name(path)
        found = sorted({label for _, label in by_name.get(name, ())})
        if not found and rows:
            others = ", ".join(sorted({filename for filename, _ in rows}))
            yield "reject", Reject(split, key, accounting.CASE_MISMATCH,
                             f"the labels file names {others}, which differs only in case; names must match exactly")
        elif not found and not labels_file_given:
            yield "reject", Reject(split, key, "no_label", NO_LABELS_FILE_DETAIL)
        elif not found:
            yield "reject", Reject(split, key, "no_label", f"{name} is not in the labels file")
        elif len(found) > 1:
            yield "reject", Reject(split, key, "conflicting_labels", f"labels file gives {', '.join(found)}")
        else:
            yield "input", split, key, found[0], path
    for filename, label in sorted(rows):
        if file_name(filename) in file_names:
            continue
        key = f"labels-file:{filename}"
        if files:
            yield "reject", Reject(labels_split, key, accounting.CASE_MISMATCH,
                             f"labels file row {filename},{label}: the source folder has "
                             f"{', '.join(sorted(file_names))}, which differs only in case; names must match exactly")
        else:
            yield "reject", Reject(labels_split, key, "missing_file",
                             f"labels file row {filename},{label} names no image in the source folder")
