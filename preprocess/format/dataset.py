"""A prepared dataset as one typed value, :class:`Manifest`, whose fields declare the manifest's keys (docs/manifest.md
is generated from them); loaded and checked once by :func:`load_manifest` and passed to every reader.
``Manifest.to_json`` gives back the written document key for key, in order."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

from shardprep.preprocess.checks import names
from shardprep.preprocess.format import encodings
from shardprep.preprocess.format import manifest_schema as schema
from shardprep.preprocess.format.config import CROPS
from shardprep.preprocess.format.manifest_schema import MIN_FRAMED_RECORD_BYTES, check_object, describe, is_int, key
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.manifest import SHARD_FILES, ManifestError, manifest_path, read_document  # noqa: F401
from shardprep.preprocess.format.record_format import RecordFormatError

# Each split role and the split names (any case) that play it, the role's own name first: train's split_roles
# resolves a role with them, validate calls a split named like ``train`` training data and every other held out.
SPLIT_ROLES = {"train": ("train", "training"), "validation": ("validation", "valid", "val"),
               "test": ("test", "testing")}


class ManifestShapeError(ManifestError):
    """The document's keys or values are not the manifest's: ``problems`` lists each."""
    def __init__(self, message: str, problems: list[str]):
        super().__init__(message)
        self.problems = problems


class UnfitLayoutError(ManifestError):
    """A split's ``record_layout`` cannot be the layout of its records (``split`` names it)."""
    def __init__(self, message: str, split: str):
        super().__init__(message)
        self.split = split


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One shard: its path relative to the dataset folder, records, bytes and sha256 (None if not recorded)."""
    file: str = key("string", True, "the shard's path relative to the dataset folder", schema.shard_file)
    num_examples: int = key("integer", True, "records in the shard", schema.counted())
    num_bytes: int = key("integer", True, "the shard file's bytes", schema.counted())
    sha256: str | None = key("string or null", False, "SHA-256 of the shard file (64 lowercase hex digits)",
                             schema.SHA256, default=None)

    @classmethod
    def from_json(cls, entry: dict) -> "ShardEntry":
        return cls(entry["file"], entry["num_examples"], entry["num_bytes"], entry.get("sha256"))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split's accounting, class counts, shards and (raw centre crops with records) its fixed layout."""
    num_inputs: int | None = key("integer", False, "inputs listed", schema.counted())
    num_examples: int = key("integer", True, "records written", schema.counted())
    num_rejected: int | None = key("integer", False, "inputs rejected (rejects.jsonl)", schema.counted())
    rejected_by_reason: dict[str, int] = key("object", False, "{reason: count} of the rejects",
                                             schema.expect(lambda v: isinstance(v, dict), "an object"))
    class_counts: dict[str, int] = key("object", True, "{class: records}, in label order", schema.object_of_counts)
    num_shards: int = key("integer", False, "shards of the split", schema.counted())
    shards: tuple[ShardEntry, ...] = key("list", True, "one entry per shard (table below), in order")
    record_layout: FixedLayout | None = key(
        "object", False, "the fixed layout of raw centre crops' records (required for them)", default=None)

    @classmethod
    def from_json(cls, info: dict, record_layout: FixedLayout | None = None) -> "SplitInfo":
        shards = tuple(ShardEntry.from_json(entry) for entry in info["shards"])
        return cls(info.get("num_inputs"), info["num_examples"], info.get("num_rejected"),
                   dict(info.get("rejected_by_reason") or {}), dict(info["class_counts"]),
                   info.get("num_shards", len(shards)), shards, record_layout)

    def to_json(self) -> dict:
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document.update(rejected_by_reason=dict(self.rejected_by_reason), class_counts=dict(self.class_counts),
                        shards=[shard.to_json() for shard in self.shards],
                        record_layout=None if self.record_layout is None else self.record_layout.to_json())
        return {key: value for key, value in document.items() if key != "record_layout" or value is not None}

    @property
    def num_bytes(self) -> int:
        return sum(shard.num_bytes for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """``OUTPUT/manifest.json`` as a typed value: each field but ``layout_problems`` is a key, in written order."""
    format_version: int = key("integer", True, "1: the manifest format this shardprep reads",
                              schema.expect(is_int, "an integer"))
    tool: str | None = key("string", False, "shardprep")
    tool_version: str | None = key("string", False, "the version of shardprep that wrote it")
    created: str | None = key("string", False, "when (ISO 8601; SOURCE_DATE_EPOCH if set)")
    source: str | None = key("string", False, "SOURCE as given")
    source_kind: str | None = key("string", False, "what SOURCE is (a folder, an archive, tfrecord:, tfds:, parquet:)")
    options: dict | None = key("object", False, "every option of the run, and the runner",
                               schema.expect(lambda v: v is None or isinstance(v, dict), "an object"))
    classes: tuple[str, ...] = key("list of strings", True, "class names in label order", schema.class_names)
    num_classes: int = key("integer", False, "the number of classes", schema.counted())
    encoding: str = key("string", True, "how images are stored: " + ", ".join(encodings.NAMES),
                        schema.one_of(lambda: encodings.NAMES))
    jpeg_quality: int | None = key("integer or null", False, "--jpeg-quality where the encoding uses it",
                                   schema.expect(lambda v: v is None or (is_int(v) and 1 <= v <= 100),
                                                 "within 1-100 or null"))
    shorter_side: int = key("integer", True, "the stored images' shorter side", schema.counted(1, schema.MAX_SIDE))
    crop: str = key("string", True, "center (S x S images) or none (aspect ratio kept)", schema.one_of(lambda: CROPS))
    resize_method: str | None = key("string", False, "the resize method (absent: pillow-bicubic, before the key "
                                    "existed)", schema.one_of(lambda: resize.RESIZE_METHODS, nullable=True))
    image_height: int | None = key("integer or null", False, "the stored height (required for centre crops; null "
                                   "for none)", schema.counted(1, schema.MAX_SIDE, nullable=True))
    image_width: int | None = key("integer or null", False, "the stored width (required for centre crops; null for "
                                  "none)", schema.counted(1, schema.MAX_SIDE, nullable=True))
    channels: int | None = key("integer or null", False, "3 (RGB)",
                               schema.expect(lambda v: v is None or v == 3, "3 (RGB) or null"))
    seed: int | None = key("integer or null", False, "--seed, of the record order",
                           schema.expect(lambda v: v is None or is_int(v), "an integer or null"))
    splits: dict[str, SplitInfo] = key("object", True, "{split: its entry (table below)}")
    num_inputs: int | None = key("integer", False, "inputs listed, all splits", schema.counted())
    num_examples: int | None = key("integer", False, "records written, all splits", schema.counted())
    num_rejected: int | None = key("integer", False, "inputs rejected, all splits", schema.counted())
    rejects_file: str | None = key("string", False, "rejects.jsonl: one JSON line per rejected input")
    stats_split: str | None = key("string or null", False, "the split mean_rgb and std_rgb were computed over",
                                  schema.expect(lambda v: v is None or isinstance(v, str), "a split name or null"))
    mean_rgb: tuple[float, float, float] | None = key("list or null", False, "per-channel mean, 0-255",
                                                      schema.channel_values(255.0))
    std_rgb: tuple[float, float, float] | None = key("list or null", False, "per-channel standard deviation, 0-255 "
                                                     "scale", schema.channel_values(127.5))
    not_used: tuple[dict, ...] | None = key("list", False, "{path, reason} of what lay beside the splits or classes "
                                            "and was not read (written when there was any)", default=None)
    median_input_size: dict | None = key("object or null", False, "{width, height} of the median input in a sample "
                                         "of their headers (absent before the key existed)",
                                         schema.median_input_size, default=None)
    # Not in the document: {split: why its record_layout is not used} (``from_json``'s ``lenient_layouts``).
    layout_problems: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def class_set(self) -> frozenset[str]:  # for a lookup per record
        return frozenset(self.classes)

    @classmethod
    def from_json(cls, document, *, layouts_required: bool = True, lenient_layouts: bool = False,
                  source: str | None = None) -> "Manifest":
        """The typed manifest of a document; ManifestShapeError listing its shape problems, or UnfitLayoutError
        (``lenient_layouts``: such a layout left out, said in ``layout_problems``). Messages begin with ``source``."""
        where = f"{source}: " if source else ""
        if problems := shape_problems(document, layouts_required=layouts_required):
            raise ManifestShapeError(f"{where}manifest is malformed: " + "; ".join(problems), problems)
        layouts, layout_problems = _record_layouts(document)
        for split, why in layout_problems.items():
            if split in layouts and not lenient_layouts:
                raise UnfitLayoutError(f"{where}split {split!r}: {why}", split)
        splits = {name: SplitInfo.from_json(info, layouts.get(name)) for name, info in document["splits"].items()}
        fields = {key.name: document.get(key.name) for key in MANIFEST_KEYS}
        classes = document["classes"]
        fields.update(classes=tuple(classes), num_classes=document.get("num_classes", len(classes)), splits=splits,
                      mean_rgb=_triple(document.get("mean_rgb")), std_rgb=_triple(document.get("std_rgb")),
                      not_used=tuple(document["not_used"]) if isinstance(document.get("not_used"), list) else None)
        return cls(**fields, layout_problems=layout_problems)

    def to_json(self) -> dict:
        document = {key.name: getattr(self, key.name) for key in MANIFEST_KEYS}
        document.update(
            options=dict(self.options) if self.options is not None else None, classes=list(self.classes),
            splits={name: info.to_json() for name, info in self.splits.items()},
            mean_rgb=list(self.mean_rgb) if self.mean_rgb is not None else None,
            std_rgb=list(self.std_rgb) if self.std_rgb is not None else None,
            not_used=[dict(entry) for entry in self.not_used] if self.not_used else None)
        unwritten = {"not_used": not self.not_used, "resize_method": self.resize_method is None,
                     "median_input_size": self.median_input_size is None}
        return {key: value for key, value in document.items() if not unwritten.get(key)}

    @property
    def resize_method_used(self) -> str:
        return resize.METHOD_WITHOUT_KEY if self.resize_method is None else self.resize_method

    def split(self, name: str) -> SplitInfo:
        """The split ``name``; KeyError naming the dataset's splits if it has none of that name."""
        if name not in self.splits:
            raise KeyError(f"split {name!r} not in dataset (splits: {', '.join(self.splits)})")
        return self.splits[name]

    def shard_files(self, split: str) -> list[str]:
        return [shard.file for shard in self.split(split).shards]

    @property
    def stored_shape(self) -> tuple[int, int]:
        """(height, width) of every stored image; ``shorter_side`` square for ``crop: none``."""
        if self.crop == "none":
            return self.shorter_side, self.shorter_side
        return self.image_height, self.image_width

    @property
    def fixed_layout_splits(self) -> dict[str, FixedLayout]:
        return {name: info.record_layout for name, info in self.splits.items() if info.record_layout is not None}


def _triple(value):
    return tuple(value) if value is not None else None


def _record_layouts(document: dict) -> tuple[dict[str, FixedLayout | None], dict[str, str]]:
    """({split: its FixedLayout, or None where it fits none}, {split: why its ``record_layout`` is not used})."""
    layouts: dict[str, FixedLayout | None] = {}
    problems: dict[str, str] = {}
    fixed = encodings.has_fixed_layout(document["encoding"], document["crop"])
    for split, info in document["splits"].items():
        record_layout = info.get("record_layout")
        if not record_layout:
            continue
        if not fixed:
            problems[split] = (f"record_layout {record_layout} given for {document['encoding']} records with crop "
                               f"{document['crop']!r}: only raw centre crops have a fixed layout")
            continue
        try:
            layouts[split] = FixedLayout.from_json(record_layout, document["image_height"], document["image_width"])
        except RecordFormatError as e:
            layouts[split], problems[split] = None, str(e)
    return layouts, problems


SHARD_KEYS, SPLIT_KEYS, MANIFEST_KEYS = (schema.keys_of(cls) for cls in (ShardEntry, SplitInfo, Manifest))


def _split_problems(problems: list, path: str, info, fixed_layout: bool) -> None:
    if not check_object(problems, path, info, SPLIT_KEYS):
        return
    if isinstance(info.get("shards"), list):
        for index, shard in enumerate(info["shards"]):
            where = f"{path}.shards[{index}]"
            if check_object(problems, where, shard, SHARD_KEYS) and all(
                    is_int(shard.get(key)) and shard[key] >= 0 for key in ("num_examples", "num_bytes")) \
                    and shard["num_examples"] * MIN_FRAMED_RECORD_BYTES > shard["num_bytes"]:
                problems.append(f"{where}.num_examples: {shard['num_examples']:,} records cannot fit in "
                                f"{shard['num_bytes']:,} bytes (a record takes at least {MIN_FRAMED_RECORD_BYTES})")
    elif "shards" in info:
        problems.append(f"{path}.shards: must be a list, is {describe(info['shards'])}")
    layout = info.get("record_layout")
    fixed_layout = fixed_layout and info.get("num_examples") != 0  # an empty split has no records to lay out
    if layout is not None:
        check_object(problems, f"{path}.record_layout", layout, schema.LAYOUT_KEYS)
    elif fixed_layout and "record_layout" not in info:
        problems.append(f"{path}.record_layout: missing (required for raw centre crops: the train reader "
                        "reads records by it)")
    elif fixed_layout:
        problems.append(f"{path}.record_layout: must be an object, is null")


def shape_problems(manifest, *, layouts_required: bool = True) -> list[str]:
    """``"<path>: <what is wrong>"`` for the manifest's keys and value types; empty when readers can rely on them.
    ``layouts_required=False``: a raw centre-crop split may lack ``record_layout``."""
    if not isinstance(manifest, dict):
        return [f"manifest: must be a JSON object, is {describe(manifest)}"]
    problems: list[str] = []
    check_object(problems, "", manifest, MANIFEST_KEYS)
    problems = [problem[1:] for problem in problems]  # top-level paths without the leading "."
    classes = manifest.get("classes")
    if isinstance(classes, list) and is_int(manifest.get("num_classes")) and manifest["num_classes"] >= 0 \
            and manifest["num_classes"] != len(classes):
        problems.append(f"num_classes: is {manifest['num_classes']} but classes lists {len(classes)}")
    for key in ("image_height", "image_width") if manifest.get("crop") == "center" else ():
        if key not in manifest:
            problems.append(f"{key}: missing (required for centre crops)")
        elif manifest[key] is None:
            problems.append(f"{key}: must be an integer for centre crops, is null")
    height, width, side = (manifest.get(key) for key in ("image_height", "image_width", "shorter_side"))
    centre_crops = manifest.get("crop") == "center" and all(map(is_int, (height, width, side)))
    if centre_crops and min(height or 0, width or 0) != side:  # ints here: `or 0` is for mypy
        problems.append(f"shorter_side: is {side} but the centre crops are {height}x{width}")
    splits = manifest.get("splits", {})
    if not isinstance(splits, dict):
        problems.append(f"splits: must be an object {{split: {{...}}}}, is {describe(splits)}")
        return problems
    fixed_layout = layouts_required and encodings.has_fixed_layout(manifest.get("encoding"), manifest.get("crop"))
    for split, info in splits.items():
        if names.problem(split, "split"):
            problems.append(f"splits: the split name {names.describe(split)} {names.problem(split, 'split')}")
        _split_problems(problems, f"splits.{split}", info, fixed_layout)
    stats_split = manifest.get("stats_split")
    if isinstance(stats_split, str) and "splits" in manifest and stats_split not in splits:
        problems.append(f"stats_split: {stats_split!r} is not one of the splits ({', '.join(splits)})")
    return problems


def docs_table() -> str:
    """The tables of docs/manifest.md."""
    parts = []
    for title, keys in (("manifest.json", MANIFEST_KEYS), ("a split (`splits.<split>`)", SPLIT_KEYS),
                        ("a shard (`splits.<split>.shards[i]`)", SHARD_KEYS),
                        ("a record layout (`splits.<split>.record_layout`)", schema.LAYOUT_KEYS)):
        rows = [f"| `{key.name}` | {key.type} | {'yes' if key.required else 'no'} | {key.meaning} |" for key in keys]
        parts.append("\n".join([f"Keys of {title}:", "", "| key | type | required | meaning |", "|---|---|---|---|",
                                *rows]))
    return "\n\n".join(parts) + "\n"


def typed(manifest) -> Manifest:
    """``manifest`` as a Manifest: itself, or a document converted (layouts not required)."""
    return manifest if isinstance(manifest, Manifest) else Manifest.from_json(manifest, layouts_required=False)


def load_manifest(data_dir: str | os.PathLike, *, layouts_required: bool = False, lenient_layouts: bool = False,
                  read_url: Callable[[str, int], bytes | None] | None = None) -> Manifest:
    """The Manifest of the dataset in ``data_dir`` (local, ``file://`` or ``gs://``), read once as untrusted input; a
    ManifestError naming the file. ``lenient_layouts``: a layout that does not fit is left out."""
    data_dir = os.fspath(data_dir)
    return Manifest.from_json(read_document(data_dir, read_url), layouts_required=layouts_required,
                              lenient_layouts=lenient_layouts, source=manifest_path(data_dir))
