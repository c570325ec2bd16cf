"""The files of a prepared dataset: their names, the shard-file template, and ``manifest.json`` read as untrusted
input (bounded, finite, of this ``format_version``; errors name the file). The manifest is written last: its presence
marks a complete dataset."""

from __future__ import annotations

import importlib.metadata
import json
import os
import posixpath
import re
from collections.abc import Callable
from typing import NamedTuple

from shardprep.preprocess.checks import install_extras, owned_folder, untrusted

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
REJECTS_NAME = "rejects.jsonl"
LOCK_NAME = owned_folder.LOCK_NAME  # the lock a run holds on OUTPUT while it writes there
SHARD_SUFFIX = ".tfrecord"
TOOL = "shardprep"
# Bounds on a manifest read back (an ImageNet manifest is ~0.3 MB, 6 levels deep): anything past them is not ours.
MANIFEST_MAX_BYTES = 64 << 20
MANIFEST_MAX_DEPTH = 32


def tool_version() -> str:
    """The installed shardprep's version: the manifest's and reports' ``tool_version``."""
    return importlib.metadata.version(TOOL)


class ManifestError(ValueError):
    """The manifest is missing, unreadable or of an unknown version; ``kind`` says what a path without one is."""
    kind: str | None = None


def join(base: str, *parts: str) -> str:
    """Joins path parts with '/', for local paths and URLs such as ``gs://bucket/dir`` alike."""
    return posixpath.join(base.rstrip("/") if base not in ("/",) else base, *parts)


class ShardName(NamedTuple):
    split: str
    shard_index: int
    num_shards: int


class ShardFileTemplate:
    """The one spelling of a shard's file, TFDS's ``<split>/<split>-00000-of-000NN.tfrecord``, formatted and parsed
    back (None for anything else). Numbers have at least ``digits`` digits and no other leading zeros."""
    def __init__(self, suffix: str = ".tfrecord", digits: int = 5):
        self.suffix, self.digits = suffix, digits
        number = rf"\d{{{digits},}}"
        pattern = rf"(?P<split>.+)-(?P<index>{number})-of-(?P<num_shards>{number}){re.escape(suffix)}"
        self._name = re.compile(pattern)
        self._name_any_case = re.compile(pattern, re.IGNORECASE)

    def name(self, split: str, index: int, num_shards: int) -> str:
        return f"{split}-{index:0{self.digits}d}-of-{num_shards:0{self.digits}d}{self.suffix}"

    def path(self, split: str, index: int, num_shards: int) -> str:
        return f"{split}/{self.name(split, index, num_shards)}"

    def parse_name(self, name: str, *, any_case: bool = False) -> ShardName | None:
        """What the file name says, if :meth:`name` writes it (``any_case``: as a case-insensitive file system
        matches); else None."""
        match = (self._name_any_case if any_case else self._name).fullmatch(name)
        if match is None:
            return None
        index, num_shards = match["index"], match["num_shards"]
        if not all(text == f"{int(text):0{self.digits}d}" for text in (index, num_shards)):
            return None  # zeros beyond the padding: not a name this template writes
        return ShardName(match["split"], int(index), int(num_shards))

    def parse_path(self, relative: str) -> ShardName | None:
        """What ``relative`` says, if it is a shard's name in its own split's folder."""
        folder, _, name = relative.partition("/")
        parsed = self.parse_name(name) if folder and "/" not in name else None
        return parsed if parsed is not None and parsed.split == folder else None


SHARD_FILES = ShardFileTemplate(SHARD_SUFFIX)


def document_text(document: dict) -> str:
    """The text of ``manifest.json``: two-space indents, keys in order."""
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def parse_document(text: str | bytes, source: str = MANIFEST_NAME) -> dict:
    """The manifest document in ``text`` as untrusted input, of this ``format_version``; else a ManifestError
    beginning ``"<source>: "``. Shape not checked."""
    try:
        document = untrusted.json_loads(text, source=source, max_bytes=MANIFEST_MAX_BYTES,
                                        max_depth=MANIFEST_MAX_DEPTH)
    except untrusted.UntrustedJSONError as e:
        raise ManifestError(str(e)) from e
    if not isinstance(document, dict):
        kind = {list: "a list", str: "a string", type(None): "null", bool: "a boolean"}.get(type(document), "a number")
        raise ManifestError(f"{source}: must be a JSON object (the manifest shardprep preprocess writes), is {kind}")
    if document.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{source}: unsupported manifest format_version {document.get('format_version')!r} "
                            f"(this shardprep reads version {FORMAT_VERSION})")
    return document


# What a DATA path without a manifest is (dataset_path_kind).
PATH_MISSING, PATH_FILE, PATH_EMPTY, PATH_IMAGES, PATH_INCOMPLETE, PATH_OTHER, PATH_INSIDE = (
    "missing", "file", "empty", "image_folder", "incomplete", "other", "inside_dataset")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ppm",
                  ".pgm", ".pbm", ".pnm")
_FILES_LOOKED_AT = 5000  # a huge image folder is told apart from leftovers without listing all of it


def _looks_like_output(relative: str) -> bool:
    """A file a shardprep run writes: rejects, the lock, spill files, shards and their ``.tmp-<hex>-`` copies."""
    name = relative.rsplit("/", 1)[-1]
    if name.startswith(".tmp-"):
        name = name[len(".tmp-"):].partition("-")[2]
    return (relative in (REJECTS_NAME, LOCK_NAME) or relative.startswith(".tmp/")
            or SHARD_FILES.parse_name(name) is not None)


def _local_files(data_dir: str):
    for folder, sub_dirs, files in os.walk(data_dir):
        sub_dirs.sort()
        relative = os.path.relpath(folder, data_dir)
        for name in sorted(files):
            yield name if relative == "." else f"{relative.replace(os.sep, '/')}/{name}"


def _remote_files(data_dir: str):
    from apache_beam.io.filesystems import FileSystems

    prefix = data_dir.rstrip("/") + "/"
    try:
        matched = FileSystems.match([prefix + "**"], limits=[_FILES_LOOKED_AT])[0].metadata_list
    except Exception:  # noqa: BLE001 - Beam raises BeamIOError for a pattern without matches
        return
    yield from (meta.path.removeprefix(prefix) for meta in matched)


def dataset_path_kind(data_dir: str) -> tuple[str, str | None]:
    """What ``data_dir``, which has no manifest, is: (a PATH_ kind, an example file)."""
    if "://" in data_dir:
        files = _remote_files(data_dir)
    else:
        if not os.path.exists(data_dir):
            return PATH_MISSING, None
        if not os.path.isdir(data_dir):
            return PATH_FILE, None
        parent = os.path.dirname(os.path.abspath(data_dir))
        if os.path.isfile(os.path.join(parent, MANIFEST_NAME)):
            return PATH_INSIDE, parent
        if os.path.isdir(os.path.join(data_dir, ".tmp")):
            return PATH_INCOMPLETE, ".tmp/"
        files = _local_files(data_dir)
    first_image = first_other = None
    for count, relative in enumerate(files):
        if _looks_like_output(relative):
            return PATH_INCOMPLETE, relative
        name = relative.rsplit("/", 1)[-1]
        if name.lower().endswith(IMAGE_SUFFIXES) and not name.startswith("."):
            first_image = first_image or relative
        else:
            first_other = first_other or relative
        if count >= _FILES_LOOKED_AT:
            break
    if first_image:
        return PATH_IMAGES, first_image
    if first_other:
        return PATH_OTHER, first_other
    return (PATH_MISSING, None) if "://" in data_dir else (PATH_EMPTY, None)


def missing_manifest_error(data_dir: str) -> ManifestError:
    """The error every reader raises for ``data_dir`` without a manifest, saying what the path is instead."""
    kind, example = dataset_path_kind(data_dir)
    give = "give the folder shardprep preprocess wrote (it holds manifest.json)"
    message = {
        PATH_MISSING: f"{data_dir} does not exist: {give}",
        PATH_FILE: f"{data_dir} is {untrusted.file_kind(data_dir)}, not a prepared dataset: {give}",
        PATH_EMPTY: (f"{data_dir} is an empty folder, not a prepared dataset: run shardprep preprocess SOURCE "
                     f"{data_dir} first, or {give}"),
        PATH_IMAGES: (f"{data_dir} is an image folder (e.g. {example}), not a prepared dataset: run shardprep "
                      f"preprocess {data_dir} OUTPUT first, then give OUTPUT"),
        PATH_INSIDE: f"{data_dir} is a folder inside the prepared dataset {example}: give {example}",
        PATH_OTHER: (f"{data_dir} has no {MANIFEST_NAME} and no files a shardprep run writes (e.g. {example}): it "
                     f"is not a prepared dataset; {give}"),
    }.get(kind, f"{join(data_dir, MANIFEST_NAME)} does not exist: {data_dir} is not a complete shardprep dataset "
                "(the manifest is written last; a run that stopped early leaves none — rerun preprocess with "
                "--overwrite)")
    error = ManifestError(message)
    error.kind = kind
    return error


def _read_with_beam(path: str, at_most: int) -> bytes | None:
    """At most ``at_most`` bytes of the file at the URL ``path`` through Beam's FileSystems; None if absent."""
    try:  # without the gcp extra Beam would say only that it has no file system for gs://
        install_extras.check_arguments([path])
    except install_extras.MissingExtraError as e:
        raise ManifestError(str(e)) from None  # names the file and what to install
    from apache_beam.io.filesystems import FileSystems

    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as f:
        return f.read(at_most)


def read_file(path: str, at_most: int, read_url: Callable[[str, int], bytes | None] | None = None) -> bytes | None:
    """A dataset's file, local (a regular file) or a URL (``read_url(path, at_most)``, by default Beam's
    FileSystems); None if absent. An OSError when it cannot be read, a NotRegularFileError above ``at_most`` bytes."""
    if "://" in path and not path.startswith("file://"):
        data = (read_url or _read_with_beam)(path, at_most + 1)
        if data is not None and len(data) > at_most:
            raise untrusted.NotRegularFileError(path, f"is more than the {at_most:,} bytes allowed")
        return data
    try:
        return untrusted.read_regular_file(path.removeprefix("file://"), at_most)
    except FileNotFoundError:
        return None


def manifest_path(data_dir: str) -> str:
    return join(data_dir, MANIFEST_NAME)


def read_document(data_dir: str, read_url: Callable[[str, int], bytes | None] | None = None) -> dict:
    """The manifest document of ``data_dir`` (local, ``file://`` or a URL, read by :func:`read_file`); every error a
    ManifestError naming the file."""
    data_dir = os.fspath(data_dir)
    where = data_dir if "://" in data_dir and not data_dir.startswith("file://") else data_dir.removeprefix("file://")
    path = manifest_path(where)
    try:
        data = read_file(path, MANIFEST_MAX_BYTES, read_url)
    except untrusted.NotRegularFileError as e:
        raise ManifestError(f"{e}: a manifest is a small regular file") from e
    except OSError as e:  # BeamIOError is one
        raise ManifestError(f"cannot read {path}: {e}") from e
    if data is None:
        raise missing_manifest_error(where)
    return parse_document(data, path)
