"""The manifest as typed values: :class:`Manifest`, its :class:`SplitInfo` per split and :class:`ShardEntry` per shard.

The writer (``shardprep.pipelines.manifest_writer``) builds a :class:`Manifest` and writes :meth:`Manifest.to_json`;
readers turn a loaded document into one with :meth:`Manifest.from_json`, which first requires
``manifest_schema.shape_problems`` to find nothing. ``to_json`` gives back every document the writer writes key for
key, in order, with the same values and types, so the manifest's bytes do not depend on this module. Keys a
hand-made manifest may leave out (all but the schema's required ones) are None here; ``to_json`` then writes null.
"""

from __future__ import annotations

import dataclasses

from shardprep.preprocess import encodings
from shardprep.preprocess.fixed_layout import FixedLayout
from shardprep.preprocess.manifest import ManifestError
from shardprep.preprocess.manifest_schema import shape_problems


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
        return {"file": self.file, "num_examples": self.num_examples, "num_bytes": self.num_bytes,
                "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    """One split's accounting, class counts, shards and, for raw centre crops with records, its fixed layout."""

    num_inputs: int | None
    num_examples: int
    num_rejected: int | None
    rejected_by_reason: dict[str, int]
    class_counts: dict[str, int]
    num_shards: int
    shards: tuple[ShardEntry, ...]
    record_layout: FixedLayout | None = None

    @classmethod
    def from_json(cls, info: dict, image_shape: tuple[int, int] | None) -> "SplitInfo":
        """``info`` a manifest's split entry; ``image_shape`` (height, width) of raw centre crops, else None (then
        a ``record_layout`` is not read: no reader uses one)."""
        shards = tuple(ShardEntry.from_json(entry) for entry in info["shards"])
        layout = info.get("record_layout")
        return cls(
            num_inputs=info.get("num_inputs"), num_examples=info["num_examples"],
            num_rejected=info.get("num_rejected"), rejected_by_reason=dict(info.get("rejected_by_reason") or {}),
            class_counts=dict(info["class_counts"]), num_shards=info.get("num_shards", len(shards)), shards=shards,
            record_layout=(FixedLayout.from_json(layout, *image_shape)
                           if layout is not None and image_shape is not None else None))

    def to_json(self) -> dict:
        document = {
            "num_inputs": self.num_inputs,
            "num_examples": self.num_examples,
            "num_rejected": self.num_rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "class_counts": dict(self.class_counts),
            "num_shards": self.num_shards,
            "shards": [shard.to_json() for shard in self.shards],
        }
        if self.record_layout is not None:
            document["record_layout"] = self.record_layout.to_json()
        return document

    @property
    def num_bytes(self) -> int:
        return sum(shard.num_bytes for shard in self.shards)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """``OUTPUT/manifest.json`` as a typed value; fields in the document's key order (see ``shardprep.preprocess.manifest``)."""

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
    # What lay beside the split or class folders and was not read ({path, reason} each); written only when there
    # was something, so a dataset without any keeps the manifest it always had.
    not_used: tuple[dict, ...] | None = None

    @classmethod
    def from_json(cls, document, *, layouts_required: bool = True) -> "Manifest":
        """The typed manifest of a loaded document; raises ManifestError listing its shape problems, or naming a
        split whose ``record_layout`` does not fit its images. ``layouts_required``: as ``shape_problems``'."""
        problems = shape_problems(document, layouts_required=layouts_required)
        if problems:
            raise ManifestError("manifest is malformed: " + "; ".join(problems))
        fixed_layout = encodings.has_fixed_layout(document["encoding"], document["crop"])
        image_shape = (document["image_height"], document["image_width"]) if fixed_layout else None
        splits = {}
        for name, info in document["splits"].items():
            try:
                splits[name] = SplitInfo.from_json(info, image_shape)
            except ValueError as e:  # RecordFormatError: a record_layout that fits no layout of these images
                raise ManifestError(f"split {name!r}: {e}") from e
        fields = {field.name: document.get(field.name) for field in dataclasses.fields(cls)}
        classes = document["classes"]
        fields.update(classes=tuple(classes), num_classes=document.get("num_classes", len(classes)), splits=splits,
                      mean_rgb=_triple(document.get("mean_rgb")), std_rgb=_triple(document.get("std_rgb")),
                      not_used=tuple(document["not_used"]) if isinstance(document.get("not_used"), list) else None)
        return cls(**fields)

    def to_json(self) -> dict:
        """The document: every key, in the written order, with the written values and types."""
        document = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        document.update(
            options=dict(self.options) if self.options is not None else None, classes=list(self.classes),
            splits={name: info.to_json() for name, info in self.splits.items()},
            mean_rgb=list(self.mean_rgb) if self.mean_rgb is not None else None,
            std_rgb=list(self.std_rgb) if self.std_rgb is not None else None)
        if self.not_used:
            document["not_used"] = [dict(entry) for entry in self.not_used]
        else:
            del document["not_used"]
        return document

    def split(self, name: str) -> SplitInfo:
        """The split ``name``; raises KeyError naming the dataset's splits if it has none of that name."""
        if name not in self.splits:
            raise KeyError(f"split {name!r} not in dataset (splits: {', '.join(self.splits)})")
        return self.splits[name]

    def shard_files(self, split: str) -> list[str]:
        """Relative paths of ``split``'s shards, in order."""
        return [shard.file for shard in self.split(split).shards]

    @property
    def stored_shape(self) -> tuple[int, int]:
        """(height, width) of every stored image: the crop's, or ``shorter_side`` square for ``crop: none``
        (whose stored images differ; readers resize them to this)."""
        if self.crop == "none":
            return self.shorter_side, self.shorter_side
        return self.image_height, self.image_width

    @property
    def fixed_layout_splits(self) -> dict[str, FixedLayout]:
        """{split: its FixedLayout} for the splits that have one (raw centre crops with records)."""
        return {name: info.record_layout for name, info in self.splits.items() if info.record_layout is not None}


def _triple(value):
    return tuple(value) if value is not None else None


def typed(manifest) -> Manifest:
    """``manifest`` as a :class:`Manifest` for the train reader: itself, or a loaded document converted
    (``Manifest.from_json``; a raw centre-crop split without ``record_layout`` is allowed: it is read as TFRecords)."""
    return manifest if isinstance(manifest, Manifest) else Manifest.from_json(manifest, layouts_required=False)
