"""The checks ``shardprep validate`` runs, pure functions over records, statistics and the manifest, and the typed
values and exactly mergeable statistics its stages pass (no Beam). A failed check is a *problem*: ``check`` (one of
:data:`CHECKS`), ``message``, ``split``, ``file``, ``index`` (0-based record in that file, or None) and details."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
from typing import NamedTuple

import numpy as np

from shardprep.preprocess.checks.text import count
from shardprep.preprocess.format import manifest as manifest_lib
from shardprep.preprocess.format.dataset import Manifest, ShardEntry
from shardprep.preprocess.format.fixed_layout import FixedLayout
from shardprep.preprocess.format.record_format import ImageRecord, RecordFormatError, read_varint
from shardprep.preprocess.format.sharding import pixel_statistics
from shardprep.preprocess.format.tfrecord_io import HEADER_BYTES, framed_size
from shardprep.preprocess.sources.common import split_from_tfrecord_name

CHECKS = frozenset({  # what each means: docs/validate.md ("The checks")
    "manifest_missing", "manifest_invalid", "manifest_shape", "manifest_inconsistent", "rejects_file",  # the folder
    "shard_missing",
    "shard_unlisted", "shard_unreadable", "shard_sha256", "shard_size", "shard_count", "shards_not_uniform",  # shards
    "record_corrupt", "record_parse", "record_format", "record_size", "record_label", "record_class", "record_layout",
    "image_decode", "split_count", "class_count", "filename_duplicate", "leakage", "near_duplicates", "mean_rgb",
    "std_rgb", "no_files", "class_names", "image_missing", "label_missing"})  # foreign tfrecord: inputs


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One listed shard to read: its split, path relative to the dataset, full path and manifest entry."""
    split: str
    file: str
    path: str
    expected: ShardEntry


@dataclasses.dataclass(frozen=True)
class SampleOptions:
    """Which records become contact-sheet candidates (rank below ``fraction``), and their thumbnails' cap."""
    split: str
    fraction: float
    cell_cap: int


class RecordLocation(NamedTuple):
    """Where one record is; ordered as a tuple, so the lowest location is the first record in shard order."""
    split: str
    file: str  # relative to the dataset
    index: int  # type: ignore[assignment]  # 0-based in the file (shadows tuple.index: the report's key)
    filename: str  # image/filename, the record's key

    def to_json(self) -> dict:
        return self._asdict()


class Sample(NamedTuple):
    """A contact-sheet candidate: its sample rank (the lowest ranks per class are shown), key and thumbnail."""
    rank: float
    filename: str
    height: int
    width: int
    pixels: bytes  # height x width x 3 uint8


def _merge(mine, theirs):
    """Adds ``theirs`` into ``mine`` field by field (numbers, lists of numbers, ``{key: n}``); returns ``mine``."""
    for field in dataclasses.fields(mine):
        value, other = getattr(mine, field.name), getattr(theirs, field.name)
        if isinstance(value, dict):
            for key, n in other.items():
                value[key] = value.get(key, 0) + n
        elif isinstance(value, list):
            value[:] = [a + b for a, b in zip(value, other)]
        else:
            setattr(mine, field.name, value + other)
    return mine


_VALUES = np.arange(256, dtype=np.int64)
_SQUARES = _VALUES * _VALUES


def channel_sums(pixels: np.ndarray) -> tuple[list[int], list[int]]:
    """Exact per-channel sums and sums of squares of an (H, W, 3) uint8 image (256-bin histograms: 4x faster)."""
    flat = pixels.reshape(-1, pixels.shape[-1])
    histograms = [np.bincount(flat[:, channel], minlength=256) for channel in range(flat.shape[1])]
    return [int(h @ _VALUES) for h in histograms], [int(h @ _SQUARES) for h in histograms]


def pixel_hash(height: int, width: int, pixels: np.ndarray) -> bytes:
    """A digest (16 bytes) of an image's decoded pixels (and shape): identical images hash alike whatever their
    keys. Raw, not hex: it is the key of a shuffle a local run holds in memory, and no report shows it."""
    digest = hashlib.blake2b(f"{height}x{width}:".encode(), digest_size=16)
    digest.update(np.ascontiguousarray(pixels).data)  # the bytes row by row, without a copy when already contiguous
    return digest.digest()


def sample_rank(filename: str) -> float:
    """A deterministic pseudo-random number in [0, 1) per key: samples are the k keys of lowest rank per class."""
    return int.from_bytes(hashlib.sha1(filename.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64


def sample_fraction(class_counts: dict[str, int], samples_per_class: int, oversample: int = 8) -> float:
    """The rank below which a record is a contact-sheet candidate: the smallest class expects ``oversample``
    times the samples it needs, so the lowest ranks among candidates are (almost surely) those among all records."""
    smallest = min((n for n in class_counts.values() if n > 0), default=0)
    return min(1.0, oversample * samples_per_class / smallest) if smallest else 1.0


@dataclasses.dataclass
class SplitStats:
    """What one split (or a part of it: one shard, one bundle) holds; ``merge`` adds another part exactly."""
    num_examples: int = 0
    label_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    channel_sums: list[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])
    channel_square_sums: list[int] = dataclasses.field(default_factory=lambda: [0, 0, 0])
    num_pixels: int = 0
    image_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # "HxW" -> number of images
    shard_records: dict[str, int] = dataclasses.field(default_factory=dict)  # shard file -> records it holds

    def add_image(self, label: int, height: int, width: int, sums: list[int], square_sums: list[int]) -> None:
        self.merge(SplitStats(1, {label: 1}, list(sums), list(square_sums), height * width, {f"{height}x{width}": 1}))

    merge = _merge

    def mean_std(self) -> tuple[list[float], list[float]] | None:
        """Per-channel mean and population std (0-255), as the job computes the manifest's; None without pixels."""
        mean, std = pixel_statistics((self.num_pixels, *self.channel_sums, *self.channel_square_sums))
        return None if mean is None or std is None else (mean, std)


@dataclasses.dataclass
class ForeignStats:
    """What a group of foreign ``tfrecord:`` files holds: labels, image sizes and formats (from headers only)."""
    num_records: int = 0
    num_readable_images: int = 0
    label_counts: dict[int, int] = dataclasses.field(default_factory=dict)
    image_sizes: dict[str, int] = dataclasses.field(default_factory=dict)  # "HxW" -> n
    image_formats: dict[str, int] = dataclasses.field(default_factory=dict)  # "JPEG" -> n
    image_modes: dict[str, int] = dataclasses.field(default_factory=dict)  # "RGB", "L", "CMYK" -> n
    file_records: dict[str, int] = dataclasses.field(default_factory=dict)  # file -> records it holds

    merge = _merge


def size_summary(image_sizes: dict[str, int], top: int = 10) -> dict:
    """Min/max/mean height and width and the most common sizes of an ``{"HxW": n}`` histogram."""
    parsed = [(*(int(v) for v in size.split("x")), n) for size, n in image_sizes.items()]
    total = sum(n for _, _, n in parsed)
    heights, widths = [h for h, _, _ in parsed], [w for _, w, _ in parsed]
    return {"num_distinct": len(image_sizes), "min_height": min(heights, default=None),
            "max_height": max(heights, default=None), "min_width": min(widths, default=None),
            "max_width": max(widths, default=None),
            "mean_height": sum(h * n for h, _, n in parsed) / total if total else None,
            "mean_width": sum(w * n for _, w, n in parsed) / total if total else None,
            "most_common": dict(collections.Counter(image_sizes).most_common(top))}


def foreign_split(path: str) -> str:
    """The split of a TFDS-style file name, as the preprocess job reads it; ``all`` for any other name."""
    return split_from_tfrecord_name(path) or "all"


def problem(check: str, message: str, *, split: str | None = None, file: str | None = None,
            index: int | None = None, **details) -> dict:
    """A problem report; ``check`` must be one of :data:`CHECKS`."""
    if check not in CHECKS:
        raise ValueError(f"unknown check {check!r}")
    return {"check": check, "message": message, "split": split, "file": file, "index": index, **details}


def problem_sort_key(item: dict) -> tuple:
    """Orders problems by check, shard and record, so reports are stable from run to run."""
    return (item["check"], item.get("file") or "", item["index"] if item.get("index") is not None else -1,
            item.get("message", ""))


def unfit_layout_problems(manifest: Manifest) -> list[dict]:
    """A ``record_layout`` problem per split whose layout cannot be its records' (its shards are read without it)."""
    return [problem("record_layout", why, split=split) for split, why in manifest.layout_problems.items()]


def record_problems(record: ImageRecord, manifest: Manifest) -> list[tuple[str, str]]:
    """(check, message) pairs for a parsed record that does not match the manifest's options."""
    found = []
    if record.format != manifest.encoding:
        found.append(("record_format", f"format {record.format!r}, manifest encoding {manifest.encoding!r}"))
    if manifest.image_height is not None and manifest.image_width is not None:
        if (record.height, record.width) != (manifest.image_height, manifest.image_width):
            found.append(("record_size", f"{record.height}x{record.width}, manifest image size "
                                         f"{manifest.image_height}x{manifest.image_width}"))
    elif min(record.height, record.width) != int(manifest.shorter_side):
        found.append(("record_size", f"{record.height}x{record.width}: shorter side is not the manifest's "
                                     f"shorter_side {int(manifest.shorter_side)}"))
    if not 0 <= record.label < len(manifest.classes):
        found.append(("record_label", f"label {record.label} outside 0..{len(manifest.classes) - 1}"))
    elif manifest.classes[record.label] not in (folders := record.filename.split("/")[:-1]):
        # A source path that names a class, never the record's own: the manifest's names were swapped or edited.
        other = next((folder for folder in folders if folder in manifest.class_set), None)
        if other is not None:
            found.append(("record_class", f"in class folder {other!r}, but label {record.label} is "
                                          f"{manifest.classes[record.label]!r} in the manifest"))
    return found


def record_layout_length_problems(data_lengths: list[int], layout: FixedLayout) -> list[tuple[int, str]]:
    """(record index, message) per record of a shard not ``record_bytes`` framed (its last: ``+ image_offset``)."""
    found = []
    for index, length in enumerate(data_lengths):
        last = index == len(data_lengths) - 1
        expected = layout.record_bytes + (layout.image_offset if last else 0)
        if framed_size(length) != expected:
            found.append((index, f"record of {framed_size(length)} bytes framed, record_layout needs {expected}"
                                 + (" (a shard's last record)" if last else "")))
    return found


def record_layout_offset_problem(data: bytes, record: ImageRecord, layout: FixedLayout) -> str | None:
    """A message if ``record``'s pixels or label are not where the layout puts them in its serialized ``data``."""
    start = layout.image_offset - HEADER_BYTES
    if data[start:start + len(record.encoded)] != record.encoded:
        return f"the pixels are not at image_offset {layout.image_offset}"
    try:
        label = read_varint(data, layout.label_offset - HEADER_BYTES)[0]
    except RecordFormatError:
        label = None
    if label != record.label:
        return f"the varint at label_offset {layout.label_offset} is {label}, the record's label {record.label}"
    return None


def manifest_problems(manifest: dict) -> list[dict]:
    """Whether the manifest's own totals agree (its shape was checked as it was loaded)."""
    found = []
    for split, info in manifest["splits"].items():
        shards, class_counts, num_examples = info["shards"], info["class_counts"], int(info["num_examples"])
        shard_total = sum(int(shard["num_examples"]) for shard in shards)
        if info.get("num_shards") is not None and int(info["num_shards"]) != len(shards):
            found.append(problem("manifest_inconsistent",
                                 f"num_shards {info['num_shards']} but {len(shards)} shards listed", split=split))
        if shard_total != num_examples:
            found.append(problem("manifest_inconsistent",
                                 f"num_examples {num_examples} but its shards list {shard_total}", split=split))
        if sum(class_counts.values()) != num_examples:
            found.append(problem("manifest_inconsistent",
                                 f"num_examples {num_examples} but class_counts add up to "
                                 f"{sum(class_counts.values())}", split=split))
        if unknown := sorted(set(class_counts) - set(manifest["classes"])):
            found.append(problem("manifest_inconsistent", f"class_counts names classes not in classes: {unknown}",
                                 split=split))
    for key in ("num_examples", "num_inputs", "num_rejected"):  # totals over the splits, where each split has one
        if manifest.get(key) is not None and all(info.get(key) is not None for info in manifest["splits"].values()):
            if int(manifest[key]) != (total := sum(int(info[key]) for info in manifest["splits"].values())):
                found.append(problem("manifest_inconsistent", f"{key} {manifest[key]} but the splits' add up to "
                                                              f"{total}"))
    return found


def rejects_problems(manifest: dict, data: bytes | None) -> list[dict]:
    """Whether rejects.jsonl (``data``; None: absent, which loses nothing where none are counted) lists, split by
    split, the rejects by reason the manifest counts: the inputs it accounts for that became no record."""
    name = manifest_lib.REJECTS_NAME
    counted = {split: {reason: int(n) for reason, n in info.get("rejected_by_reason", {}).items() if int(n)}
               for split, info in manifest["splits"].items()}
    if data is None:
        total = sum(n for reasons in counted.values() for n in reasons.values())
        return [problem("rejects_file", f"{name} is missing; the manifest counts {count(total, 'rejected input')}")
                ] if total else []
    listed: dict[str, collections.Counter] = {}
    for number, line in enumerate(data.splitlines(), 1):
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        if not (isinstance(entry, dict) and isinstance(entry.get("split"), str)
                and isinstance(entry.get("reason"), str)):
            return [problem("rejects_file", f"{name} line {number} is not a reject (a JSON object with a split and "
                                            "a reason)")]
        listed.setdefault(entry["split"], collections.Counter())[entry["reason"]] += 1
    return [problem("rejects_file", f"{name} lists {_reasons(listed.get(split, {}))}, the manifest counts "
                                    f"{_reasons(counted.get(split, {}))}", split=split)
            for split in [*counted, *sorted(set(listed) - set(counted))]
            if dict(listed.get(split, {})) != counted.get(split, {})]


def _reasons(counts) -> str:
    """``2 rejects (empty_file 1, truncated 1)``, or ``none``."""
    if not counts:
        return "none"
    reasons = ", ".join(f"{reason} {n:,}" for reason, n in sorted(counts.items()))
    return f"{count(sum(counts.values()), 'reject')} ({reasons})"


def _is_temporary(path: str) -> bool:
    """Left by an interrupted preprocess run: ``.tmp`` folders, ``.tmp-*`` shards, ``*.tmp`` files."""
    return any(part.startswith(".tmp") or part.endswith(".tmp") for part in path.split("/"))


def classify_files(found: list[str]) -> dict[str, list[str]]:
    """The files of a dataset folder as finished-looking ``shards``, ``temporary`` files and ``other``."""
    classes: dict[str, list[str]] = {"shards": [], "temporary": [], "other": []}
    for path in found:
        kind = ("temporary" if _is_temporary(path) else
                "shards" if manifest_lib.SHARD_FILES.parse_path(path) is not None else "other")
        classes[kind].append(path)
    return classes


def layout_problems(manifest: dict, found_files: list[str]) -> list[dict]:
    """``shard_missing`` per listed shard not found, ``shard_unlisted`` per shard-like file not listed."""
    listed = {shard["file"]: split for split, info in manifest["splits"].items() for shard in info["shards"]}
    present = set(found_files)
    found = [problem("shard_missing", "listed in the manifest but not on disk", split=split, file=file)
             for file, split in sorted(listed.items()) if file not in present]
    found += [problem("shard_unlisted",
                      "temporary shard left by an interrupted write, not listed in the manifest"
                      if _is_temporary(file) else "shard file not listed in the manifest",
                      split=file.split("/", 1)[0] if "/" in file else None, file=file)
              for file in sorted(present) if file.endswith(manifest_lib.SHARD_SUFFIX) and file not in listed]
    return found


def shard_problems(split: str, file: str, expected: ShardEntry, num_records: int, num_bytes: int,
                   sha256: str | None) -> list[dict]:
    """What was read from one shard against its manifest entry (``sha256`` None: read only to the manifest's size)."""
    found = []
    if num_records != expected.num_examples:
        found.append(problem("shard_count", f"{num_records} records, manifest says {expected.num_examples}",
                             split=split, file=file, num_records=num_records,
                             expected_num_records=expected.num_examples))
    if sha256 is None:
        found.append(problem("shard_size", f"{num_bytes:,} bytes, manifest says {expected.num_bytes:,}: only the "
                                           f"first {expected.num_bytes:,} bytes were read", split=split, file=file))
    elif num_bytes != expected.num_bytes:
        found.append(problem("shard_size", f"{num_bytes} bytes, manifest says {expected.num_bytes}",
                             split=split, file=file))
    if sha256 is not None and sha256 != expected.sha256:
        found.append(problem("shard_sha256", f"sha256 {sha256}, manifest says {expected.sha256}",
                             split=split, file=file))
    return found


def split_problems(split: str, stats: SplitStats, manifest: dict) -> list[dict]:
    """Split and class counts against the manifest, and shard-size uniformity (within one record)."""
    info, classes, found = manifest["splits"].get(split, {}), manifest["classes"], []
    expected_total = info.get("num_examples")
    if stats.num_examples != expected_total:
        found.append(problem("split_count", f"{stats.num_examples} valid records, manifest says {expected_total}",
                             split=split, num_examples=stats.num_examples, expected_num_examples=expected_total))
    expected_counts = info.get("class_counts", {})
    for label, name in enumerate(classes):
        actual, expected = stats.label_counts.get(label, 0), expected_counts.get(name, 0)
        if actual != expected:
            found.append(problem("class_count", f"class {name!r} (label {label}): {actual} records, manifest says "
                                                f"{expected}", split=split, class_name=name, label=label,
                                 count=actual, expected_count=expected))
    if len(stats.shard_records) > 1:
        smallest, *_, largest = sorted(stats.shard_records.items(), key=lambda item: (item[1], item[0]))
        if largest[1] - smallest[1] > 1:
            found.append(problem("shards_not_uniform",
                                 f"shards hold {smallest[1]} to {largest[1]} records (more than one apart): "
                                 f"{smallest[0]} has {smallest[1]}, {largest[0]} has {largest[1]}",
                                 split=split, file=largest[0], smallest_file=smallest[0]))
    return found


def mean_std_problems(split: str, stats: SplitStats, manifest: dict, tolerance: float) -> list[dict]:
    """The recomputed per-channel mean/std of the stats split against the manifest's ``mean_rgb``/``std_rgb``."""
    found = []
    for check, actual in zip(("mean_rgb", "std_rgb"), stats.mean_std() or (None, None)):
        expected = manifest.get(check)
        if expected is None and actual is None:
            continue
        if expected is None or actual is None:
            found.append(problem(check, f"manifest {check} {expected}, recomputed {actual}", split=split))
            continue
        worst = max(abs(a - e) for a, e in zip(actual, expected))
        if worst > tolerance:
            found.append(problem(check, f"recomputed {[round(v, 3) for v in actual]}, manifest "
                                        f"{[round(v, 3) for v in expected]} (max difference {worst:.3f} > "
                                        f"tolerance {tolerance})", split=split, recomputed=actual,
                                 expected=expected, tolerance=tolerance))
    return found
