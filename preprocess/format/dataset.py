"""A prepared dataset as one typed value, :class:`Manifest`, loaded and checked once by :func:`load_manifest` and
passed to every reader. ``Manifest.to_json`` gives back the written document key for key, in order."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from shardprep.preprocess.format import encodings
from shardprep.preprocess.image import resize
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.manifest import SHARD_FILES, ManifestError, manifest_path, read_document  # noqa: F401
from shardprep.preprocess.format.manifest_schema import shape_problems
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
    file: str
    num_examples: int
    num_bytes: int
    sha256: str | None = None

    @classmethod
    def from_json(cls, entry: dict) -> "ShardEntry":
        return cls(entry["file"], entry["num_examples"], entry["num_bytes"], entry.get("sha256"))

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split's accounting, class counts, shards and (raw centre crops with records) its fixed layout."""
    num_inputs: int | None
    num_examples: int
    num_rejected: int | None
    rejected_by_reason: dict[str, int]
    class_counts: dict[str, int]
    num_shards: int
    shards: tuple[ShardEntry, ...]
    record_layout: FixedLayout | None = None

    @classmethod
    def from_json(cls, info: dict, record_layout: FixedLayout | None = None) -> "SplitInfo":
        shards = tuple(ShardEntry.from_json(entry) for entry in info["shards"])
        return cls(info.get("num_inputs"), info["num_examples"], info.get("num_rejected"),
                   dict(info.get("rejected_by_reason") or {}), dict(info["class_counts"]),
                   info.get("num_shards", len(shards)), shards, record_layout)

    def to_json(self) -> dict:
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document.update(rejected_by_reason=dict(self.rejected_by_reason), class_counts=dict(self.class_counts),
                        shards=[shard.to_json() for shard in self.shards])
        if self.record_layout is None:
            del document["record_layout"]
        else:
            document["record_layout"] = self.record_layout.to_json()
        return document

    @property
    def num_bytes(self) -> int:
        return sum(shard.num_bytes for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """``OUTPUT/manifest.json`` as a typed value; its fields are ``manifest_schema.MANIFEST_KEYS``, in order."""
    format_version: int
    tool: str | None
    tool_version: str | None
    created: str | None
    source: str | None
    source_kind: str | None
    options: dict | None
    classes: tuple[str, ...]
    num_classes: int
    encoding: str
    jpeg_quality: int | None
    shorter_side: int
    crop: str
    resize_method: str | None  # None (not written): made before the key existed, by pillow-bicubic
    image_height: int | None
    image_width: int | None
    channels: int | None
    seed: int | None
    splits: dict[str, SplitInfo]
    num_inputs: int | None
    num_examples: int | None
    num_rejected: int | None
    rejects_file: str | None
    stats_split: str | None
    mean_rgb: tuple[float, float, float] | None
    std_rgb: tuple[float, float, float] | None
    not_used: tuple[dict, ...] | None = None  # written only when there was something
    median_input_size: dict | None = None  # written when known
    # Not in the document: {split: why its record_layout is not used} (``from_json``'s ``lenient_layouts``).
    layout_problems: dict[str, str] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_json(cls, document, *, layouts_required: bool = True, lenient_layouts: bool = False,
                  source: str | None = None) -> "Manifest":
        """The typed manifest of a document; ManifestShapeError listing its shape problems, or UnfitLayoutError
        (``lenient_layouts``: such a layout left out, said in ``layout_problems``). Messages begin with ``source``."""
        where = f"{source}: " if source else ""
        problems = shape_problems(document, layouts_required=layouts_required)
        if problems:
            raise ManifestShapeError(f"{where}manifest is malformed: " + "; ".join(problems), problems)
        layouts, layout_problems = _record_layouts(document)
        for split, why in layout_problems.items():
            if split in layouts and not lenient_layouts:
                raise UnfitLayoutError(f"{where}split {split!r}: {why}", split)
        layouts = {split: layout for split, layout in layouts.items() if split not in layout_problems}
        splits = {name: SplitInfo.from_json(info, layouts.get(name)) for name, info in document["splits"].items()}
        fields = {field.name: document.get(field.name) for field in _document_fields(cls)}
        classes = document["classes"]
        fields.update(classes=tuple(classes), num_classes=document.get("num_classes", len(classes)), splits=splits,
                      mean_rgb=_triple(document.get("mean_rgb")), std_rgb=_triple(document.get("std_rgb")),
                      not_used=tuple(document["not_used"]) if isinstance(document.get("not_used"), list) else None)
        return cls(**fields, layout_problems=layout_problems)

    def to_json(self) -> dict:
        document = {field.name: getattr(self, field.name) for field in _document_fields(self)}
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


def _document_fields(manifest) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(manifest) if field.name != "layout_problems"]


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
