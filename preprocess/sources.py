"""The pure parts of reading a SOURCE (no Beam here): split names, source keys, file names, the labels CSV, and
``InputBatch``. Which kinds of SOURCE there are, and how each is parsed, planned and listed, is
``shardprep.pipelines.source_registry``.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import re

from shardprep.preprocess.elements import Input

# Folder names taken as splits when every sub-folder of SOURCE has one of them.
SPLIT_NAMES = ("train", "training", "val", "valid", "validation", "test", "testing", "dev", "eval", "holdout")
# TFDS file naming: <dataset>-<split>.tfrecord-00000-of-00016 (TFDS writes shard numbers as %05d: 5 digits or more).
# The one rule for the split in a TFRecord file name: the preprocess job's planning and validate both use it.
_TFDS_FILE_SPLIT = re.compile(r"-([A-Za-z0-9_]+)\.tfrecord(?:-\d{5,}-of-\d{5,})?$")


class SourceError(ValueError):
    """The SOURCE argument or its options cannot be used; the message says why and what to do. Raised while
    planning, before anything is written; the CLI exits with ``exit_code`` (2, as for a command line click refuses,
    where a run that failed exits 1)."""

    exit_code = 2


def split_from_tfrecord_name(filename: str) -> str | None:
    """The split in a TFDS-style file name or path (``imagenette-train.tfrecord-00000-of-00016`` gives ``train``),
    or None for a file not named that way."""
    match = _TFDS_FILE_SPLIT.search(filename.rsplit("/", 1)[-1])
    return match.group(1) if match else None


def source_key(root: str, path: str) -> str:
    """A file's source key: its path relative to SOURCE."""
    return path[len(root):].lstrip("/") if path.startswith(root) else path


def is_utf8(text: str) -> bool:
    """False for a name that the OS gave with undecodable bytes (Python's surrogate escapes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_key(name: str) -> str:
    """``name`` with the bytes that are not UTF-8 shown as backslash-x escapes (``b\\xff.jpg``)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def is_hidden(name: str) -> bool:
    """Dot-files (``.DS_Store``, editor backups) are not dataset inputs."""
    return name.startswith(".")


@dataclasses.dataclass(frozen=True)
class LabelRow:
    line: int
    filename: str
    label: str


FILENAME_HEADERS = ("filename", "file", "file_name", "image", "image_name", "path", "name")
LABEL_HEADERS = ("label", "class", "class_name", "category", "wnid")
_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
         (b"\xfe\xff", "UTF-16"))


def decode_labels_csv(data: bytes, path: str) -> str:
    """The text of a labels file: UTF-8, its byte order mark (if any) dropped. Anything else is a SourceError naming
    the line and the problem, so that planning and the pipeline read the same rows."""
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            raise SourceError(f"labels file {path} is {encoding} (it starts with a {encoding} byte order mark): "
                              "save it as UTF-8")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    nul = data.find(b"\0")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise SourceError(f"labels file {path} line {line} has a NUL byte: it is not a text CSV (binary, or UTF-16 "
                          "without a byte order mark); save it as UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SourceError(f"labels file {path} line {line} is not valid UTF-8 (byte 0x{data[e.start]:02x} at column "
                          f"{column}; Latin-1 or Windows-1252?): save it as UTF-8") from None


def is_known_header(filename: str, label: str) -> bool:
    return filename.lower() in FILENAME_HEADERS and label.lower() in LABEL_HEADERS


def has_file_extension(filename: str) -> bool:
    name = labels_key(filename)
    return "." in name.strip(".")


def parse_labels_csv(text: str, path: str = "labels file") -> list[LabelRow]:
    """Parses ``filename,label`` rows; a first row of known header names (FILENAME_HEADERS, LABEL_HEADERS) is
    skipped. Kaggle's ``ImageId,PredictionString`` files (``LOC_val_solution.csv``) are read as they are
    (``kaggle_row``). Raises SourceError on bad rows."""
    rows: list[LabelRow] = []
    reader = csv.reader(io.StringIO(text))
    kaggle = False
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error as e:
            raise SourceError(f"{path} line {reader.line_num}: not a CSV row ({e})") from None
        line_number = reader.line_num
        if not fields or all(not f.strip() for f in fields):
            continue
        if not rows and not kaggle and is_kaggle_header(fields):
            kaggle = True
            continue
        if kaggle:
            rows.append(kaggle_row(fields, line_number, path))
            continue
        if len(fields) < 2 or not fields[0].strip() or not fields[1].strip():
            raise SourceError(f"{path} line {line_number}: expected 'filename,label', got {','.join(fields)!r}")
        filename, label = fields[0].strip(), fields[1].strip()
        if not rows and is_known_header(filename, label):
            continue
        rows.append(LabelRow(line_number, filename, label))
    return rows


KAGGLE_HEADER = ("imageid", "predictionstring")
KAGGLE_IMAGE_SUFFIX = ".JPEG"  # Kaggle's ImageNet files are ImageId.JPEG


def is_kaggle_header(fields: list[str]) -> bool:
    return tuple(f.strip().lower() for f in fields) == KAGGLE_HEADER


def kaggle_row(fields: list[str], line: int, path: str) -> LabelRow:
    """A row of Kaggle's ``LOC_val_solution.csv``: ``ImageId,PredictionString``, where PredictionString is
    ``wnid x_min y_min x_max y_max`` per box and the class is its first word; the file is ``ImageId.JPEG`` (an
    ImageId with an extension of its own is the file name as it is)."""
    words = fields[1].split() if len(fields) == 2 else []
    if len(fields) != 2 or not fields[0].strip() or not words:
        raise SourceError(f"{path} line {line}: expected 'ImageId,PredictionString' with the class as the first "
                          f"word of PredictionString, got {','.join(fields)!r}")
    image_id = fields[0].strip()
    return LabelRow(line, image_id if has_file_extension(image_id) else image_id + KAGGLE_IMAGE_SUFFIX, words[0])


def unknown_header_error(path: str, row: LabelRow) -> SourceError:
    return SourceError(
        f"{path} line {row.line} ({row.filename},{row.label}) looks like a header shardprep does not understand (no "
        "file of that name, no file extension): use the header 'filename,label' (first column "
        f"{'/'.join(FILENAME_HEADERS)}; second {'/'.join(LABEL_HEADERS)}) or none")


def labels_key(filename: str) -> str:
    """How a labels-file row and an image file are matched: by file name, the part after the last '/'."""
    return filename.replace("\\", "/").rsplit("/", 1)[-1]


class InputBatch:
    """A few listed ``Input``s packed for the trip to the decoder; iterating gives them back as ``Input``s.

    Pickles as a handful of strings: splits, keys and paths each as their common prefix (the batch's folder,
    mostly) and the joined rest. The runner's shuffle then holds a few objects and ~20 bytes per input, not a tuple
    of full paths (on Beam's local runner it holds every batch of the dataset at once, in the launcher).
    """

    __slots__ = ("_state",)
    _SEPARATOR = "\0"  # cannot occur in a path, a split or class name, or a TFRecord key

    def __init__(self, items=()):
        items = list(items)
        for split, key, _, path, _ in items:
            if any(self._SEPARATOR in text for text in (split, key, path or "")):
                raise ValueError(f"input {key!r} has a NUL character in its split, key or path")
        self._state = (
            len(items),
            self._pack([item[0] for item in items]),
            self._pack([item[1] for item in items]),
            tuple(item[2] for item in items),
            None if all(item[3] is None for item in items) else self._pack([item[3] or "" for item in items]),
            None if all(item[4] is None for item in items) else tuple(item[4] for item in items))

    @classmethod
    def _pack(cls, texts: list[str]) -> tuple[str, str]:
        prefix = os.path.commonprefix(texts) if texts else ""
        return prefix, cls._SEPARATOR.join(text[len(prefix):] for text in texts)

    @classmethod
    def _unpack(cls, packed: tuple[str, str], count: int) -> list[str]:
        prefix, rest = packed
        return [prefix + text for text in rest.split(cls._SEPARATOR)] if count else []

    def __len__(self) -> int:
        return self._state[0]

    def __iter__(self):
        count, splits, keys, labels, paths, data = self._state
        path_list = [p or None for p in self._unpack(paths, count)] if paths is not None else [None] * count
        data_list = data if data is not None else [None] * count
        return iter(list(map(Input._make, zip(self._unpack(splits, count), self._unpack(keys, count), labels,
                                              path_list, data_list))))

    def __getstate__(self):
        return self._state

    def __setstate__(self, state) -> None:
        self._state = state

    def __eq__(self, other) -> bool:
        return isinstance(other, InputBatch) and self._state == other._state

    def __repr__(self) -> str:
        return f"InputBatch({len(self)} inputs)"
