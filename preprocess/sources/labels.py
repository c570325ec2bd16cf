"""Labels files, read one way wherever used: the labels CSV (``filename,label`` or Kaggle's
``ImageId,PredictionString``), class names one a line, ImageNet's validation labels from tensorflow-datasets, and the
join of CSV rows with flat image files. Pure; names compare in NFC."""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import os
import re

from shardprep.preprocess.format import accounting
from shardprep.preprocess.checks import names
from shardprep.preprocess.format.elements import Reject
from shardprep.preprocess.sources import wordnet_names
from shardprep.preprocess.sources.common import SourceError

# The most classes (names, or the largest label + 1): bounds what a hostile label (10**12) makes us write or hold.
MAX_CLASSES = 100_000
MAX_NAMES_BYTES = 4 << 20  # a file of class names, one a line: 100,000 names of 40 bytes


@dataclasses.dataclass(frozen=True)
class LabelRow:
    line: int
    filename: str
    label: str


FILENAME_HEADERS = ("filename", "file", "file_name", "image", "image_name", "path", "name")
LABEL_HEADERS = ("label", "class", "class_name", "category", "wnid")
KAGGLE_HEADER = ("imageid", "predictionstring")
KAGGLE_IMAGE_SUFFIX = ".JPEG"  # Kaggle's ImageNet files are ImageId.JPEG
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


def csv_rows(data: bytes, path: str, file_exists) -> list[LabelRow]:
    """The rows of a labels CSV (UTF-8, a BOM dropped); SourceError for a bad encoding, row or label, and for an
    unknown header (``file_exists(name)``: is it a flat image's name)."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise SourceError(f"labels file {path} is {encoding} (it starts with a {encoding} byte order mark): "
                              "save it as UTF-8")
    data = data.removeprefix(b"\xef\xbb\xbf")
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise SourceError(f"labels file {path} line {line} has a NUL byte: it is not a text CSV (binary, or UTF-16 "
                          "without a byte order mark); save it as UTF-8 text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SourceError(f"labels file {path} line {line} is not valid UTF-8 (byte 0x{data[e.start]:02x} at column "
                          f"{column}; Latin-1 or Windows-1252?): save it as UTF-8") from None
    rows = parse_labels_csv(text, f"labels file {path}")
    if not rows:
        raise SourceError(f"labels file {path} has no rows; expected lines of filename,label")
    first = rows[0]
    if not has_file_extension(first.filename) and not file_exists(labels_key(first.filename)):
        raise SourceError(
            f"labels file {path} line {first.line} ({first.filename},{first.label}) looks like a header shardprep "
            "does not understand (no file of that name, no file extension): use the header 'filename,label' (first "
            f"column {'/'.join(FILENAME_HEADERS)}; second {'/'.join(LABEL_HEADERS)}) or none")
    return [dataclasses.replace(row, label=names.check(row.label, "class", f"labels file {path} line {row.line}",
                                                       "fix the label")) for row in rows]


def has_file_extension(filename: str) -> bool:
    return "." in labels_key(filename).strip(".")


def parse_labels_csv(text: str, path: str = "labels file") -> list[LabelRow]:
    """``filename,label`` rows (a known header skipped) or Kaggle's ``ImageId,PredictionString`` rows."""
    rows: list[LabelRow] = []
    reader = csv.reader(io.StringIO(text))
    kaggle = False
    try:
        for fields in reader:
            line_number = reader.line_num
            if not fields or all(not f.strip() for f in fields):
                continue
            if not rows and not kaggle and tuple(f.strip().lower() for f in fields) == KAGGLE_HEADER:
                kaggle = True
            elif kaggle:
                rows.append(kaggle_row(fields, line_number, path))
            elif len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
                raise SourceError(f"{path} line {line_number}: expected 'filename,label', got {','.join(fields)!r}")
            elif rows or not (fields[0].strip().lower() in FILENAME_HEADERS
                              and fields[1].strip().lower() in LABEL_HEADERS):
                rows.append(LabelRow(line_number, fields[0].strip(), fields[1].strip()))
    except csv.Error as e:
        raise SourceError(f"{path} line {reader.line_num}: not a CSV row ({e})") from None
    return rows


def kaggle_row(fields: list[str], line: int, path: str) -> LabelRow:
    """A Kaggle ``LOC_val_solution.csv`` row: the class is PredictionString's first word, the file ``ImageId.JPEG``."""
    words = fields[1].split() if len(fields) == 2 else []
    if len(fields) != 2 or not fields[0].strip() or not words:
        raise SourceError(f"{path} line {line}: expected 'ImageId,PredictionString' with the class as the first "
                          f"word of PredictionString, got {','.join(fields)!r}")
    image_id = fields[0].strip()
    return LabelRow(line, image_id if has_file_extension(image_id) else image_id + KAGGLE_IMAGE_SUFFIX, words[0])


def labels_key(filename: str) -> str:
    """A row and an image file match by file name: the part after the last '/'."""
    return filename.replace("\\", "/").rsplit("/", 1)[-1]


def match_key(filename: str) -> str:
    """The join's grouping key: the file name in NFC, case-folded, so that case-only differences meet."""
    return file_name(filename).casefold()


def file_name(filename: str) -> str:
    return names.canonical(labels_key(filename))


def class_names_txt(data: bytes, path: str) -> list[str] | None:
    """Class names, one a line (blank lines skipped), or None when it names none; bounded by MAX_NAMES_BYTES and
    MAX_CLASSES."""
    if len(data) > MAX_NAMES_BYTES:
        raise SourceError(f"{path} is more than {MAX_NAMES_BYTES:,} bytes: class names are one a line, at "
                                  f"most {MAX_CLASSES:,} of them")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise SourceError(f"{path} line {line} is not valid UTF-8: class names are one a line in UTF-8") from None
    # Lines end at "\n" only: str.splitlines would also cut at U+0085 or U+2028, shifting every label after it.
    lines = [(number, line.strip()) for number, line in enumerate(text.split("\n"), start=1) if line.strip()]
    if len(lines) > MAX_CLASSES:
        raise SourceError(f"{path} names {len(lines):,} classes, more than the {MAX_CLASSES:,} shardprep takes")
    for number, name in lines:
        names.check(name, "class", f"{path} line {number}", "fix that line")
    return [name for _, name in lines] or None


NO_LABELS_FILE_DETAIL = ("not in a class folder, and no --labels-file was given: images outside class folders need one "
                         "(a CSV of filename,label)")


def join(files, rows, labels_split: str, labels_file_given: bool = True):
    """Joins flat image files ``(split, key, path)`` and rows ``(filename, label)`` by exact file name: yields
    ``("input", split, key, label, path)`` or ``("reject", Reject)``; case-only differences are ``case_mismatch``."""
    by_name: dict[str, list[tuple[str, str]]] = {}
    for filename, label in rows:
        by_name.setdefault(file_name(filename), []).append((filename, label))
    file_names = {file_name(path) for _, _, path in files}
    for split, key, path in sorted(files):
        name = file_name(path)
        found = sorted({label for _, label in by_name.get(name, ())})
        if len(found) == 1:
            yield "input", split, key, found[0], path
        elif found:
            yield "reject", Reject(split, key, "conflicting_labels", f"labels file gives {', '.join(found)}")
        elif rows:
            others = ", ".join(sorted({filename for filename, _ in rows}))
            yield "reject", Reject(split, key, accounting.CASE_MISMATCH, f"the labels file names {others}, which "
                                   "differs only in case; names must match exactly")
        else:
            yield "reject", Reject(split, key, "no_label",
                                   f"{name} is not in the labels file" if labels_file_given else NO_LABELS_FILE_DETAIL)
    for filename, label in sorted(rows):
        if file_name(filename) in file_names:
            continue
        key = f"labels-file:{filename}"
        if files:
            yield "reject", Reject(labels_split, key, accounting.CASE_MISMATCH,
                                   f"labels file row {filename},{label}: the source folder has "
                                   f"{', '.join(sorted(file_names))}, which differs only in case; names must match "
                                   "exactly")
        else:
            yield "reject", Reject(labels_split, key, "missing_file",
                                   f"labels file row {filename},{label} names no image in the source folder")


IMAGENET_VALIDATION_NAME = re.compile(r"^ILSVRC2012_val_(\d{8})\.JPEG$")


def imagenet_validation_labels() -> dict[str, str]:
    """{file name: WordNet ID} of ImageNet's 50,000 validation images, from TFDS's file."""
    try:
        spec = importlib.util.find_spec("tensorflow_datasets")
    except (ImportError, ValueError):
        spec = None
    tfds_files = [os.path.join(folder, "datasets", "imagenet2012", "validation_labels.txt")
                  for folder in ((spec.submodule_search_locations or []) if spec else [])]
    path = next((found for found in tfds_files if os.path.isfile(found)), None)
    if path is None:
        raise SourceError(
            "ImageNet validation images (ILSVRC2012_val_*.JPEG) need their labels: install tensorflow-datasets "
            "(it ships them) or give --labels-file (a CSV of filename,label, or Kaggle's LOC_val_solution.csv)")
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    bad = next((number for number, wnid in enumerate(lines, start=1) if not wordnet_names.WORDNET_ID.match(wnid)), None)
    if bad is not None:
        raise SourceError(f"{path} line {bad} is not a WordNet ID (n01440764): not ImageNet's validation labels")
    return {f"ILSVRC2012_val_{index:08d}.JPEG": wnid for index, wnid in enumerate(lines, start=1)}
